"""Text federations on Flower: the strategy wrapper and the nodes."""
