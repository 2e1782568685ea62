"""The ``fedleak`` command: victim and attacker as separate processes, and the demo that runs both.

    fedleak victim serve --dataset photos --model lenet-zhu --port 0 --allow-reveal
    fedleak attack --victim 127.0.0.1:PORT --attack inverting-gradients --out runs/x
    fedleak demo
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from fedleak.defenses import defense_names
from fedleak.harness.protocol import BATCHNORM_MODES, PROTOCOLS, Protocol

TOKEN_ENV = "FEDLEAK_TOKEN"
DEFAULT_PORT = 50051


def _option_pairs(pairs: tuple[str, ...], flag: str) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} must look like key=value", param_hint=flag)
        out[key.strip()] = value.strip()
    return out


def _attack_epilog() -> str:
    from fedleak.attacks import attack_names, describe_options

    lines = ["\b", "Attacks and their options (-o key=value):"]
    for name in attack_names():
        lines.append(f"  {name}")
        lines += [f"    {line}" for line in describe_options(name).splitlines()]
    return "\n".join(lines)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="fedleak")
def main() -> None:
    """Measure how much private data leaks out of federated learning.

    A victim process plays the federated user; an attacker process plays the
    honest-but-curious server and reconstructs the user's images from what it receives.
    """


@main.group()
def victim() -> None:
    """The federated user (victim) process."""


@victim.command("serve")
@click.option("--dataset", default="photos", show_default=True,
              help="Private data: digits, faces, photos (bundled) or cifar10, cifar100, "
                   "imagefolder (under --data-root).")
@click.option("--split", default="train", show_default=True, help="train, test or all.")
@click.option("--images", default=None,
              help="Restrict the private pool to these indices of the split, e.g. 0-3,7.")
@click.option("--shuffle/--no-shuffle", default=False, show_default=True,
              help="Shuffle the private pool with --seed.")
@click.option("--data-root", type=click.Path(file_okay=False), default=None,
              help="Folder holding cifar10/cifar100/imagefolder data.")
@click.option("--download", is_flag=True, help="Download cifar10/cifar100 into --data-root.")
@click.option("--model", default="lenet-zhu", show_default=True,
              help="Model name[:key=value,...], e.g. convnet:width=64. See `fedleak list`.")
@click.option("--checkpoint", type=click.Path(dir_okay=False, exists=True), default=None,
              help="State dict of a trained model: the federation's global model.")
@click.option("--batch-size", "-n", default=1, show_default=True, type=click.IntRange(1),
              help="Private images per round (n).")
@click.option("--seed", default=0, show_default=True, help="Seeds model init and shuffling.")
@click.option("--protocol", type=click.Choice(PROTOCOLS), default="fedsgd", show_default=True,
              help="fedsgd: send one gradient; fedavg: send the parameter delta after local SGD.")
@click.option("--local-epochs", default=1, show_default=True, type=click.IntRange(1),
              help="FedAvg: local epochs E.")
@click.option("--local-batch-size", default=0, show_default=True, type=click.IntRange(0),
              help="FedAvg: mini-batch size B (0 = all n images).")
@click.option("--lr", default=1e-4, show_default=True, type=float,
              help="FedAvg: local learning rate τ.")
@click.option("--batchnorm", type=click.Choice(BATCHNORM_MODES), default="train",
              show_default=True,
              help="BatchNorm layers in local training: 'train' normalises with the batch's "
                   "statistics, 'eval' with the running ones (Geiping et al.'s setting).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535),
              help="Port to bind; 0 picks a free one (the bound address is printed).")
@click.option("--token", envvar=TOKEN_ENV, default=None,
              help=f"Secret for token-guarded calls (Reveal); also read from ${TOKEN_ENV}.")
@click.option("--allow-reveal", is_flag=True,
              help="Allow Reveal (ground truth for reports) to callers holding the token.")
@click.option("--max-message-mb", default=1024, show_default=True, type=click.IntRange(1, 2047),
              help="Largest gRPC message accepted or sent.")
@click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True), default=None,
              help="PEM certificate for TLS (with --tls-key); use for non-loopback hosts.")
@click.option("--tls-key", type=click.Path(dir_okay=False, exists=True), default=None)
@click.option("--defense", "defense_specs", multiple=True, metavar="NAME:KEY=VALUE,...",
              help="A defense of the chain, e.g. dpsgd:noise-multiplier=0.5 or prune:p=0.9 "
                   "(repeatable, applied in order). Defenses: " + ", ".join(defense_names())
                   + "; `fedleak list` shows their parameters.")
@click.option("--defense-file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="TOML file with [[defense]] tables (name = ..., then parameters).")
@click.option("--defense-seed", type=int, default=None,
              help="Fix the defenses' randomness (reproducible experiments; default: secret).")
@click.option("--users", default=1, show_default=True, type=click.IntRange(1),
              help="Federated users behind this victim, each with its own shard of the pool "
                   "(more than one needs --defense secagg).")
@click.option("--secagg-drop", multiple=True, metavar="USER@PHASE",
              help="Simulate a user going offline in secure aggregation from PHASE on "
                   "(advertise-keys, share-keys, masked-input, unmasking); repeatable.")
@click.option("--device", default="cpu", show_default=True, help="Where local training runs.")
@click.option("--release-size", default=0, show_default=True, type=click.IntRange(0),
              help="Model release (Release RPC, the kkt attack's threat model): training-set "
                   "size n, balanced over the data set's binary task (0: the whole pool). "
                   "Needs a one-output model such as kkt-mlp.")
@click.option("--release-lr", default=0.5, show_default=True,
              type=click.FloatRange(0, min_open=True),
              help="Release: gradient-descent step size (a server may ask for another).")
@click.option("--release-epochs", default=20000, show_default=True, type=click.IntRange(1),
              help="Release: epoch budget, also the most a server may ask for.")
@click.option("--release-target-loss", default=1e-5, show_default=True,
              type=click.FloatRange(0), help="Release: stop at this mean logistic loss.")
def victim_serve(**kw: Any) -> None:
    """Serve a federated user over gRPC until SIGTERM or SIGINT."""
    from fedleak.harness.release_victim import ReleaseSettings
    from fedleak.harness.secagg_users import parse_drops
    from fedleak.harness.server import serve_until_signal, start_server
    from fedleak.harness.victim_setup import create_victim, parse_defenses

    try:
        chain = parse_defenses(kw["defense_specs"], kw["defense_file"])
        release = ReleaseSettings(size=kw["release_size"], lr=kw["release_lr"],
                                  max_epochs=kw["release_epochs"],
                                  target_loss=kw["release_target_loss"])
        protocol = Protocol(kw["protocol"], kw["local_epochs"], kw["local_batch_size"], kw["lr"],
                            kw["batchnorm"])
    except ValueError as err:  # ProtocolError, DefenseConfigError
        raise click.UsageError(str(err)) from None
    token = kw["token"]
    if kw["allow_reveal"] and not token:
        token = secrets.token_hex(16)
        click.echo(f"reveal token (pass as --token or ${TOKEN_ENV}): {token}", err=True)
    try:
        v = create_victim(
            kw["dataset"], kw["model"], split=kw["split"], images=kw["images"],
            shuffle=kw["shuffle"], data_root=kw["data_root"], download=kw["download"],
            checkpoint=kw["checkpoint"], batch_size=kw["batch_size"], seed=kw["seed"],
            protocol=protocol, reveal=kw["allow_reveal"], device=kw["device"],
            defenses=chain, defense_seed=kw["defense_seed"], users=kw["users"],
            secagg_drops=parse_drops(kw["secagg_drop"]),
            release=release,
        )
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    if bool(kw["tls_cert"]) != bool(kw["tls_key"]):
        raise click.UsageError("TLS needs both --tls-cert and --tls-key")
    cert = Path(kw["tls_cert"]).read_bytes() if kw["tls_cert"] else None
    key = Path(kw["tls_key"]).read_bytes() if kw["tls_key"] else None
    try:
        server, port = start_server(v, kw["host"], kw["port"], token,
                                    kw["max_message_mb"] << 20, cert, key)
    except (OSError, RuntimeError) as err:
        raise click.ClickException(f"cannot listen on {kw['host']}:{kw['port']}: {err}") \
            from None
    click.echo(f"fedleak victim listening on {kw['host']}:{port} "
               f"({v.info.name}, {len(v.data.labels)} private images, {v.config.model}, "
               f"{protocol.kind}, n={v.config.num_images}, defenses: "
               f"{', '.join(d.name for d in chain.defenses) or 'none'})", err=False)
    sys.stdout.flush()
    serve_until_signal(server)
    click.echo("fedleak victim stopped", err=True)


def _default_out(attack: str) -> Path:
    return Path("runs") / f"{attack}-{datetime.now():%Y%m%d-%H%M%S}"


def _settings(kw: dict[str, Any]) -> Any:
    from fedleak.harness.attacker import AttackSettings

    options: dict[str, Any] = _option_pairs(kw["option"], "--option")
    for key in ("iterations", "restarts"):
        if kw.get(key) is not None:
            options[key] = kw[key]
    protocol = {}
    for key, flag in (("kind", "protocol"), ("local_epochs", "local_epochs"),
                      ("batch_size", "local_batch_size"), ("learning_rate", "lr"),
                      ("batchnorm", "batchnorm")):
        if kw.get(flag) is not None:
            protocol[key] = kw[flag]
    flip = None
    if kw.get("flip_labels"):
        try:
            a, b = (int(v) for v in kw["flip_labels"].split(","))
        except ValueError:
            raise click.BadParameter("give two class indices, e.g. 3,5",
                                     param_hint="--flip-labels") from None
        flip = (a, b)
    target = kw.get("secagg_target") or "sum"
    if target != "sum" and not (target.startswith("user:") and target[5:].isdigit()):
        raise click.BadParameter("use sum or user:U", param_hint="--secagg-target")
    return AttackSettings(
        secagg_target=target,
        flip_labels=flip,
        attack=kw["attack"], options=options, device=kw["device"], seed=kw["seed"],
        rounds=kw["rounds"], checkpoint=kw["checkpoint"], model_seed=kw["model_seed"],
        protocol=protocol, show_progress=not kw.get("quiet", False),
        release={key: kw[flag] for key, flag in (
            ("learning_rate", "release_lr"), ("max_epochs", "release_epochs"),
            ("target_loss", "release_target_loss"), ("recovered_ssim", "recovered_ssim"))
            if kw.get(flag) is not None},
    )


def _check_device(device: str) -> None:
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise click.UsageError("--device cuda asked for, but this torch sees no CUDA GPU; "
                               "use --device cpu or install a CUDA build of torch 2.13.0")


@main.command(epilog=_attack_epilog())
@click.option("--victim", "address", required=True, help="Victim address HOST:PORT.")
@click.option("--attack", default="inverting-gradients", show_default=True,
              help="Attack name (listed below).")
@click.option("--option", "-o", multiple=True, help="Attack option key=value (repeatable).")
@click.option("--iterations", type=click.IntRange(1), default=None,
              help="Optimisation steps per restart (attack default if unset).")
@click.option("--restarts", type=click.IntRange(1), default=None,
              help="Random restarts; the lowest objective wins (attack default if unset).")
@click.option("--rounds", default=1, show_default=True, type=click.IntRange(1),
              help="Rounds to attack, each on the victim's next private batch.")
@click.option("--seed", default=0, show_default=True, help="Seeds the attack's initialisation.")
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda.")
@click.option("--checkpoint", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Send these trained parameters instead of the victim's global model.")
@click.option("--model-seed", type=int, default=None,
              help="Send a fresh model initialised with this seed instead.")
@click.option("--flip-labels", default=None, metavar="A,B",
              help="Dishonest server: swap classifier rows A and B of θ before sending "
                   "(label flipping, Inverting Gradients supplement A.2).")
@click.option("--secagg-target", default="sum", show_default=True,
              help="Against a secure-aggregation victim: attack the unmasked 'sum' of the "
                   "survivors' updates, or one masked vector 'user:U'.")
@click.option("--protocol", type=click.Choice(PROTOCOLS), default=None,
              help="Ask for this protocol (server's choice; victim default if unset).")
@click.option("--local-epochs", type=click.IntRange(1), default=None, help="FedAvg: E.")
@click.option("--local-batch-size", type=click.IntRange(0), default=None, help="FedAvg: B.")
@click.option("--lr", type=float, default=None, help="FedAvg: local learning rate τ.")
@click.option("--batchnorm", type=click.Choice(BATCHNORM_MODES), default=None,
              help="Ask for BatchNorm in 'train' or 'eval' mode (victim default if unset).")
@click.option("--release-lr", type=click.FloatRange(0, min_open=True), default=None,
              help="Release attacks (kkt): ask the victim to train at this step size.")
@click.option("--release-epochs", type=click.IntRange(1), default=None,
              help="Release attacks: ask for this epoch budget (at most the victim's).")
@click.option("--release-target-loss", type=click.FloatRange(0, min_open=True), default=None,
              help="Release attacks: ask the victim to stop at this training loss.")
@click.option("--recovered-ssim", type=click.FloatRange(-1, 1), default=None,
              help="Release attacks: SSIM at which a training sample counts as recovered "
                   "(victim default 0.4).")
@click.option("--token", envvar=TOKEN_ENV, default=None,
              help=f"The victim's token, to reveal ground truth for pictures (${TOKEN_ENV}).")
@click.option("--tls-ca", type=click.Path(dir_okay=False, exists=True), default=None,
              help="PEM root certificate to verify a TLS victim.")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Run folder (default runs/ATTACK-TIMESTAMP).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def attack(**kw: Any) -> None:
    """Attack a victim as an honest-but-curious server and write the run to --out."""
    from fedleak.attacks import AttackConfigError, create_attack
    from fedleak.harness.attacker import run_attack
    from fedleak.harness.client import VictimClient, VictimError

    _check_device(kw["device"])
    settings = _settings(kw)
    try:
        create_attack(settings.attack, settings.options)
    except AttackConfigError as err:
        raise click.UsageError(str(err)) from None
    out = Path(kw["out"]) if kw["out"] else _default_out(settings.attack)
    ca = Path(kw["tls_ca"]).read_bytes() if kw["tls_ca"] else None
    with VictimClient(kw["address"], token=kw["token"], tls_ca=ca) as client:
        try:
            client.wait_ready(timeout=15)
            record = run_attack(client, settings, out, log=click.echo)
        except VictimError as err:
            raise click.ClickException(f"victim at {kw['address']}: {err}") from None
        except ValueError as err:
            raise click.ClickException(str(err)) from None
    if record.get("threat_model") == "release":
        from fedleak.harness.release_attacker import print_release_summary

        print_release_summary(record, out, click.echo)
        return
    _print_summary(record, out)


def _print_summary(record: dict[str, Any], out: Path) -> None:
    click.echo("")
    if any(r["images"] for r in record["rounds"]):
        click.echo(f"{'round':>5}  {'image':>5}  {'PSNR dB':>8}  {'SSIM':>6}  {'MSE':>8}  "
                   f"{'time s':>7}")
    for i, r in enumerate(record["rounds"]):
        for img in r["images"]:
            click.echo(f"{i:>5}  {img['index']:>5}  {img['psnr']:>8.2f}  {img['ssim']:>6.3f}  "
                       f"{img['mse']:>8.5f}  {r['wall_time_s']:>7.1f}")
    s = record["summary"]
    acc = "n/a" if s["label_accuracy"] is None else f"{s['label_accuracy']:.0%}"
    if s["mean_psnr"] is not None:
        click.echo(f"mean PSNR {s['mean_psnr']:.2f} dB, mean SSIM {s['mean_ssim']:.3f}, "
                   f"label accuracy {acc} over {s['images']} image(s)")
    if "mean_feature_cosine" in s:
        click.echo(f"recovered features: mean cosine {s['mean_feature_cosine']:.6f}, mean "
                   f"relative error {s['mean_feature_relative_error']:.2e}, label accuracy {acc}")
    click.echo(f"metrics: {out / 'metrics.json'}")
    for r in record["rounds"]:
        picture = r["files"].get("comparison") or r["files"].get("reconstruction")
        if picture:
            click.echo(f"picture: {out / picture}")
        if r.get("features_file"):
            click.echo(f"features: {out / r['features_file']}")
    for warning in sorted({w for r in record["rounds"] for w in r.get("warnings", [])}):
        click.echo(f"warning: {warning}")


@main.command()
@click.option("--dataset", default="photos", show_default=True)
@click.option("--model", default="lenet-zhu", show_default=True)
@click.option("--attack", "attack_name", default="inverting-gradients", show_default=True)
@click.option("--images", default="2", show_default=True,
              help="Which private images the victim holds; one round each.")
@click.option("--iterations", default=4800, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=0, show_default=True)
@click.option("--device", default="cpu", show_default=True)
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Run folder (default runs/demo-TIMESTAMP).")
def demo(**kw: Any) -> None:
    """Start a victim on a free loopback port, attack it, print the scores, stop it.

    The victim runs as its own process; the attacker (this process) only talks to it over gRPC.
    """
    from fedleak.harness.attacker import AttackSettings, run_attack
    from fedleak.harness.client import VictimClient, VictimError
    from fedleak.harness.victim_process import VictimProcess
    from fedleak.harness.victim_setup import parse_indices

    _check_device(kw["device"])
    rounds = len(parse_indices(kw["images"], 10**9))
    out = Path(kw["out"]) if kw["out"] else Path("runs") / f"demo-{datetime.now():%Y%m%d-%H%M%S}"
    token = secrets.token_hex(16)
    args = ["--dataset", kw["dataset"], "--split", "all", "--images", kw["images"],
            "--model", kw["model"], "--seed", str(kw["seed"]), "--allow-reveal"]
    started = time.perf_counter()
    with VictimProcess(args, token=token) as proc:
        click.echo(f"victim started at {proc.address} (pid {proc.pid})")
        settings = AttackSettings(attack=kw["attack_name"],
                                  options={"iterations": kw["iterations"]},
                                  device=kw["device"], seed=kw["seed"], rounds=rounds)
        with VictimClient(proc.address, token=token) as client:
            try:
                record = run_attack(client, settings, out, log=click.echo)
            except VictimError as err:
                raise click.ClickException(str(err)) from None
    _print_summary(record, out)
    click.echo(f"demo finished in {time.perf_counter() - started:.0f} s")


@main.command("train-model")
@click.option("--dataset", default="digits", show_default=True,
              help="Labelled data: digits, faces, photos, or cifar10/cifar100/imagefolder "
                   "with --data-root.")
@click.option("--data-root", type=click.Path(file_okay=False), default=None)
@click.option("--model", default="convnet:width=16", show_default=True,
              help="Model name[:key=value,...]; the victim must use the same spec.")
@click.option("--epochs", default=20, show_default=True, type=click.IntRange(1))
@click.option("--batch-size", default=64, show_default=True, type=click.IntRange(1))
@click.option("--lr", default=0.05, show_default=True, type=float,
              help="Peak SGD learning rate (cosine decay).")
@click.option("--seed", default=0, show_default=True,
              help="Seeds the initialisation (same meaning as the victim's --seed) and order.")
@click.option("--device", default="cpu", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), required=True,
              help="Where to write the checkpoint (a plain state dict); a .json beside it "
                   "records how it was made.")
def train_model(**kw: Any) -> None:
    """Train a checkpoint on a labelled data set, for attacks on trained parameters."""
    import json

    import torch
    from tqdm import tqdm

    from fedleak.harness.datasets import load_dataset
    from fedleak.harness.models import ModelSpec, build_model
    from fedleak.harness.training import train_classifier

    _check_device(kw["device"])
    try:
        train = load_dataset(kw["dataset"], "train", kw["data_root"])
        test = load_dataset(kw["dataset"], "test", kw["data_root"])
        spec = ModelSpec.parse(kw["model"])
        torch.manual_seed(kw["seed"])
        model = build_model(spec, train.info.shape, train.info.num_classes)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    bar = tqdm(total=kw["epochs"], desc=f"training {spec} on {kw['dataset']}", unit="epoch")

    def on_epoch(epoch: int, loss: float, test_accuracy: float) -> None:
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", test_acc=f"{test_accuracy:.1%}")

    result = train_classifier(model, train, test, epochs=kw["epochs"],
                              batch_size=kw["batch_size"], lr=kw["lr"], seed=kw["seed"],
                              device=kw["device"], on_epoch=on_epoch)
    bar.close()
    out = Path(kw["out"])
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.cpu() for k, v in model.state_dict().items()}, out)
    record = {"dataset": kw["dataset"], "model": str(spec), "seed": kw["seed"],
              "epochs": kw["epochs"], "batch_size": kw["batch_size"], "lr": kw["lr"],
              "train_loss": result.final_train_loss, "train_accuracy": result.train_accuracy,
              "test_accuracy": result.test_accuracy}
    out.with_suffix(".json").write_text(json.dumps(record, indent=2))
    click.echo(f"test accuracy {result.test_accuracy:.1%} (train {result.train_accuracy:.1%}); "
               f"checkpoint written to {out}")


@main.command("list")
def list_names() -> None:
    """List data sets, models and attacks."""
    from fedleak.attacks import attack_names
    from fedleak.harness.datasets import DATASET_NAMES
    from fedleak.harness.models import model_names

    click.echo("data sets: " + ", ".join(DATASET_NAMES))
    click.echo("models:    " + ", ".join(model_names()))
    click.echo("attacks:   " + ", ".join(attack_names()))
    click.echo("defenses (--defense NAME:key=value,...):")
    from fedleak.defenses import DEFENSES

    for name in defense_names():
        click.echo(f"  {name} [{DEFENSES.get(name).stage}]")
        for line in DEFENSES.describe(name).splitlines():
            click.echo(f"    {line}")


from fedleak.harness.cli_sweep import report, sweep  # noqa: E402
from fedleak.harness.remote_defense_cli import defense  # noqa: E402

main.add_command(sweep)
main.add_command(report)
main.add_command(defense)


if __name__ == "__main__":
    main(prog_name=os.path.basename(sys.argv[0]))
