"""Click options and conversions the commands share, each written once.

The protocol options (``--protocol``, ``--local-epochs``, ``--local-batch-size``, ``--lr``,
``--batchnorm``, ``--momentum``, ``--weight-decay``, ``--nesterov``, ``--shuffle-batches``)
carry the same user-facing names as a sweep spec's ``[[sweep.protocol]]`` table;
:func:`protocol_options` declares them for the victim (with the user's defaults) and for the
attacker (unset: the victim decides), and ``fedleak.harness.federated.protocol`` turns them into
the typed :class:`~fedleak.harness.federated.protocol.Protocol`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from fedleak.harness.federated.protocol import BATCHNORM_MODES, OPTION_FIELDS, PROTOCOLS, Protocol

TOKEN_ENV = "FEDLEAK_TOKEN"
SCORE_TOKEN_ENV = "FEDLEAK_SCORE_TOKEN"
DEFAULT_PORT = 50051

F = TypeVar("F", bound=Callable[..., Any])


def packed(into: type[Any], name: str, decorators: Sequence[Callable[[Any], Any]]) \
        -> Callable[[F], F]:
    """Declare ``decorators``' options on a command and hand their values to it as one typed
    ``into`` object (a dataclass whose fields are the options' names), as parameter ``name``.

    The options, their names and their help are unchanged; only the command's signature is
    shorter and typed."""
    fields = [f.name for f in dataclasses.fields(into)]

    def apply(function: F) -> F:
        @functools.wraps(function)
        def command(*args: Any, **kwargs: Any) -> Any:
            kwargs[name] = into(**{field: kwargs.pop(field) for field in fields})
            return function(*args, **kwargs)

        wrapped: Any = command
        for decorator in reversed(decorators):
            wrapped = decorator(wrapped)
        return wrapped

    return apply


@dataclass(frozen=True)
class ProtocolOptions:
    """The protocol options as given: the victim's (with its defaults) or the attacker's (None:
    the victim decides)."""

    kind: str | None
    local_epochs: int | None
    local_batch_size: int | None
    lr: float | None
    batchnorm: str | None
    momentum: float | None
    weight_decay: float | None
    nesterov: bool | None
    shuffle_batches: bool | None

    def given(self) -> VictimProtocolOptions:
        """The victim's options, each of which has a default (so none is None)."""
        values = dataclasses.asdict(self)
        missing = [name for name, value in values.items() if value is None]
        assert not missing, f"victim protocol options without a default: {missing}"
        return VictimProtocolOptions(**values)

    def values(self) -> dict[str, Any]:
        """By their user-facing names (``Protocol.from_options`` and ``changes_from_options``
        take them)."""
        return {name: getattr(self, name) for name in OPTION_FIELDS}


@dataclass(frozen=True)
class VictimProtocolOptions:
    """The protocol options of a victim (``protocol_options(victim=True)``): all set."""

    kind: str
    local_epochs: int
    local_batch_size: int
    lr: float
    batchnorm: str
    momentum: float
    weight_decay: float
    nesterov: bool
    shuffle_batches: bool


@dataclass(frozen=True)
class TokenOptions:
    """``--token``/``--token-file`` and ``--score-token``/``--score-token-file`` as given."""

    token: str | None
    token_file: str | None
    score_token: str | None
    score_token_file: str | None

    def read(self) -> tuple[str | None, str | None]:
        """(token, score token), a file taking the place of the value."""
        return (_token(self.token, self.token_file, "--token"),
                _token(self.score_token, self.score_token_file, "--score-token"))


def protocol_options(victim: bool) -> Callable[[F], F]:
    """The protocol options, handed to the command as ``protocol``, a :class:`ProtocolOptions`;
    ``victim``: with the user's defaults, else unset (None)."""
    d = Protocol()

    def default(value: Any) -> Any:
        return value if victim else None

    who = "" if victim else "Ask for "
    decorators = [
        click.option("--protocol", "kind", type=click.Choice(PROTOCOLS), default=default(d.kind),
                     show_default=victim,
                     help=(f"{who}fedsgd: send one gradient; fedavg: send the parameter delta "
                           "after local SGD." + ("" if victim else " (victim default if unset)"))),
        click.option("--local-epochs", type=click.IntRange(1), default=default(d.local_epochs),
                     show_default=victim, help="FedAvg: local epochs E."),
        click.option("--local-batch-size", type=click.IntRange(0),
                     default=default(d.batch_size), show_default=victim,
                     help="FedAvg: mini-batch size B (0 = all n images)."),
        click.option("--lr", type=float, default=default(d.learning_rate), show_default=victim,
                     help="FedAvg: local learning rate τ."),
        click.option("--batchnorm", type=click.Choice(BATCHNORM_MODES),
                     default=default(d.batchnorm), show_default=victim,
                     help=("BatchNorm layers in local training: 'train' normalises with the "
                           "batch's statistics, 'eval' with the running ones (Geiping et al.'s "
                           "setting)." + ("" if victim else " Victim default if unset."))),
        click.option("--momentum", type=click.FloatRange(0), default=default(d.momentum),
                     show_default=victim,
                     help="FedAvg: SGD momentum μ of the local optimiser (torch.optim.SGD)."),
        click.option("--weight-decay", type=click.FloatRange(0),
                     default=default(d.weight_decay), show_default=victim,
                     help="FedAvg: SGD weight decay λ."),
        click.option("--nesterov/--no-nesterov", default=default(d.nesterov),
                     show_default=victim, help="FedAvg: Nesterov momentum (needs --momentum)."),
        click.option("--shuffle-batches/--in-order-batches", default=default(d.shuffle),
                     show_default=victim,
                     help="FedAvg: a new secret order of the images every local epoch "
                          "(DataLoader(shuffle=True)); the attack then reconstructs one copy per "
                          "epoch (docs/fedavg.md)."),
    ]

    return packed(ProtocolOptions, "protocol", decorators)


def option_pairs(pairs: tuple[str, ...], flag: str) -> dict[str, str]:
    """``("k=v", ...)`` → ``{"k": "v"}``; anything else is a usage error naming ``flag``."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} must look like key=value", param_hint=flag)
        out[key.strip()] = value.strip()
    return out


def check_device(device: str) -> None:
    """A usage error when CUDA is asked for and this torch has none."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise click.UsageError("--device cuda asked for, but this torch sees no CUDA GPU; "
                               "use --device cpu or install a CUDA build of torch 2.13.0")


