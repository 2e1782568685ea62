"""What ``fedleak victim serve`` derives for serving from its options: the score token a
reachable victim requires, the limits on what clients may hold (:class:`~fedleak.harness.wire.
admission.ServingLimits`), and the warnings a person starting an unsafe victim must read."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

import click

from fedleak.harness.cli.victim.game_options import DEFAULT_IMAGE_BUDGET
from fedleak.harness.cli.victim.serving_options import WireLimitOptions

if TYPE_CHECKING:  # the CLI starts without importing the victim
    from fedleak.harness.victim.federated_victim import Victim
    from fedleak.harness.wire.admission import ServingLimits


def required_score_token(host: str, given: str | None, open_score: bool) \
        -> tuple[str | None, bool]:
    """The score token Score will require, and whether it was made up here. Round ids are
    bearer tokens: on a host other machines can reach, Score needs the evaluator's token unless
    ``--open-score`` says otherwise, and one is made up when none was given."""
    from fedleak.harness.wire.serving import is_loopback

    if given or open_score or is_loopback(host):
        return given, False
    return secrets.token_hex(16), True


def serving_limits(v: Victim, wire: WireLimitOptions) -> ServingLimits:
    """What clients may hold of this victim, from the wire-limit options (a bad combination is
    a usage error naming the options)."""
    from fedleak.harness.victim.server import default_message_bytes
    from fedleak.harness.wire.admission import ServingLimits

    message = wire.max_message_mb << 20 if wire.max_message_mb else default_message_bytes(v)
    memory = wire.request_memory_mb << 20 if wire.request_memory_mb else None
    try:
        return ServingLimits(max_message_bytes=message, request_memory_bytes=memory,
                             max_calls_per_peer=wire.max_calls_per_peer,
                             max_connections_per_peer=wire.max_connections_per_peer,
                             max_calls_per_prefix=wire.max_calls_per_prefix,
                             max_connections_per_prefix=wire.max_connections_per_prefix,
                             receive_timeout=wire.receive_timeout)
    except ValueError as err:
        raise click.UsageError(str(err)) from None


def start_warnings(v: Victim) -> list[str]:
    """What a person starting this victim must read: unsafe settings they chose."""
    from fedleak.harness.victim.limits import UNSAFE_BUDGET_WARNING, UNSAFE_IMAGE_BUDGET_WARNING

    warnings = []
    budget = v.config.limits.score_budget
    if budget > 1:
        warnings.append(UNSAFE_BUDGET_WARNING.format(budget=budget))
    image_budget = v.config.limits.image_score_budget
    if image_budget > DEFAULT_IMAGE_BUDGET:
        warnings.append(UNSAFE_IMAGE_BUDGET_WARNING.format(budget=image_budget))
    transport = v.config.defenses.transport
    if transport is not None:
        minority = transport.minority_warning(v.config.num_users)
        if minority:
            warnings.append(minority)
    for check in v.config.defenses.parameter_checks:
        reason = check.refuses_model(v.model)
        if reason:
            warnings.append("warning: this victim will refuse every round "
                            f"(FAILED_PRECONDITION), whatever θ a server sends: {reason}")
    return warnings
