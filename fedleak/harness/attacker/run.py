"""One entry point for an attack run, whatever the attack's threat model.

Each attack class names the threat model it attacks (``Attack.threat_model``: ``update``, the
server holds an :class:`~fedleak.attacks.Observation` of one round, or ``release``, it holds a
:class:`~fedleak.attacks.release.ReleasedModel`; ``fedleak.attacks.base.THREAT_MODELS``), and
:data:`RUNNERS` maps that name to the run that obtains the target from a victim over the wire.
A new threat model is a new row, not a new branch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fedleak.attacks import attack_class, attack_names
from fedleak.harness.attacker.attack_settings import AttackSettings
from fedleak.harness.attacker.client import VictimClient
from fedleak.harness.attacker.records import UpdateRun
from fedleak.harness.attacker.release.release_attack import run_release_attack
from fedleak.harness.attacker.release.release_records import ReleaseRun
from fedleak.harness.attacker.text.text_described import is_text_victim
from fedleak.harness.attacker.text.text_records import TextRun
from fedleak.harness.attacker.text.text_rounds import run_text_attack
from fedleak.harness.attacker.tokens import check_tokens
from fedleak.harness.attacker.update_attack import run_update_attack

#: Either kind of run.
RunRecord = UpdateRun | ReleaseRun | TextRun
Runner = Callable[[VictimClient, AttackSettings, Path, Callable[[str], None]], RunRecord]

#: threat model → the run that obtains its target from a victim and attacks it.
RUNNERS: dict[str, Runner] = {
    "update": run_update_attack,
    "release": run_release_attack,
    "text-update": run_text_attack,
}


def run_attack(
    client: VictimClient,
    settings: AttackSettings,
    out: Path,
    log: Callable[[str], None] = print,
) -> RunRecord:
    """Run ``settings.attack`` against the victim behind ``client``; write ``out``; return the
    typed record (``record.summary_lines(out)`` is what the CLI prints)."""
    threat_model = attack_class(settings.attack).threat_model
    if threat_model not in RUNNERS:
        raise ValueError(f"attack {settings.attack!r} has threat model {threat_model!r}, which "
                         f"no run obtains from a victim; runs exist for {', '.join(RUNNERS)}")
    described = client.describe()
    if is_text_victim(described) != (threat_model == "text-update"):
        held = "text" if is_text_victim(described) else "images"
        raise ValueError(f"attack {settings.attack!r} ({threat_model}) does not fit this victim, "
                         f"which holds {held}; text attacks: "
                         f"{', '.join(text_attack_names()) or 'none'}")
    warnings = check_tokens(client, described)
    for warning in warnings:
        log(f"warning: {warning}")
    record = RUNNERS[threat_model](client, settings, out, log)
    if warnings:
        record.warnings[:0] = warnings
        record.write(out)
    return record


def text_attack_names() -> list[str]:
    """The registered attacks on text victims (threat model ``text-update``)."""
    return [n for n in attack_names() if attack_class(n).threat_model == "text-update"]