def token_options(function: F) -> F:
    """``--token``/``--token-file`` (the victim's secret for Reveal) and ``--score-token`` /
    ``--score-token-file`` (the evaluator's, for Score when the victim requires it), handed to
    the command as ``tokens``, a :class:`TokenOptions`. Prefer the environment variables or the
    files: a token on the command line shows in ``ps``."""
    decorators = [
        click.option("--token", envvar=TOKEN_ENV, default=None,
                     help=f"The victim's token (guards Reveal); prefer ${TOKEN_ENV} or "
                          "--token-file, since `ps` shows command lines to every local user."),
        click.option("--token-file", type=click.Path(dir_okay=False, exists=True), default=None,
                     help="Read --token from this file (its first line)."),
        click.option("--score-token", envvar=SCORE_TOKEN_ENV, default=None,
                     help=f"The evaluator's token for Score (${SCORE_TOKEN_ENV})."),
        click.option("--score-token-file", type=click.Path(dir_okay=False, exists=True),
                     default=None, help="Read --score-token from this file (its first line)."),
    ]
    return packed(TokenOptions, "tokens", decorators)(function)


def _token(value: str | None, path: str | None, flag: str) -> str | None:
    if path is None:
        return value or None
    if value:
        raise click.UsageError(f"give {flag} or {flag}-file, not both")
    from pathlib import Path

    lines = Path(path).read_text().splitlines()
    token = lines[0].strip() if lines else ""
    if not token:
        raise click.UsageError(f"{flag}-file {path} is empty: put the token on its first line")
    return token


class LazyEpilog(click.Command):
    """A command whose epilog is computed when help is shown, not at import: the epilog of
    ``fedleak attack`` lists every attack's options, which needs torch, and ``fedleak --help``
    must not pay for that."""

    def __init__(self, *args: Any, epilog_factory: Callable[[], str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.epilog_factory = epilog_factory

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self.epilog = self.epilog_factory()
        super().format_epilog(ctx, formatter)
