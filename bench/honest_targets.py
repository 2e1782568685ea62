"""The honest attacks' targets across two processes (docs/honest_batches.md): a real victim
(``fedleak victim serve``, real secure-aggregation masks) and ``fedleak attack`` against it.

1. cocktail-party on the secure-aggregation sum of 4 users × 16 faces (25×25), MLP of 512
   units: images at ≥ 20 dB and exact, on several image selections and model seeds; the same
   on digits (8×8: fewer pixels than the 64 summed images) and Inverting Gradients on the same
   sum for comparison;
2. spear on one user's batch of 16 digits, MLP of 512 units: exact recoveries, on several
   selections and seeds.

    OMP_NUM_THREADS=1 python bench/honest_targets.py [--part cocktail|spear|all]
        [--faces 0-63,64-127,96-159] [--digits 100-163] [--spear-digits 200-215,400-415,900-915]
        [--seeds 0,1,2] [--ig-iterations 300] [--out bench_out/honest_targets.jsonl]

Each run prints one line and appends its record to ``--out``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import numpy as np

from fedleak.harness.victim.process import VictimProcess

MODEL = "mlp:width=512,depth=1"


def run(victim_args: list[str], attack_args: list[str]) -> dict[str, Any]:
    """One victim process, one ``fedleak attack`` against it; the run's scores."""
    with tempfile.TemporaryDirectory() as folder, VictimProcess(victim_args) as victim:
        out = Path(folder) / "run"
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "fedleak", "attack", "--victim",
                               victim.address, "--out", str(out), "--quiet", *attack_args],
                              capture_output=True, text=True, timeout=3600)
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            return {"error": done.stderr.strip().splitlines()[-1], "seconds": seconds}
        metrics = json.loads((out / "metrics.json").read_text())
    round_ = metrics["rounds"][0]
    psnrs = [i["psnr"] for i in round_["images"]]
    return {"images": len(psnrs), "exact": metrics["summary"].get("exact"),
            "at_20db": int(np.sum(np.array(psnrs) >= 20)),
            "mean_psnr": metrics["summary"]["mean_psnr"],
            "best_psnr": metrics["summary"].get("best_psnr"),
            "label_accuracy": round_.get("label_accuracy"), "seconds": seconds,
            "attack_s": round_["wall_time_s"], "extras": round_.get("attack_extras"),
            "warnings": round_.get("warnings", [])}


def secagg_args(dataset: str, images: str, seed: int) -> list[str]:
    return ["--dataset", dataset, "--split", "train", "--images", images, "--model", MODEL,
            "--batch-size", "16", "--users", "4", "--defense", "secagg", "--seed", str(seed)]


def report(label: str, got: dict[str, Any], out: Path, **keys: Any) -> None:
    with out.open("a") as handle:
        handle.write(json.dumps({"label": label, **keys, **got}) + "\n")
    if "error" in got:
        click.echo(f"{label:<58} error: {got['error']}")
        return
    click.echo(f"{label:<58} >=20 dB {got['at_20db']:>3}/{got['images']:<3} exact "
               f"{got['exact']:>3}  mean {got['mean_psnr']:6.2f} dB  labels "
               f"{got['label_accuracy'] or 0:.0%}  {got['seconds']:.0f} s")


@click.command()
@click.option("--part", type=click.Choice(["cocktail", "spear", "all"]), default="all")
@click.option("--faces", default="0-63,64-127,96-159", show_default=True,
              help="faces selections for the 4x16 sum")
@click.option("--digits", default="100-163", show_default=True,
              help="digits selections for the 4x16 sum ('none': skip)")
@click.option("--spear-digits", default="200-215,400-415,900-915", show_default=True)
@click.option("--seeds", default="0,1,2", show_default=True, help="model seeds")
@click.option("--ig-iterations", default=300, show_default=True,
              help="Inverting Gradients on the faces sums for comparison (0: skip)")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("bench_out/honest_targets.jsonl"), show_default=True)
def main(part: str, faces: str, digits: str, spear_digits: str, seeds: str,
         ig_iterations: int, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    seed_list = [int(s) for s in seeds.split(",")]
    if part in ("cocktail", "all"):
        for dataset, selections in (("faces", faces), ("digits", digits)):
            for images in [s for s in selections.split(",") if s and s != "none"]:
                for seed in seed_list:
                    got = run(secagg_args(dataset, images, seed),
                              ["--attack", "cocktail-party", "--secagg-target", "sum"])
                    report(f"cocktail-party {dataset} {images} sum 4x16 seed {seed}", got, out,
                           attack="cocktail-party", dataset=dataset, images=images, seed=seed)
                if ig_iterations and dataset == "faces":
                    got = run(secagg_args(dataset, images, seed_list[0]),
                              ["--attack", "inverting-gradients", "--secagg-target", "sum",
                               "--iterations", str(ig_iterations)])
                    report(f"inverting-gradients {dataset} {images} sum 4x16 seed "
                           f"{seed_list[0]}", got, out, attack="inverting-gradients",
                           dataset=dataset, images=images, seed=seed_list[0])
    if part in ("spear", "all"):
        for images in [s for s in spear_digits.split(",") if s]:
            for seed in seed_list:
                got = run(["--dataset", "digits", "--split", "train", "--images", images,
                           "--model", MODEL, "--batch-size", "16", "--seed", str(seed)],
                          ["--attack", "spear"])
                report(f"spear digits {images} batch 16 seed {seed}", got, out,
                       attack="spear", dataset="digits", images=images, seed=seed)


if __name__ == "__main__":
    main()
