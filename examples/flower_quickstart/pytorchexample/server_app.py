"""pytorchexample: A Flower / PyTorch app (Flower's quickstart-pytorch ``server_app.py``).

As Flower ships it, with its FedAvg wrapped in fedleak's ``LeakageAudit`` (``fedleak:``): the
audit is told the clients' procedure the example's ClientApp runs (its ``train``: SGD with
momentum 0.9 over shuffled batches of ``batch-size``, ``local-epochs`` epochs), since the train
config carries only the learning rate.
"""

from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fedleak.harness.flower.leakage_audit import LeakageAudit
from fedleak.harness.flower.procedure import LocalProcedure
from pytorchexample.task import INFO, Net, load_centralized_dataset, public_photos, test

# Create ServerApp
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Main entry point for the ServerApp."""

    # Read run config
    fraction_evaluate: float = context.run_config["fraction-evaluate"]
    num_rounds: int = context.run_config["num-server-rounds"]
    lr: float = context.run_config["learning-rate"]

    # Load global model
    global_model = Net()
    arrays = ArrayRecord(global_model.state_dict())

    # Initialize FedAvg strategy
    strategy = FedAvg(fraction_evaluate=fraction_evaluate)

    # fedleak: audit every client update; the clients' procedure is the example's train()
    strategy = LeakageAudit(
        strategy, model=Net(), dataset=INFO, out=Path(context.run_config["out"]),
        options={"iterations": int(context.run_config["iterations"])},
        overwrite=bool(context.run_config.get("overwrite", False)),
        queue=int(context.run_config.get("queue", 8)),  # updates waiting in the audit's worker
        procedure=LocalProcedure.of(
            kind="fedavg", local_epochs=context.run_config["local-epochs"],
            local_batch_size=context.run_config["batch-size"], lr=lr, momentum=0.9,
            shuffle=True),
        # fedleak: opt-in, what a malicious server would read (probe = "trap-weights fishing")
        probe=tuple(str(context.run_config.get("probe", "")).split()) or None,
        probe_public=public_photos())

    # Start strategy, run FedAvg for `num_rounds`
    result = strategy.start(  # noqa: F841 (as Flower ships it)
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": lr}),
        num_rounds=num_rounds,
        evaluate_fn=global_evaluate,
    )

    # # Save final model to disk
    # print("\nSaving final model to disk...")
    # state_dict = result.arrays.to_torch_state_dict()
    # torch.save(state_dict, "final_model.pt")


def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """Evaluate model on central data."""

    # Load the model and initialize it with the received weights
    model = Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)

    # Load entire test set
    test_dataloader = load_centralized_dataset()

    # Evaluate the global model on the test set
    test_loss, test_acc = test(model, test_dataloader, device)

    # Return the evaluation metrics
    return MetricRecord({"accuracy": test_acc, "loss": test_loss})
