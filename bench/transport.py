"""Time to move a ResNet-18-sized update (11.2 M float32, ~45 MB) between victim and attacker.

Starts a real victim process (torchvision ResNet-18 on the bundled 32×32 photos) on loopback,
then times ComputeUpdate calls. The victim reports how long its local update took
(``compute_seconds``); the rest of the call is transport: encoding, the parameters travelling
to the victim, the update travelling back, decoding. Also times encode/decode alone.

    python bench/transport.py [--repeats 5]
"""

from __future__ import annotations

import statistics
import time

import click
import torch

from fedleak.harness.attacker.client import VictimClient
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.wire.codec import decode_tensor, encode_tensor


@click.command()
@click.option("--repeats", default=5, show_default=True)
@click.option("--model", default="resnet18", show_default=True)
def main(repeats: int, model: str) -> None:
    args = ["--dataset", "photos", "--split", "all", "--model", model, "--batch-size", "2"]
    with VictimProcess(args) as victim, VictimClient(victim.address) as client:
        params, buffers = client.global_model()
        count = sum(t.numel() for t in params.values())
        megabytes = sum(t.numel() * t.element_size() for t in params.values()) / 1e6
        client.compute_update(params, buffers)  # warm-up
        totals, transports = [], []
        for _ in range(repeats):
            started = time.perf_counter()
            got = client.compute_update(params, buffers)
            total = time.perf_counter() - started
            totals.append(total)
            transports.append(total - float(got.metadata["compute_seconds"]))
    flat = torch.randn(count)
    started = time.perf_counter()
    message = encode_tensor(flat)
    encode = time.perf_counter() - started
    started = time.perf_counter()
    decode_tensor(message)
    decode = time.perf_counter() - started
    print(f"model {model}: {count / 1e6:.2f} M parameters, {megabytes:.1f} MB per direction")
    print(f"ComputeUpdate call       median {statistics.median(totals) * 1e3:8.1f} ms")
    print(f"  transport both ways    median {statistics.median(transports) * 1e3:8.1f} ms "
          f"(parameters to the victim + update back, encode and decode included)")
    print(f"  transport one way      ~      {statistics.median(transports) / 2 * 1e3:8.1f} ms")
    print(f"encode {megabytes:.0f} MB: {encode * 1e3:.1f} ms, decode: {decode * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
