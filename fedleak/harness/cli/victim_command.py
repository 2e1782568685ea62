"""``fedleak victim serve``: the federated user as a gRPC service, until SIGTERM or SIGINT.

    fedleak victim serve --dataset photos --model lenet-zhu --port 0 --allow-reveal
    fedleak victim serve --settings victim.json --port 0      # settings a sweep wrote

The options that define the victim become one
:class:`~fedleak.harness.victim.settings.VictimSettings` here, and nowhere else.
"""

from __future__ import annotations

import os
import secrets
import sys
import threading
from pathlib import Path
from typing import Any

import click

from fedleak.harness.cli.options import (
    DEFAULT_PORT,
    SCORE_TOKEN_ENV,
    TOKEN_ENV,
    ProtocolOptions,
    TokenOptions,
    check_device,
    protocol_options,
    token_options,
)
from fedleak.harness.cli.text_options import DEFAULT_SEQ_LEN, TextOptions, text_options
from fedleak.harness.cli.victim_serving import (
    DEFAULT_IMAGE_BUDGET,
    required_score_token,
    serving_limits,
    start_warnings,
)

#: Defaults of --audit-budget and --max-audit-trials (fedleak.harness.victim.limits).
DEFAULT_AUDIT_BUDGET = 16
DEFAULT_MAX_AUDIT_TRIALS = 20_000

#: Options that say how to serve, not which victim: the only ones --settings leaves open.
SERVING_OPTIONS = ("settings_file", "host", "port", "token", "token_file", "score_token",
                   "score_token_file", "max_message_mb", "tls_cert", "tls_key", "open_score",
                   "request_memory_mb", "max_calls_per_peer", "max_connections_per_peer",
                   "max_calls_per_prefix", "max_connections_per_prefix",
                   "receive_timeout")
#: Defaults of the serving caps (fedleak.harness.wire.admission; literals here so the CLI
#: starts without importing gRPC).
DEFAULT_MAX_CALLS_PER_PEER = 16
DEFAULT_MAX_CONNECTIONS_PER_PEER = 64
DEFAULT_RECEIVE_TIMEOUT = 60.0


@click.group()
def victim() -> None:
    """The federated user (victim) process."""


@victim.command("serve")
@click.option("--settings", "settings_file", type=click.Path(dir_okay=False, exists=True),
              default=None,
              help="JSON file of victim settings (as `fedleak sweep` writes them) instead of "
                   "the data, model, protocol and defense options below.")
@click.option("--dataset", default="photos", show_default=True,
              help="Private data: digits, faces, photos (bundled) or cifar10, cifar100, "
                   "imagefolder (under --data-root); text: shakespeare (bundled) or textfile "
                   "(--data-root FILE or folder of .txt), with a text model (gpt2, bert, hf).")
@click.option("--split", default="train", show_default=True, help="train, test or all.")
@click.option("--images", default=None,
              help="Restrict the private pool to these indices of the split, e.g. 0-3,7.")
@click.option("--shuffle/--no-shuffle", default=False, show_default=True,
              help="Shuffle the private pool with --seed.")
@click.option("--data-root", type=click.Path(), default=None,
              help="Folder holding cifar10/cifar100/imagefolder data; textfile: a .txt file "
                   "or a folder of them.")
@click.option("--image-size", type=click.IntRange(8), default=None,
              help="imagefolder: resize and centre-crop your images to N×N (e.g. 224) "
                   "instead of 32×32.")
@click.option("--normalization", default=None, metavar="MEAN/STD",
              help="imagefolder: the normalisation your model was trained with, each one "
                   "number or three (0.5/0.5; default ImageNet's); Describe states it.")
@click.option("--download", is_flag=True, help="Download cifar10/cifar100 into --data-root.")
@click.option("--model", default="lenet-zhu", show_default=True,
              help="Model name[:key=value,...], e.g. convnet:width=64 (see `fedleak list`), "
                   "or your own model as an importable factory module:factory (e.g. "
                   "pytorchexample.task:Net, its folder on PYTHONPATH), called with no "
                   "arguments.")
