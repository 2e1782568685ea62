"""The axes of a sweep spec's ``[sweep]`` table, each parsed and checked against its registry:
data set, models, attacks, protocols, trained settings, resources, utility and the audit.

Each parser names the table it reads in its errors (:class:`~fedleak.harness.sweep.grid.points.
SpecError`) and lists the valid choices; :func:`~fedleak.harness.sweep.grid.spec.parse_spec` calls
them. The ``[[sweep.defense]]`` tables have their own module
(:mod:`~fedleak.harness.sweep.grid.defense_axis`).
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from fedleak.harness.federated.protocol import OPTION_FIELDS, Protocol, ProtocolError
from fedleak.harness.sweep.grid.architecture import (
    ARCHITECTURE_KEY,
    server_architecture,
    split_architecture,
)
from fedleak.harness.sweep.grid.points import (
    DefenseSetting,
    PointResources,
    SpecError,
    UtilitySettings,
)
from fedleak.harness.zoo.models import ModelError


def table_keys(table: Any, where: str) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise SpecError(f"{where} must be a table")
    return {k.replace("-", "_"): v for k, v in table.items()}


def no_unknown_keys(table: dict[str, Any], valid: set[str], where: str) -> None:
    unknown = sorted(set(table) - valid)
    if unknown:
        raise SpecError(f"{where}: unknown key(s) {', '.join(unknown)}; valid: "
                        f"{', '.join(sorted(valid))}")


def table_list(value: Any, where: str) -> list[dict[str, Any]]:
    items = value if isinstance(value, list) else [value]
    return [table_keys(item, f"{where}[{i}]") for i, item in enumerate(items)]


def positive_int(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpecError(f"{where} must be an integer >= 1, got {value!r}")
    return value


def parse_dataset(name: Any) -> str:
    from fedleak.harness.zoo.datasets import DATASET_NAMES
    from fedleak.harness.zoo.text.corpus import TEXT_CORPORA

    if name not in DATASET_NAMES + TEXT_CORPORA:
        raise SpecError(f"sweep.dataset: unknown data set {name!r}; choose one of "
                        f"{', '.join(DATASET_NAMES + TEXT_CORPORA)}")
    return str(name)


def parse_models(sweep: dict[str, Any]) -> list[str]:
    from fedleak.harness.zoo.models import ModelSpec, model_names
    from fedleak.harness.zoo.text.text_models import TEXT_MODELS

    if "model" in sweep and "models" in sweep:
        raise SpecError("sweep: give model or models, not both")
    raw = sweep.get("models", sweep.get("model", ["lenet-zhu"]))
    names = [raw] if isinstance(raw, str) else list(raw)
    out = []
    for text in names:
        try:
            spec = ModelSpec.parse(str(text))
        except ValueError as err:
            raise SpecError(f"sweep.models: {err}") from None
        if spec.name not in model_names() + TEXT_MODELS:
            raise SpecError(f"sweep.models: unknown model {spec.name!r}; choose one of "
                            f"{', '.join(model_names() + TEXT_MODELS)}")
        out.append(str(spec))
    if not out:
        raise SpecError("sweep.models: list at least one model")
    return out


def parse_attacks(value: Any) -> list[tuple[str, dict[str, Any]]]:
    from fedleak.attacks import AttackConfigError, create_attack

    out = []
    for i, table in enumerate(table_list(value, "sweep.attack")):
        where = f"sweep.attack[{i}]"
        if "name" not in table:
            raise SpecError(f"{where}: give the attack's name")
        name = str(table.pop("name"))
        options = {**table_keys(table.pop("options", {}), f"{where}.options"), **table}
        options = {k.replace("_", "-"): v for k, v in sorted(options.items())}
        own, architecture = split_architecture(options)
        try:
            create_attack(name, own)
            if architecture is not None:
                server_architecture(architecture, "mlp")
        except (AttackConfigError, ModelError) as err:
            raise SpecError(f"{where}: {err}") from None
        out.append((name, own if architecture is None
                    else {**own, ARCHITECTURE_KEY: architecture}))
    return out




#: ``[sweep.audit]`` keys → the attacker's ``AuditSettings`` fields.
AUDIT_KEYS = {"trials": "trials", "canary": "canary", "direction": "direction", "seed": "seed",
              "norm": "norm", "delta": "delta", "confidence": "confidence",
              "calibration": "calibration_fraction", "threshold": "threshold",
              "detect_shortfall": "detect_shortfall", "power": "power",
              "false_alarm": "false_alarm", "coverage": "coverage"}


def parse_audit(value: Any, defenses: list[DefenseSetting]) -> dict[str, Any]:
    """``[sweep.audit]`` as ``AuditSettings`` fields, checked as the victim will check them."""
    from fedleak.harness.victim.audit.request import AuditRequest
    from fedleak.harness.wire.request_errors import InvalidArgument

    table = table_keys(value, "sweep.audit")
    no_unknown_keys(table, set(AUDIT_KEYS), "sweep.audit")
    out = {AUDIT_KEYS[k]: v for k, v in table.items() if k != "threshold"}
    threshold = table.get("threshold", "half-shift")
    if isinstance(threshold, str) and threshold in ("split", "half-shift"):
        out["threshold_rule"] = threshold
    elif isinstance(threshold, int | float) and not isinstance(threshold, bool):
        out.update(threshold_rule="declared", threshold=float(threshold))
    else:
        raise SpecError(f"sweep.audit.threshold must be split, half-shift or a number, got "
                        f"{threshold!r}")
    out.setdefault("trials", 2000)
    try:
        AuditRequest(**{k: v for k, v in out.items() if k != "calibration_fraction"},
                     calibration_fraction=out.get("calibration_fraction", 0.2)).checked(
            max_trials=10**9, secagg=True)
    except (InvalidArgument, TypeError) as err:
        raise SpecError(f"sweep.audit: {err}") from None
    if out.get("canary") == "client" and any(d.users < 2 for d in defenses):
        raise SpecError("sweep.audit: a canary client is an extra user of a secure-aggregation "
                        "round, but some [[sweep.defense]] tables have one user; use canary "
                        "gradient, or give every table users >= 2 and secagg")
    return out


def parse_protocols(value: Any, batch_size: int | None = None) -> list[Protocol]:
    """The ``[[sweep.protocol]]`` tables; a shuffled FedAvg whose order matters for the
    sweep's ``batch_size`` is refused: no replay matches it exactly, and a sweep's figures are
    headline figures (:mod:`~fedleak.harness.federated.replay_fidelity`)."""
    out = []
    for i, table in enumerate(table_list(value, "sweep.protocol")):
        where = f"sweep.protocol[{i}]"
        no_unknown_keys(table, set(OPTION_FIELDS), where)
        try:
            protocol = Protocol.from_options(table)
        except ProtocolError as err:
            raise SpecError(f"{where}: {err}") from None
        if batch_size is not None and protocol.order_matters(batch_size):
            raise SpecError(f"{where}: shuffle_batches = true with "
                            f"{protocol.batches_per_epoch(batch_size)}"
                            f" mini-batches per epoch: the user's order is unknown to the "
                            "server, so no replay is exact and the figures would be lower "
                            "bounds; set shuffle_batches = false, or local_batch_size = 0 (one "
                            "batch per epoch, where the order does not matter)")
        out.append(protocol)
    return out


def parse_trained(value: Any) -> list[bool | str]:
    items = value if isinstance(value, list) else [value]
    out: list[bool | str] = []
    for item in items:
        if isinstance(item, bool):
            out.append(item)
        elif isinstance(item, str) and Path(item).is_file():
            out.append(str(Path(item).resolve()))
        else:
            raise SpecError(f"sweep.trained: {item!r} is neither true/false nor an existing "
                            "checkpoint file")
    return out


def parse_resources(value: Any) -> PointResources:
    table = table_keys(value, "sweep.resources")
    no_unknown_keys(table, {"num_cpus", "num_gpus"}, "sweep.resources")
    return PointResources(**table)


def parse_utility(value: Any) -> UtilitySettings:
    table = table_keys(value, "sweep.utility")
    valid = {f.name for f in fields(UtilitySettings)}
    no_unknown_keys(table, valid, "sweep.utility")
    try:
        return UtilitySettings(**table)
    except TypeError as err:
        raise SpecError(f"sweep.utility: {err}") from None
