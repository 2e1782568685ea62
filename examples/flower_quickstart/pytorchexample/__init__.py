"""pytorchexample: Flower's quickstart-pytorch app, audited by fedleak."""
