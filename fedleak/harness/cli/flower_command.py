"""``fedleak flower``: audit a Flower federation.

    fedleak flower simulate --nodes 2 --rounds 1 --attack inverting-gradients \\
        --defense prune:p=0.9 --out runs/flower
    fedleak flower run-config --nodes 2 --defense prune:p=0.9 > run-config.toml

``simulate`` runs the federation in Flower's simulation engine; ``run-config`` prints the same
settings as a Flower run config for ``flwr run`` against a real SuperLink (docs/flower.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from fedleak.harness.cli.options import ProtocolOptions, option_pairs, packed, protocol_options

#: the SecAgg+ options and their defaults (they only apply with --secagg-plus); the same as
#: FederationSettings' (a test keeps them so), written here so that --help imports no Flower
SECAGG_DEFAULTS = {"secagg_shares": 0, "secagg_threshold": 0, "secagg_max_weight": 0.0,
                   "secagg_clipping_range": 8.0, "secagg_quantization_range": 4194304}


@dataclass(frozen=True)
class FederationOptions:
    """The options both subcommands share, as given (:func:`settings_of` makes them one
    :class:`~fedleak.harness.flower.federation.FederationSettings`)."""

    nodes: int
    rounds: int
    dataset: str
    model: str
    images: int
    protocol: ProtocolOptions
    defenses: tuple[str, ...]
    dp: str
    attack: str
    options: tuple[str, ...]
    seed: int
    model_seed: int
    out: str
    record_only: bool
    no_score: bool
    overwrite: bool
    queue: int
    inline: bool
    no_audit: bool
    threads: int
    secagg_plus: bool
    secagg_shares: int
    secagg_threshold: int
    secagg_max_weight: float
    secagg_clipping_range: float
    secagg_quantization_range: int
    probe: tuple[str, ...]


def federation_options(function: Any) -> Any:
    """The options both subcommands share, handed to the command as ``federation``, a
    :class:`FederationOptions`."""
    decorators = [
        click.option("--nodes", default=2, show_default=True, type=click.IntRange(1),
                     help="SuperNodes (simulated clients)."),
        click.option("--rounds", default=1, show_default=True, type=click.IntRange(1),
                     help="Federated rounds; every node's reply is audited each round."),
        click.option("--dataset", default="digits", show_default=True,
                     help="Bundled data set; node i holds images i::nodes of its train split "
                          "(shakespeare: the speaking roles r with r mod nodes = i, with a text "
                          "model and attack; docs/text.md)."),
        click.option("--model", default="lenet-zhu", show_default=True,
                     help="fedleak model spec (NAME[:key=value,...])."),
        click.option("--images", default=1, show_default=True, type=click.IntRange(1),
                     help="Images (text: sentences) each node trains on per round (its "
                          "batch n)."),
        protocol_options(victim=True),
        click.option("--defense", "defenses", multiple=True,
                     help="Update defense as a client mod, e.g. prune:p=0.9 (repeatable, in "
                          "order)."),
        click.option("--dp", default="",
                     help="DP-SGD in the nodes' training, e.g. dpsgd:noise-multiplier=1,"
                          "max-grad-norm=1 (ε in the replies' metrics)."),
        click.option("--attack", default="inverting-gradients", show_default=True,
                     help="Attack on every node's update (`fedleak attack --help` lists them)."),
        click.option("--option", "-o", "options", multiple=True,
                     help="Attack option key=value (repeatable)."),
        click.option("--seed", default=0, show_default=True, help="Seeds the attack."),
        click.option("--model-seed", default=0, show_default=True,
                     help="Seeds the initial global model."),
        click.option("--out", default="runs/flower", show_default=True,
                     type=click.Path(file_okay=False), help="Run folder of the audit."),
        click.option("--record-only", is_flag=True,
                     help="Only record each node's round (attack later with `fedleak attack "
                          "--from-recording OUT`)."),
        click.option("--no-score", is_flag=True, help="Do not ask the nodes to score."),
        click.option("--overwrite", is_flag=True,
                     help="Replace an audit run already in --out (its metrics.json, "
                          "recording.json and round-RRR-... folders; nothing else); without it "
                          "such an --out is refused."),
        click.option("--queue", default=8, show_default=True, type=click.IntRange(1),
                     help="At most this many node updates wait in the audit's worker (a niced "
                          "process attacking off the round's critical path); more are skipped "
                          "and recorded. Each update gets the attack's own iterations."),
        click.option("--inline", is_flag=True,
                     help="Attack and score each update in the round (blocks it) instead of "
                          "in the worker after it."),
        click.option("--no-audit", is_flag=True, help="Run the federation unaudited."),
        click.option("--threads", default=1, show_default=True, type=click.IntRange(1),
                     help="torch threads per node."),
        click.option("--secagg-plus", is_flag=True,
                     help="Mask the nodes' updates with Flower's SecAgg+ (secaggplus_mod, "
                          "SecAggPlusWorkflow): the server, and so the audit, then sees only "
                          "the aggregate of the surviving nodes, never one node's update; the "
                          "audit attacks that aggregate as one batch of all their images."),
        click.option("--secagg-shares", default=SECAGG_DEFAULTS["secagg_shares"],
                     show_default=True, type=click.IntRange(0),
                     help="SecAgg+: nodes each node's key is shared among (0 = every node)."),
        click.option("--secagg-threshold", default=SECAGG_DEFAULTS["secagg_threshold"],
                     show_default=True, type=click.IntRange(0),
                     help="SecAgg+: shares needed to unmask a node (0 = a majority of the "
                          "shares, at least 2)."),
        click.option("--secagg-max-weight", default=SECAGG_DEFAULTS["secagg_max_weight"],
                     show_default=True,
                     type=click.FloatRange(0),
                     help="SecAgg+: the largest example count a node weighs its update by (0 = "
                          "--images, the finest quantisation; Flower's own default is 1000, "
                          "1000/n times coarser)."),
        click.option("--secagg-clipping-range",
                     default=SECAGG_DEFAULTS["secagg_clipping_range"], show_default=True,
                     type=click.FloatRange(0, min_open=True),
                     help="SecAgg+: parameters are clipped to +-this before quantisation."),
        click.option("--secagg-quantization-range",
                     default=SECAGG_DEFAULTS["secagg_quantization_range"], show_default=True,
                     type=click.IntRange(2),
                     help="SecAgg+: quantisation levels over the clipping range."),
        click.option("--probe", multiple=True, type=click.Choice(["trap-weights", "fishing"]),
                     help="After the federation, a malicious server's probe rounds: the "
                          "attack's crafted parameters sent to the nodes, their updates "
                          "discarded from training, attacked and scored on the nodes, recorded "
                          "under threat model 'malicious parameters' apart from the headline "
                          "(repeat for both; under --secagg-plus: trap-weights on the "
                          "aggregate)."),
    ]
    return packed(FederationOptions, "federation", decorators)(function)


def settings_of(given: FederationOptions, allow_reveal: bool = False) -> Any:
    """The :class:`FederationSettings` the options describe (usage errors on bad values)."""
    from fedleak.harness.flower.federation import FederationSettings

    options = option_pairs(given.options, "--option")
    protocol = given.protocol.given()
    settings = FederationSettings(
        nodes=given.nodes, rounds=given.rounds, dataset=given.dataset, model=given.model,
        images=given.images, protocol=protocol.kind, local_epochs=protocol.local_epochs,
        local_batch_size=protocol.local_batch_size, lr=protocol.lr,
        batchnorm=protocol.batchnorm, defenses=tuple(given.defenses), dp=given.dp,
        attack=given.attack, options=tuple(f"{k}={v}" for k, v in options.items()),
        seed=given.seed, model_seed=given.model_seed, out=given.out,
        audit=not given.no_audit, record_only=given.record_only, score=not given.no_score,
        threads=given.threads, secagg_plus=given.secagg_plus,
        secagg_shares=given.secagg_shares, secagg_threshold=given.secagg_threshold,
        secagg_max_weight=given.secagg_max_weight,
        secagg_clipping_range=given.secagg_clipping_range,
        secagg_quantization_range=given.secagg_quantization_range,
        momentum=protocol.momentum, weight_decay=protocol.weight_decay,
        nesterov=protocol.nesterov, shuffle=protocol.shuffle_batches, queue=given.queue,
        inline=given.inline, probe=tuple(given.probe),
        overwrite=given.overwrite, allow_reveal=allow_reveal)
    if not settings.secagg_plus:
        given_flags = [f"--{key.replace('_', '-')}" for key, default in SECAGG_DEFAULTS.items()
                       if getattr(given, key) != default]
        if given_flags:
            raise click.UsageError(f"{', '.join(given_flags)} only apply with --secagg-plus")
    check_settings(settings)
    return settings


def check_settings(settings: Any) -> None:
    """Fail before Flower starts on what would fail on every node: defenses, attack, data."""
    from fedleak.attacks import AttackConfigError, create_attack
    from fedleak.defenses import DefenseConfigError
    from fedleak.harness.flower.node.mods import DefenseModError, update_chain
    from fedleak.harness.victim.text_pool import is_text_dataset
    from fedleak.harness.zoo.datasets import DatasetError, dataset_info
    from fedleak.harness.zoo.models import ModelError, build_model

    try:
        if settings.defenses:
            update_chain(settings.defenses)
    except (DefenseModError, DefenseConfigError) as err:
        raise click.BadParameter(str(err), param_hint="--defense") from None
    try:
        create_attack(settings.attack, settings.attack_options())
    except AttackConfigError as err:
        raise click.UsageError(str(err)) from None
    try:
        if is_text_dataset(settings.dataset):  # a text federation (docs/text.md)
            check_text_federation(settings)
        else:
            info = dataset_info(settings.dataset)
            build_model(settings.model, info.shape, info.num_classes)
    except (DatasetError, ModelError) as err:
        raise click.UsageError(str(err)) from None
    if settings.secagg_plus:
        try:
            settings.secagg().check(settings.nodes, settings.images)
        except ValueError as err:
            raise click.UsageError(f"--secagg-plus: {err}") from None
        if "fishing" in settings.probe:
            raise click.UsageError("--probe fishing needs several probe rounds, each one node's "
                                   "update: under --secagg-plus the server holds the aggregate "
                                   "of one round; probe with trap-weights")
    try:
        settings.procedure()
    except ValueError as err:
        raise click.UsageError(str(err)) from None


def check_text_federation(settings: Any) -> None:
    """A text federation: a text model and attack, no SecAgg+ (its audit reads images)."""
    from fedleak.attacks import attack_class
    from fedleak.harness.zoo.text.text_datasets import load_text_dataset
    from fedleak.harness.zoo.text.text_models import build_text_model

    if attack_class(settings.attack).threat_model != "text-update":
        raise click.UsageError(f"attack {settings.attack!r} reconstructs images; a text "
                               "federation takes token-set, dager, lamp or tag")
    if settings.secagg_plus or settings.record_only:
        raise click.UsageError("a text federation is audited reply by reply: drop "
                               "--secagg-plus and --record-only")
    from fedleak.harness.victim.text_pool import model_task, model_tokenizer

    build_text_model(settings.model, load_text_dataset(
        settings.dataset, "test", task=model_task(settings.model),
        tokenizer=model_tokenizer(settings.model)).info)


def _flower() -> None:
    try:
        import fedleak.harness.flower  # noqa: F401
    except ImportError as err:
        raise click.ClickException(str(err)) from None


@click.group()
def flower() -> None:
    """Audit a Flower federation: attack every client update, defenses as client mods."""


@flower.command()
@federation_options
@click.option("--allow-reveal", is_flag=True,
              help="The simulated nodes reveal their batches for the comparison pictures "
                   "(comparison.png in each round folder); you are their operator here.")
@click.option("--verbose", is_flag=True, help="Flower's verbose logging.")
def simulate(federation: FederationOptions, allow_reveal: bool, verbose: bool) -> None:
    """Run an audited federation in Flower's simulation engine; write the run to --out.

    \b
    What the audit sees is what the server sees:
    - by default every node's update (θ' - θ, or the gradient for one-step FedSGD): each is
      attacked alone and scored on its node;
    - with --secagg-plus only the aggregate of the nodes SecAgg+ let through, weighted by
      their example counts and quantised (the bound is in metrics.json). The audit attacks it
      as one batch of all those nodes' images, and each node finds and scores its own among
      the reconstruction. It never sees, and cannot attack, one node's update; rounds with
      more than one local step per node are not attacked (a mean of several trajectories is
      not one client's update), and BatchNorm in train mode makes the replay inexact (warned).
    """
    _flower()
    from pathlib import Path

    from fedleak.harness.attacker.records import METRICS_NAME
    from fedleak.harness.flower.auditor import FolderInUse, claim_folder
    from fedleak.harness.flower.federation import simulate as run
    from fedleak.harness.victim.text_pool import is_text_dataset

    settings = settings_of(federation, allow_reveal=allow_reveal)
    if is_text_dataset(settings.dataset):
        from fedleak.harness.flower.text.text_audit import simulate_text as run
    if settings.audit:
        try:  # before Flower starts: a refusal inside the ServerApp is a Ray traceback
            claim_folder(Path(settings.out), settings.overwrite)
        except FolderInUse as err:
            raise click.UsageError(str(err)) from None
    metrics = run(settings, verbose=verbose)
    if not settings.audit:
        click.echo("federation finished (unaudited)")
        return
    if not metrics:
        raise click.ClickException(f"the federation wrote no {METRICS_NAME} in {settings.out}; "
                                   "see Flower's log above")
    summary = metrics["summary"]
    for warning in metrics["warnings"]:
        click.echo(f"warning: {warning}")
    what = "SecAgg+ aggregate(s)" if settings.secagg_plus else "node update(s)"
    if settings.secagg_plus:
        views = sorted({r["server_view"] for r in metrics["rounds"] if "server_view" in r})
        click.echo(f"server view: {', '.join(views) or 'secagg+ aggregate'} — never one "
                   "node's update; each aggregate attacked as one batch of all its nodes' images")
    chains = sorted({", ".join(r["defenses"]) for r in metrics["rounds"] if r.get("defenses")})
    for chain in chains:
        click.echo(f"published client defenses: {chain}")
    parts = sorted({f"{r['parts'].get('objective')} / {r['parts'].get('replay')}"
                    for r in metrics["rounds"] if r.get("parts")})
    if parts:
        click.echo(f"attack parts (objective / replay): {'; '.join(parts)}")
    if summary.get("rouge1") is not None or summary.get("token_precision") is not None:
        click.echo(f"{summary['rounds']} {what} attacked and scored: mean ROUGE-1 "
                   f"{summary['rouge1']}, ROUGE-2 {summary['rouge2']}, token set P "
                   f"{summary['token_precision']} R {summary['token_recall']} (scored on the "
                   "nodes)")
    elif summary.get("mean_psnr") is not None:
        modelled = sum(r.get("replay") == "modelled" and bool(r.get("images"))
                       for r in metrics["rounds"])
        note = f", {modelled} of them with the order unknown, modelled" if modelled else ""
        click.echo(f"{summary['rounds']} {what} attacked and scored: mean PSNR "
                   f"{summary['mean_psnr']:.2f} dB, mean SSIM {summary['mean_ssim']:.3f} "
                   f"(scored on the nodes{note})")
        click.echo(floor_line(summary))
    if summary.get("unscored"):
        click.echo(f"{summary['unscored']} {what} attacked but unscored (left out of the "
                   "headline; metrics.json says why)")
    inexact = metrics.get("inexact_summary")
    if inexact:
        figure = (f"mean PSNR {inexact['mean_psnr']:.2f} dB, mean SSIM "
                  f"{inexact['mean_ssim']:.3f}" if inexact.get("mean_psnr") is not None
                  else "unscored")
        click.echo(f"{inexact['rounds']} {what} with an inexact replay, LOWER BOUND ONLY (not a "
                   f"measurement): {figure}")
        for reason in sorted({x for r in metrics["rounds"] for x in r.get("inexact_reasons", [])}):
            click.echo(f"  inexact: {reason}")
    pictures = [r["files"]["comparison"] for r in metrics["rounds"]
                if "comparison" in r.get("files", {})]
    if pictures:
        click.echo(f"comparison pictures: {len(pictures)} in {settings.out} (e.g. "
                   f"{pictures[0]})")
    probe = metrics.get("malicious_probe")
    if probe:
        click.echo(f"malicious server (threat model: {probe['threat_model']}; "
                   f"{probe['training']}):")
        for outcome in probe["outcomes"]:
            click.echo(f"  {probe_line(outcome)}")
    click.echo(f"audit {metrics['status']}" + (f": {metrics['status_reason']}"
                                               if metrics.get("status_reason") else ""))
    click.echo(f"metrics: {settings.out}/{METRICS_NAME}")


def floor_line(summary: dict[str, Any]) -> str:
    """The headline's floor as ``metrics.json`` holds it, in words when nothing is above."""
    from fedleak.harness.metrics.floors import FloorSummary, floor_words

    floors = summary.get("floors")
    if not floors:
        return "floor: not scored"
    return floor_words(FloorSummary({g: (v[0], v[1]) for g, v in floors["guesses"].items()},
                                    floors["mean_psnr"], floors["mean_ssim"],
                                    floors["mean_margin"], floors["above"], floors["images"],
                                    floors["margin_db"]), summary.get("label_accuracy"))


def probe_line(outcome: dict[str, Any]) -> str:
    """One probe outcome as ``metrics.json`` holds it."""
    head = f"{outcome['attack']} on {outcome['node']}"
    record = outcome.get("round") or {}
    if outcome["status"] != "attacked" or record.get("mean_psnr") is None:
        return f"{head}: {outcome['status']}: {outcome.get('reason') or record.get('unscored')}"
    floor = (record.get("floors") or {}).get("mean_psnr")
    return (f"{head}: {outcome['recovered']} of {outcome['images']} image(s) at >= 20 dB and "
            f">= 5 dB above their floor; mean PSNR {record['mean_psnr']:.2f} dB"
            + (f", floor {floor:.2f} dB" if floor is not None else ""))


@flower.command("run-config")
@federation_options
def run_config(federation: FederationOptions) -> None:
    """Print the settings as a Flower run config ([tool.flwr.app.config] of a Flower app)."""
    _flower()
    settings = settings_of(federation)
    click.echo("[tool.flwr.app.config]")
    for key, value in settings.run_config().items():
        text = str(value).lower() if isinstance(value, bool) else repr(value) \
            if isinstance(value, float) else f'"{value}"' if isinstance(value, str) else value
        click.echo(f"{key} = {text}")
