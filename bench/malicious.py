"""The malicious server's figures (docs/malicious.md), with the closed-form expectation printed
beside each measured fraction.

1. imprint, 256 bins, FedSGD, a batch of 64 (digits, faces): exact recoveries (PSNR >= 40 dB)
   beside the paper's guarantee and the multinomial expectation; the same from the
   secure-aggregation sum of 4 users x 16 images with one user dropping out, across processes
   (a real victim, real masks, ``fedleak attack``); and FedAvg deltas.
2. trap-weights on MLPs (batch of 64 digits), and the reasoned refusal of a CNN.
3. fishing: one image out of the secure-aggregation sum of 4 users x 16 faces on lenet-zhu,
   across processes, with the victim's default clip (1.0) and a clip that covers the update.
4. DP-SGD and clipping against imprint: exact recoveries and mean PSNR per setting.
5. vet: detection of every malicious parameter set here, false positives on seeded
   initialisations of the zoo and on trained checkpoints.

    python bench/malicious.py [--out bench_out/malicious.json] [--skip-processes] [--skip-vet]

Exact recoveries are counted as the victim counts them: the largest one-to-one matching at
PSNR >= 40 dB, the attacks' padding slots left out; "best" is the best non-padding image.

Seeds: model and attack seed 0 unless a loop says otherwise. One torch thread.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
import torch

from fedleak.attacks import create_attack
from fedleak.attacks.malicious.crafted_parameters import (
    AttackRefused,
    MaliciousAttack,
    ServerKnowledge,
)
from fedleak.attacks.malicious.imprint_guarantee import expected_single_bins, expected_trapped
from fedleak.defenses import DefenseChain, build_chain, create_defense, parse_defense_spec
from fedleak.harness.federated.observe import observe
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.federated.training import train_classifier
from fedleak.harness.metrics.image_metrics import score_reconstruction
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.zoo.datasets import denormalize, load_dataset, normalize
from fedleak.harness.zoo.models import build_model

torch.set_num_threads(1)
DATA = {name: (load_dataset(name, "train"), load_dataset(name, "test"))
        for name in ("digits", "faces")}


def knowledge(model: torch.nn.Module, dataset: str, per_user: int) -> ServerKnowledge:
    private, public = DATA[dataset]
    return ServerKnowledge(
        model, {n: p.detach().clone() for n, p in model.named_parameters()},
        {n: b.detach().clone() for n, b in model.named_buffers()},
        normalize(public.images, private.info), f"{dataset} test split",
        private.info.shape, private.info.num_classes, "gradient", per_user)


def in_process(attack_name: str, model_spec: str, dataset: str, count: int,
               protocol: Protocol | None = None, defenses: list[str] | None = None,
               options: dict[str, Any] | None = None) -> dict[str, Any]:
    """One crafted round (or several) on the first ``count`` private images; exact count."""
    private, _ = DATA[dataset]
    info = private.info
    torch.manual_seed(0)
    model = build_model(model_spec, info.shape, info.num_classes)
    attack = create_attack(attack_name, options or {})
    assert isinstance(attack, MaliciousAttack)
    known = knowledge(model, dataset, count)
    attack.check(known)
    chain = build_chain([parse_defense_spec(s) for s in defenses or []]) if defenses else \
        DefenseChain()
    images, labels = private.images[:count], private.labels[:count]
    probes: list = []
    crafted = attack.craft(known, probes, 0)
    started = time.perf_counter()
    while crafted is not None:
        user = copy.deepcopy(model)
        with torch.no_grad():
            for name, parameter in user.named_parameters():
                parameter.copy_(crafted[name])
        observation = observe(user, images, labels, info, protocol or Protocol(), defenses=chain,
                              generator=torch.Generator().manual_seed(0))
        crafted = attack.craft(known, [*probes, observation], 0)
        if crafted is not None:
            probes.append(observation)
    observation.probes = probes
    reconstruction = attack.reconstruct(observation)
    scored = score_reconstruction(denormalize(reconstruction.images, info).clamp(0, 1), images,
                                  padding=reconstruction.padding)
    psnrs = [s.psnr for s in scored.images]
    return {"exact": scored.exact, "images": count,
            "mean_psnr": sum(psnrs) / len(psnrs), "best_psnr": scored.best_psnr,
            "rounds": len(probes) + 1, "seconds": time.perf_counter() - started,
            **{k: v for k, v in reconstruction.extras.items() if isinstance(v, int | float)}}


def across_processes(victim_args: list[str], attack_args: list[str], out: Path
                     ) -> dict[str, Any]:
    """A real victim process and ``fedleak attack`` against it; the run's metrics."""
    with VictimProcess(victim_args) as victim:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "fedleak", "attack", "--victim",
                               victim.address, "--out", str(out), "--quiet", *attack_args],
                              capture_output=True, text=True, timeout=1800)
        seconds = time.perf_counter() - started
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1]}
    metrics = json.loads((out / "metrics.json").read_text())
    psnrs = [i["psnr"] for r in metrics["rounds"] for i in r["images"]]
    return {"exact": metrics["summary"].get("exact"), "images": len(psnrs),
            "mean_psnr": metrics["summary"]["mean_psnr"],
            "best_psnr": metrics["summary"].get("best_psnr"),
            "rounds": 1 + (metrics["rounds"][0].get("probe_rounds") or 0),
            "server_role": metrics["server_role"], "seconds": seconds}