@click.option("--checkpoint", type=click.Path(dir_okay=False, exists=True), default=None,
              help="State dict of a trained model: the federation's global model.")
@click.option("--batch-size", "-n", default=1, show_default=True, type=click.IntRange(1),
              help="Private images per round (n).")
@click.option("--seed", default=0, show_default=True, help="Seeds model init and shuffling.")
@protocol_options(victim=True)
@text_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535),
              help="Port to bind; 0 picks a free one (the bound address is printed).")
@token_options
@click.option("--return-buffers", type=click.Choice(["never", "fedavg", "always"]),
              default="fedavg", show_default=True,
              help="When updates carry the BatchNorm running statistics local training left "
                   "(as a FedAvg client's state_dict does); published in Describe.")
@click.option("--allow-reveal", is_flag=True,
              help="Allow Reveal (ground truth for reports) to callers holding the token.")
@click.option("--allow-audit", is_flag=True,
              help="Play the audit game (BeginAudit): secret coins, synthetic canaries before "
                   "the defense chain, ε lower bounds from the server's scores "
                   "(`fedleak audit`, docs/audit.md).")
@click.option("--audit-budget", default=DEFAULT_AUDIT_BUDGET, show_default=True,
              type=click.IntRange(1),
              help="Audits answered over the victim's life (each answer is final).")
@click.option("--max-audit-trials", default=DEFAULT_MAX_AUDIT_TRIALS, show_default=True,
              type=click.IntRange(1), help="The most trials one audit may run.")
@click.option("--max-message-mb", default=None, type=click.IntRange(1, 2047),
              help="Largest gRPC message accepted or sent; a larger request is refused from its "
                   "declared length before it is received. Default: twice what this victim's "
                   "model and data need, at least 64 (Describe publishes it).")
@click.option("--request-memory-mb", default=None, type=click.IntRange(1),
              help="Memory that request bodies in flight may hold, all clients together (one "
                   "client host at most half); a request waits (unread) while it is full. "
                   "Default: room for four requests of --max-message-mb (each counted 4 times: "
                   "the copies it takes to receive and decode).")
@click.option("--max-calls-per-peer", default=DEFAULT_MAX_CALLS_PER_PEER, show_default=True,
              type=click.IntRange(1),
              help="Calls one client host may have in flight (Describe and health aside); "
                   "more are refused with RESOURCE_EXHAUSTED.")
@click.option("--max-connections-per-peer", default=DEFAULT_MAX_CONNECTIONS_PER_PEER,
              show_default=True, type=click.IntRange(1),
              help="Connections one client host may hold; beyond it its oldest idle (then "
                   "stalled) ones are closed.")
@click.option("--max-calls-per-prefix", default=None, type=click.IntRange(1),
              help="Calls in flight of one address prefix (a /24 of IPv4, a /64 of IPv6) "
                   "together. Default: 4 x --max-calls-per-peer.")
@click.option("--max-connections-per-prefix", default=None, type=click.IntRange(1),
              help="Connections one address prefix (/24, /64) may hold together; beyond it "
                   "its oldest idle (then stalled) ones are closed. Default: 4 x "
                   "--max-connections-per-peer.")
@click.option("--receive-timeout", default=DEFAULT_RECEIVE_TIMEOUT, show_default=True,
              type=click.FloatRange(0, min_open=True),
              help="Seconds a request body may take to arrive after its call began "
                   "(then DEADLINE_EXCEEDED).")
@click.option("--open-score", is_flag=True,
              help="On a non-loopback --host, let any client that holds a round id call Score "
                   "without the score token (round ids are bearer tokens). By default such a "
                   "victim requires --score-token, and makes one up when none is given.")
@click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True), default=None,
              help="PEM certificate for TLS (with --tls-key); use for non-loopback hosts.")
