"""What running a defense out of process costs: a ResNet-18-sized update through DefenseService.

Starts ``fedleak defense serve --defense clip:max-norm=1`` as its own process on loopback and
times the ``remote`` link's ``apply`` on an update shaped like torchvision ResNet-18's
parameters (62 tensors, 11.2 M float32, 44.7 MB): chunking, streaming to the service, its clip,
streaming back, reassembly and the victim's checks. Compares with the same clip in process.

    OMP_NUM_THREADS=1 python bench/remote_defense.py [--repeats 5] [--chunk-mb 1]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import click
import torch

from fedleak.defenses.clip import Clip, ClipConfig
from fedleak.harness.remote_defense.link import RemoteDefense, RemoteDefenseConfig
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.zoo.models import build_model


@click.command()
@click.option("--repeats", default=5, show_default=True, type=click.IntRange(1))
@click.option("--model", default="resnet18", show_default=True,
              help="Model zoo name whose parameter shapes the update takes.")
@click.option("--chunk-mb", default=1.0, show_default=True, type=float,
              help="Chunk size of the victim's stream in MiB.")
@click.option("--threads", default=1, show_default=True, type=click.IntRange(1))
def main(repeats: int, model: str, chunk_mb: float, threads: int) -> None:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    net = build_model(model, (3, 32, 32), 10)
    names = [n for n, _ in net.named_parameters()]
    update = [torch.randn_like(p) for p in net.parameters()]
    count = sum(u.numel() for u in update)
    megabytes = sum(u.numel() * u.element_size() for u in update) / 1e6
    local = Clip(ClipConfig(max_norm=1.0))
    generator = torch.Generator().manual_seed(0)
    in_process = []
    for _ in range(repeats):
        started = time.perf_counter()
        expected = local.apply(update, generator)
        in_process.append(time.perf_counter() - started)
    env = {"OMP_NUM_THREADS": str(threads)}
    command = [sys.executable, "-m", "fedleak", "defense", "serve"]
    with VictimProcess(["--defense", "clip:max-norm=1"], command=command, env=env) as service:
        remote = RemoteDefense(RemoteDefenseConfig(address=service.address),
                               chunk_bytes=int(chunk_mb * (1 << 20)))
        remote.bind(names)
        got = remote.apply(update, generator)  # warm-up, and a check
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
        out_of_process = []
        for _ in range(repeats):
            started = time.perf_counter()
            remote.apply(update, generator)
            out_of_process.append(time.perf_counter() - started)
        remote.close()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"update shaped like {model}: {len(update)} tensors, {count / 1e6:.2f} M float32, "
          f"{megabytes:.1f} MB; chunks of {chunk_mb:g} MiB; {threads} thread(s); "
          f"load average {load}")
    print(f"clip in process          median {statistics.median(in_process) * 1e3:8.1f} ms")
    remote_ms = statistics.median(out_of_process) * 1e3
    print(f"clip via DefenseService  median {remote_ms:8.1f} ms "
          f"(min {min(out_of_process) * 1e3:.1f}; {2 * megabytes / remote_ms:.2f} GB/s "
          "counting both directions)")


if __name__ == "__main__":
    main()