def line(label: str, got: dict[str, Any], expected: str = "") -> None:
    if "error" in got:
        click.echo(f"{label:<58} error: {got['error']}")
        return
    click.echo(f"{label:<58} exact {got['exact']:>3}/{got['images']:<3} mean "
               f"{got['mean_psnr']:6.2f} dB, best {got['best_psnr'] or float('nan'):6.2f} dB, "
               f"{got['rounds']} round(s)"
               + (f"  [{expected}]" if expected else ""))


def vet_rates() -> dict[str, Any]:
    """Detection on malicious parameters, false positives on honest ones (digits batch 16)."""
    private, _ = DATA["digits"]
    info = private.info
    batch = normalize(private.images[:16], info)
    vet = create_defense("vet")
    vet_rows = create_defense("vet", {"architecture": False})
    detected, total = 0, 0
    for attack, model, check in [("imprint", "imprint:bins=256,inner=mlp", vet_rows),
                                 ("imprint", "imprint:bins=64,inner=lenet-zhu", vet_rows),
                                 ("trap-weights", "mlp:width=512,depth=1", vet),
                                 ("trap-weights", "mlp", vet),
                                 ("fishing", "lenet-zhu", vet),
                                 ("fishing", "mlp", vet),
                                 ("fishing", "convnet:width=16", vet)]:
        for seed in range(3):
            torch.manual_seed(seed)
            net = build_model(model, info.shape, info.num_classes)
            crafted = create_attack(attack).craft(knowledge(net, "digits", 16), [], seed)
            assert crafted is not None
            total += 1
            detected += check.inspect(net, crafted, dict(net.named_buffers()), batch) is not None
    honest, false_positive, reasons = 0, 0, []
    zoo = ["lenet-zhu", "convnet:width=16", "convnet", "resnet20-4", "resnet18", "resnet34",
           "resnet50", "resnet101", "resnet152", "mlp", "mlp:width=512,depth=1",
           "mlp:bias=false", "kkt-mlp:width=100"]
    for model in zoo:
        for seed in range(5):
            torch.manual_seed(seed)
            net = build_model(model, info.shape, info.num_classes)
            honest += 1
            reason = vet.inspect(net, dict(net.named_parameters()), dict(net.named_buffers()),
                                 batch)
            if reason:
                false_positive += 1
                reasons.append(f"{model} seed {seed}: {reason}")
    train, test = DATA["digits"]
    for model in ("mlp", "mlp:width=512,depth=1", "lenet-zhu", "convnet:width=16"):
        torch.manual_seed(0)
        net = build_model(model, info.shape, info.num_classes)
        train_classifier(net, train, test, epochs=10)
        honest += 1
        reason = vet.inspect(net, dict(net.named_parameters()), dict(net.named_buffers()), batch)
        if reason:
            false_positive += 1
            reasons.append(f"trained {model}: {reason}")
    return {"detected": detected, "malicious": total, "false_positives": false_positive,
            "honest": honest, "reasons": reasons}


def report_vet(results: dict[str, Any]) -> None:
    click.echo("5. vet")
    rates = vet_rates()
    results["vet"] = rates
    click.echo(f"  detected {rates['detected']}/{rates['malicious']} malicious parameter sets; "
               f"false positives {rates['false_positives']}/{rates['honest']} honest models")
    for reason in rates["reasons"]:
        click.echo(f"    {reason}")