@click.option("--tls-key", type=click.Path(dir_okay=False, exists=True), default=None)
@click.option("--defense", "defense_specs", multiple=True, metavar="NAME:KEY=VALUE,...",
              help="A defense of the chain, e.g. dpsgd:noise-multiplier=0.5 or prune:p=0.9 "
                   "(repeatable, applied in order); `fedleak list` shows every defense with "
                   "its parameters.")
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
@click.option("--informed-candidates", default=0, show_default=True, type=click.IntRange(0),
              help="Play the informed-adversary game (BeginInformedTrial, `fedleak "
                   "informed-adversary`): N public candidates per trial from the data set's other "
                   "split, the target picked by a secret coin (κ = 1/N); 0: no game.")
@click.option("--informed-known", default=0, show_default=True, type=click.IntRange(0),
              help="Known (public) records trained beside the game's target.")
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
@click.option("--score-budget", default=1, show_default=True, type=click.IntRange(1),
              help="Submissions Score accepts per round (per user set) and per release; a "
                   "submission is final. More than 1 makes Score an oracle: research only.")
@click.option("--image-score-budget", default=DEFAULT_IMAGE_BUDGET, show_default=True,
              type=click.IntRange(1),
              help="Scores that may depend on one private image over the victim's life (every "
                   "round, user set and release it belongs to): bounds what Score can tell "
                   "about an image. See docs/security.md.")
@click.option("--secagg-memory-mb", default=1024, show_default=True, type=click.IntRange(1),
              help="Bytes (MiB) of secure-aggregation state kept: users' updates of unfinished "
                   "rounds. The oldest rounds are forgotten to make room; a round larger than "
                   "this is refused (RESOURCE_EXHAUSTED).")
@click.option("--feature-memory-mb", default=512, show_default=True, type=click.IntRange(1),
              help="Bytes (MiB) of round parameters kept for scoring recovered features "
                   "(the latest round always).")
@click.option("--release-memory-mb", default=512, show_default=True, type=click.IntRange(1),
              help="Bytes (MiB) of released models kept for Score and Reveal (the oldest "
                   "forgotten); a model larger than this is not released.")
@click.option("--max-local-epochs", default=100, show_default=True, type=click.IntRange(1),
              help="The most FedAvg local epochs E a server may ask for.")
@click.option("--max-local-steps", default=10_000, show_default=True, type=click.IntRange(1),
              help="The most FedAvg local steps E·⌈n/B⌉ a server may ask for.")
@click.option("--max-lr", default=10.0, show_default=True,
              type=click.FloatRange(0, min_open=True),
              help="The largest learning rate a server may ask for (FedAvg τ, release).")