@click.command()
@click.option("--out", type=click.Path(dir_okay=False), default="bench_out/malicious.json")
@click.option("--skip-processes", is_flag=True, help="Only the in-process figures.")
@click.option("--vet-only", is_flag=True, help="Only part 5 (vet).")
@click.option("--skip-vet", is_flag=True, help="Everything but part 5 (vet).")
def main(out: str, skip_processes: bool, vet_only: bool, skip_vet: bool) -> None:
    results: dict[str, Any] = {}
    if vet_only:
        report_vet(results)
        Path(out).write_text(json.dumps(results, indent=2, default=str))
        return
    work = Path(out).parent / "malicious_runs"
    work.mkdir(parents=True, exist_ok=True)
    click.echo("1. imprint, 256 bins (measurement random, gaussian cut-offs), FedSGD, batch 64")
    for dataset in ("digits", "faces"):
        got = in_process("imprint", "imprint:bins=256,inner=mlp,inner.width=64,inner.depth=1",
                         dataset, 64)
        e = expected_single_bins(256, 64)
        results[f"imprint {dataset} 64"] = got
        line(f"  {dataset}, one user of 64", got,
             f"paper {e.paper:.1f}, multinomial {e.multinomial:.1f}")
    for lr, epochs, batch in ((1e-4, 1, 64), (1e-4, 2, 16), (1e-3, 5, 8)):
        got = in_process("imprint", "imprint:bins=256,inner=mlp,inner.width=64,inner.depth=1",
                         "digits", 64, Protocol(kind="fedavg", local_epochs=epochs,
                                                batch_size=batch, learning_rate=lr))
        results[f"imprint fedavg lr={lr} E={epochs} B={batch}"] = got
        line(f"  digits, FedAvg τ={lr:g}, E={epochs}, B={batch}", got)
    if not skip_processes:
        e = expected_single_bins(256, 48)
        for dataset in ("digits", "faces"):
            got = across_processes(
                ["--dataset", dataset, "--split", "train", "--images", "0-63", "--model",
                 "imprint:bins=256,inner=mlp,inner.width=64,inner.depth=1", "--batch-size",
                 "16", "--users", "4", "--defense", "secagg", "--secagg-drop",
                 "3@masked-input"], ["--attack", "imprint"], work / f"imprint-secagg-{dataset}")
            results[f"imprint secagg {dataset}"] = got
            line(f"  {dataset}, secagg sum of 4x16, user 3 drops (48 left)", got,
                 f"paper {e.paper:.1f}, multinomial {e.multinomial:.1f}")
    click.echo("2. trap-weights, FedSGD, batch 64 of digits")
    for width in (256, 512, 1000):
        got = in_process("trap-weights", f"mlp:width={width},depth=1", "digits", 64)
        results[f"trap mlp {width}"] = got
        line(f"  mlp width {width}", got, f"expected confirmed "
             f"{expected_trapped(width, 64, 1 / 64):.1f}")
    torch.manual_seed(0)
    lenet = build_model("lenet-zhu", DATA["digits"][0].info.shape, 10)
    try:
        create_attack("trap-weights").check(knowledge(lenet, "digits", 64))
    except AttackRefused as err:
        results["trap lenet-zhu"] = str(err)
        click.echo(f"  lenet-zhu: refused: {err}")
    click.echo("3. fishing, lenet-zhu, faces, 1,200 inversion iterations")
    results["fishing in-process 64"] = got = in_process("fishing", "lenet-zhu", "faces", 64)
    line("  one user of 64 faces (in process)", got)
    if not skip_processes:
        for clip in ("1", "1000"):
            got = across_processes(
                ["--dataset", "faces", "--split", "train", "--images", "0-63", "--model",
                 "lenet-zhu", "--batch-size", "16", "--users", "4", "--defense",
                 f"secagg:clip={clip}"], ["--attack", "fishing"],
                work / f"fishing-secagg-clip{clip}")
            results[f"fishing secagg clip {clip}"] = got
            line(f"  secagg sum of 4x16 faces, clip {clip}", got, "target >= 25 dB best image")
    click.echo("4. DP-SGD and clipping against imprint (digits, batch 64, 256 bins)")
    spec = "imprint:bins=256,inner=mlp,inner.width=64,inner.depth=1,opacus=true"
    for defense in ("none", "clip:max-norm=1", "clip:max-norm=0.01",
                    "dpsgd:noise-multiplier=0,max-grad-norm=1",
                    "dpsgd:noise-multiplier=0.001,max-grad-norm=1",
                    "dpsgd:noise-multiplier=0.01,max-grad-norm=1",
                    "dpsgd:noise-multiplier=0.1,max-grad-norm=1",
                    "dpsgd:noise-multiplier=1,max-grad-norm=1"):
        got = in_process("imprint", spec, "digits", 64,
                         defenses=[] if defense == "none" else [defense])
        results[f"imprint vs {defense}"] = got
        line(f"  {defense}", got)
    if not skip_vet:
        report_vet(results)
    Path(out).write_text(json.dumps(results, indent=2, default=str))
    click.echo(f"written: {out}")


if __name__ == "__main__":
    main()