@click.pass_context
def victim_serve(
    ctx: click.Context, settings_file: str | None, dataset: str, split: str,
    images: str | None, shuffle: bool, data_root: str | None, image_size: int | None,
    normalization: str | None, download: bool, model: str,
    checkpoint: str | None, batch_size: int, seed: int, protocol: ProtocolOptions,
    text: TextOptions, host: str,
    port: int, tokens: TokenOptions, return_buffers: str, allow_reveal: bool,
    allow_audit: bool, audit_budget: int, max_audit_trials: int, max_message_mb: int | None,
    request_memory_mb: int | None, max_calls_per_peer: int, max_connections_per_peer: int,
    max_calls_per_prefix: int | None, max_connections_per_prefix: int | None,
    receive_timeout: float, open_score: bool, tls_cert: str | None, tls_key: str | None,
    defense_specs: tuple[str, ...], defense_file: str | None, defense_seed: int | None,
    users: int, secagg_drop: tuple[str, ...], informed_candidates: int, informed_known: int,
    device: str, release_size: int, release_lr: float, release_epochs: int,
    release_target_loss: float, score_budget: int, image_score_budget: int,
    secagg_memory_mb: int, feature_memory_mb: int, release_memory_mb: int,
    max_local_epochs: int, max_local_steps: int, max_lr: float,
) -> None:
    """Serve a federated user over gRPC until SIGTERM or SIGINT."""
    from fedleak.harness.wire.serving import StopSignals, die_with_parent_if_asked

    signals = StopSignals()  # from the start: a SIGTERM while starting is not lost
    die_with_parent_if_asked()  # started by demo, a sweep or a test: die with that parent
    from fedleak.harness.victim.server import start_server
    from fedleak.harness.victim.settings import SetupError, create_victim
    from fedleak.harness.wire.serving import host_port, serve_until_signal

    try:
        from fedleak.harness.zoo.folder_look import with_look
        from fedleak.harness.zoo.user_models import is_factory, trust

        if is_factory(model):
            trust(model)  # this process's user named it
        dataset = with_look(dataset, image_size, normalization)
        settings = _settings_file(ctx, settings_file) if settings_file else victim_settings(
            dataset=dataset, model=model, split=split, images=images, shuffle=shuffle,
            data_root=data_root, download=download, checkpoint=checkpoint,
            batch_size=batch_size, seed=seed, protocol=protocol, allow_reveal=allow_reveal,
            device=device, defense_specs=defense_specs, return_buffers=return_buffers,
            allow_audit=allow_audit, defense_file=defense_file, defense_seed=defense_seed,
            users=users, secagg_drop=secagg_drop, informed_candidates=informed_candidates,
            informed_known=informed_known, release_size=release_size, release_lr=release_lr,
            release_epochs=release_epochs, release_target_loss=release_target_loss,
            score_budget=score_budget, image_score_budget=image_score_budget,
            max_local_epochs=max_local_epochs, max_local_steps=max_local_steps, max_lr=max_lr,
            secagg_memory_mb=secagg_memory_mb, feature_memory_mb=feature_memory_mb,
            release_memory_mb=release_memory_mb, audit_budget=audit_budget,
            max_audit_trials=max_audit_trials, text=text)
    except (ValueError, SetupError) as err:  # ProtocolError, ReleaseSettings, SetupError
        raise click.UsageError(str(err)) from None
    check_device(settings.device)  # --device cuda on a torch without CUDA: a usage error
    token, score_token = tokens.read()
    if settings.reveal and not token:
        token = secrets.token_hex(16)
        click.echo(f"reveal token (pass as --token or ${TOKEN_ENV}): {token}", err=True)
    score_token, made_up = required_score_token(host, score_token, open_score)
    if made_up:
        click.echo(f"score token (give it to the evaluator as --score-token or "
                   f"${SCORE_TOKEN_ENV}; --open-score to go without): {score_token}", err=True)
    try:
        v = create_victim(settings)
    except ValueError as err:  # DatasetError, ModelError, DefenseConfigError, SetupError
        raise click.UsageError(str(err)) from None
    if bool(tls_cert) != bool(tls_key):
        raise click.UsageError("TLS needs both --tls-cert and --tls-key")
    cert = Path(tls_cert).read_bytes() if tls_cert else None
    key = Path(tls_key).read_bytes() if tls_key else None
    limits = serving_limits(v, max_message_mb=max_message_mb,
                            request_memory_mb=request_memory_mb,
                            max_calls_per_peer=max_calls_per_peer,
                            max_connections_per_peer=max_connections_per_peer,
                            max_calls_per_prefix=max_calls_per_prefix,
                            max_connections_per_prefix=max_connections_per_prefix,
                            receive_timeout=receive_timeout)
    stopping = threading.Event()
    try:
        server, bound = start_server(v, host, port, token, tls_cert=cert, tls_key=key,
                                     score_token=score_token, stopping=stopping, limits=limits)
    except (OSError, RuntimeError, ValueError) as err:
        raise click.ClickException(f"cannot listen on {host_port(host, port)}: "
                                   f"{err}") from None
    for warning in [*start_warnings(v), *server.warnings]:
        click.echo(warning, err=True)
    chain = v.config.defenses
    click.echo(f"fedleak victim listening on {host_port(host, bound)} "
               f"({v.info.name}, {len(v.data.labels)} private "
               f"{'images' if v.info.mean else 'sentences'}, {v.config.model}, "
               f"{settings.protocol.kind}, n={v.config.num_images}, defenses: "
               f"{', '.join(d.name for d in chain.defenses) or 'none'})", err=False)
    sys.stdout.flush()
    serve_until_signal(server, stopping=stopping, signals=signals)
    click.echo("fedleak victim stopped", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # a computation that ignored the stop must not keep the process alive


def victim_settings(
    *, dataset: str, model: str, split: str, images: str | None, shuffle: bool,
    data_root: str | None, download: bool, checkpoint: str | None, batch_size: int, seed: int,
    protocol: ProtocolOptions, allow_reveal: bool, device: str, defense_specs: tuple[str, ...],
    return_buffers: str | None, allow_audit: bool, defense_file: str | None,
    defense_seed: int | None, users: int, secagg_drop: tuple[str, ...],
    informed_candidates: int, informed_known: int, release_size: int, release_lr: float,
    release_epochs: int, release_target_loss: float, score_budget: int,
    image_score_budget: int, max_local_epochs: int, max_local_steps: int, max_lr: float,
    secagg_memory_mb: int, feature_memory_mb: int, release_memory_mb: int,
    audit_budget: int = DEFAULT_AUDIT_BUDGET, max_audit_trials: int = DEFAULT_MAX_AUDIT_TRIALS,
    text: TextOptions | None = None,
) -> Any:
    """The victim the command-line options describe."""
    from fedleak.harness.federated.protocol import Protocol
    from fedleak.harness.victim.limits import VictimLimits
    from fedleak.harness.victim.release.releaser import ReleaseSettings
    from fedleak.harness.victim.settings import VictimSettings

    text = text or TextOptions(DEFAULT_SEQ_LEN, None, 0)
    return VictimSettings(
        seq_len=text.seq_len, tokenizer=text.tokenizer, canaries=text.canaries,
        dataset=dataset, model=model, split=split, images=images,
        shuffle=shuffle, data_root=data_root, download=download,
        checkpoint=checkpoint, batch_size=batch_size, seed=seed,
        protocol=Protocol.from_options(protocol.values()), reveal=allow_reveal,
        device=device, defenses=tuple(defense_specs),
        buffers=return_buffers or "fedavg", audit=allow_audit,
        defense_file=defense_file, defense_seed=defense_seed, users=users,
        secagg_drops=tuple(secagg_drop),
        informed_candidates=informed_candidates, informed_known=informed_known,
        release=ReleaseSettings(size=release_size, lr=release_lr,
                                max_epochs=release_epochs,
                                target_loss=release_target_loss),
        limits=VictimLimits(score_budget=score_budget,
                            image_score_budget=image_score_budget,
                            max_local_epochs=max_local_epochs,
                            max_local_steps=max_local_steps,
                            max_learning_rate=max_lr,
                            secagg_memory_mb=secagg_memory_mb,
                            feature_memory_mb=feature_memory_mb,
                            release_memory_mb=release_memory_mb,
                            audit_budget=audit_budget,
                            max_audit_trials=max_audit_trials),
    )


def _settings_file(ctx: click.Context, path: str) -> Any:
    """Settings from ``--settings``; victim options given beside it are refused by name."""
    from fedleak.harness.victim.settings import VictimSettings

    given = [name for name, value in ctx.params.items()
             if name not in SERVING_OPTIONS
             and ctx.get_parameter_source(name) in (click.core.ParameterSource.COMMANDLINE,
                                                    click.core.ParameterSource.ENVIRONMENT)]
    if given:
        flags = ", ".join("--" + n.replace("_", "-") for n in sorted(given))
        raise click.UsageError(f"--settings describes the whole victim; drop {flags} or put "
                               "them into the settings file")
    return VictimSettings.load(path)
