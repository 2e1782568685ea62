"""A sweep spec (TOML) and the grid of points it expands to.

A spec names the data set and the axes of the grid; every combination of attack × model ×
protocol × trained/untrained × defense setting is one :class:`Point`::

    [sweep]
    name = "quick"
    dataset = "digits"              # digits, faces, photos, or cifar10/... with data_root
    models = ["mlp:width=64,depth=1"]
    trained = [false]               # false: seeded init; true: the sweep trains a checkpoint;
                                    # "path.pt": that state dict
    rounds = 3                      # K: private batches attacked per point
    batch_size = 1                  # n: private images per batch
    seed = 0
    portfolio = false               # true: every point is attacked by each listed attack
                                    # applicable to it, at one budget; the report shows the
                                    # strongest per defense setting (worst case)

    [[sweep.attack]]                # one table per attack; other keys are its options
    name = "inverting-gradients"
    iterations = 500

    [[sweep.protocol]]              # optional; default FedSGD
    kind = "fedsgd"                 # or fedavg with local_epochs, local_batch_size, lr
    batchnorm = "eval"              # optional: BatchNorm on running statistics (default train)

    [sweep.resources]               # optional: what one point needs of a Ray node (--ray)
    num_cpus = 1
    num_gpus = 0                    # > 0: the point's attack runs on a GPU (device cuda)

    [sweep.utility]                 # federated training through the same defended path
    rounds = 150
    batch_size = 4
    lr = 0.5

    [[sweep.defense]]
    reference = true                # the no-defense point

    [[sweep.defense]]
    name = "dpsgd"
    param = "noise-multiplier"      # the swept parameter ...
    values = [0.03, 0.3, 1.0]       # ... and its values, weakest first
    params = { max-grad-norm = 1.0 }  # fixed parameters of this defense

    [[sweep.defense]]
    chain = ["clip:max-norm=1", "noise:sigma=0.01"]   # a fixed chain, one point
    label = "clip+noise"

    [[sweep.defense]]
    chain = ["secagg"]              # secure aggregation among users = K users, each with
    users = 4                       # batch_size images per round

    [sweep.audit]                   # optional: every point also plays the audit game
    trials = 2000                   # (docs/audit.md): ε lower bounds beside the claimed ε
    canary = "gradient"             # gradient, input or client (secagg points)
    threshold = "half-shift"        # split, half-shift or a number

Every name is checked against its registry (data sets, models, attacks, defenses) and every
option against the config it configures; an error names the table and lists the valid
choices. A point's ``point_id`` is a hash of the canonical JSON of everything that is measured,
so the same spec always yields the same ids and a results store can skip finished points.
"""

from __future__ import annotations

import itertools
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from importlib import resources as package_files
from pathlib import Path
from typing import Any

from fedleak.attacks.base import UpdateSetting
from fedleak.harness.federated.protocol import OPTION_FIELDS, Protocol, ProtocolError
from fedleak.harness.sweep.architecture import (
    ARCHITECTURE_KEY,
    server_architecture,
    split_architecture,
)
from fedleak.harness.sweep.points import (
    DefenseSetting,
    Point,
    PointResources,
    SpecError,
    UtilitySettings,
)
from fedleak.harness.zoo.models import ModelError

PRESETS_PACKAGE = "fedleak.harness.sweep"
PRESETS_FOLDER = "presets"
_TOP_KEYS = {"name", "dataset", "split", "data_root", "model", "models", "trained", "rounds",
             "resources",
             "batch_size", "images", "seed", "train_epochs", "attack", "protocol", "utility",
             "defense", "portfolio", "audit"}
_DEFENSE_KEYS = {"reference", "name", "param", "values", "params", "chain", "label", "users",
                 "protocol", "utility"}


@dataclass
class SweepSpec:
    """A parsed spec: the axes of the grid; :meth:`points` expands them."""

    name: str
    dataset: str
    split: str
    models: list[str]
    attacks: list[tuple[str, dict[str, Any]]]
    protocols: list[Protocol]
    trained: list[bool | str]
    defenses: list[DefenseSetting]
    rounds: int
    batch_size: int
    seed: int
    utility: UtilitySettings
    images: str | None = None
    data_root: str | None = None
    train_epochs: int = 20
    resources: PointResources = field(default_factory=PointResources)
    portfolio: bool = False
    audit: dict[str, Any] | None = None
    source: str = field(default="", repr=False)

    def points(self, victims: list[str] | tuple[str, ...] = ()) -> list[Point]:
        """The grid in a stable order, duplicates removed.

        With ``victims`` (addresses of victims the user runs), the points are attack × victim:
        model, data and defenses are whatever each victim runs (read from ``Describe``).
        """
        images = self.images or f"0-{self.rounds * self.batch_size - 1}"
        common: dict[str, Any] = dict(split=self.split, images=images, rounds=self.rounds,
                      batch_size=self.batch_size, seed=self.seed,
                      utility=asdict(self.utility), data_root=self.data_root,
                      train_epochs=self.train_epochs, audit=self.audit)
        out: dict[str, Point] = {}
        if victims:
            for attack, options in self.attacks:
                options, _ = split_architecture(options)
                for address in victims:
                    point = Point(attack=attack, attack_options=options, model="", dataset="",
                                  protocol=None, defenses=(), trained=False, victim=address,
                                  label=f"victim {address}", group=address, **common)
                    out.setdefault(point.point_id, point)
            return list(out.values())
        grid = itertools.product(self.attacks, self.models, self.protocols, self.trained,
                                 self.defenses)
        for (attack, options), model, grid_protocol, trained, d in grid:
            protocol = d.protocol or grid_protocol
            utility = {**common["utility"], **dict(d.utility)}
            pool = self.images or f"0-{self.rounds * self.batch_size * d.users - 1}"
            options, architecture = split_architecture(options)
            if architecture is not None:  # the user runs the server's architecture around it
                model = server_architecture(architecture, model)
            if self.portfolio and not applicable(attack, protocol, UpdateSetting(
                    protocol.update_kind(), protocol.local_steps(self.batch_size),
                    self.batch_size * d.users, tuple(c.split(":", 1)[0] for c in d.chain))):
                continue
            point = Point(attack=attack, attack_options=options, model=model,
                          dataset=self.dataset, protocol=protocol, defenses=d.chain,
                          trained=trained, label=d.label, group=d.group, param=d.param,
                          strength=d.strength, reference=d.reference, users=d.users,
                          **{**common, "images": pool, "utility": utility})
            out.setdefault(point.point_id, point)
        return list(out.values())


# --------------------------------------------------------------------------- loading


def preset_names() -> list[str]:
    """Names of the bundled presets (``fedleak sweep --preset NAME``)."""
    folder = package_files.files(PRESETS_PACKAGE).joinpath(PRESETS_FOLDER)
    if not folder.is_dir():
        raise SpecError("this installation lacks the bundled presets (fedleak/harness/sweep/"
                        "presets/*.toml must be installed as package data); pass a spec file")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def preset_text(name: str) -> str:
    """The TOML text of preset ``name``."""
    if name not in preset_names():
        raise SpecError(f"unknown preset {name!r}; choose one of {', '.join(preset_names())}")
    return package_files.files(PRESETS_PACKAGE).joinpath(PRESETS_FOLDER, f"{name}.toml").read_text()


def load_spec(path: str | Path, max_points: int | None = None) -> SweepSpec:
    """Read and expand-check the spec at ``path`` (a grid over ``max_points`` is refused)."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise SpecError(f"cannot read sweep spec {path}: {err}") from None
    return parse_spec(text, str(path), max_points)


def load_preset(name: str, max_points: int | None = None) -> SweepSpec:
    return parse_spec(preset_text(name), f"preset {name}", max_points)


#: The most points a grid may have unless ``--max-points`` raises it: every point starts its
#: own victims and attacks them, seconds to minutes each.
DEFAULT_MAX_POINTS = 10_000


def _count(value: Any, default: int = 1) -> int:
    return len(value) if isinstance(value, list) else default


def check_grid_size(sweep: dict[str, Any], max_points: int) -> None:
    """Refuse a grid of more than ``max_points`` points, counted from the spec's axes before
    any point is built (a million points took 110 s and 937 MB only to be listed)."""
    tables = sweep.get("defense", [])
    tables = tables if isinstance(tables, list) else [tables]
    defenses = max(1, sum(_count(table.get("values")) if isinstance(table, dict) else 1
                          for table in tables))
    models = sweep.get("models", sweep.get("model", ["lenet-zhu"]))
    axes = {"attacks": _count(sweep.get("attack", [{}])), "models": _count(models),
            "protocols": _count(sweep.get("protocol", [{}])),
            "trained settings": _count(sweep.get("trained", [False])),
            "defense settings": defenses}
    total = 1
    for size in axes.values():
        total *= size
    if total > max_points:
        shown = " × ".join(f"{size:,} {name}" for name, size in axes.items())
        raise SpecError(f"sweep: the grid has {total:,} points ({shown}), more than the "
                        f"{max_points:,} allowed; cut an axis, or pass --max-points {total} "
                        "if you mean to run them all (each point starts victims and attacks "
                        "them)")


def _run_name(name: str) -> str:
    """The sweep's name, which names its run folder ``runs/sweep-NAME``: one path component,
    so a spec cannot write outside ``runs/``."""
    if not name or name in (".", "..") or ".." in name or "/" in name or "\\" in name \
            or "\0" in name:
        raise SpecError(f"sweep.name {name[:64]!r} must be a plain name (letters, digits, '-', "
                        "'_', '.'; no '..' or path separator): it names the run folder "
                        "runs/sweep-NAME")
    return name


def parse_spec(text: str, source: str = "spec", max_points: int | None = None) -> SweepSpec:
    """Parse TOML ``text``; every name and option is validated against its registry, and a
    grid of more than ``max_points`` (default :data:`DEFAULT_MAX_POINTS`) is refused first."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{source}: not valid TOML: {err}") from None
    if set(data) != {"sweep"}:
        raise SpecError(f"{source}: put everything under a [sweep] table (found "
                        f"{', '.join(sorted(data)) or 'nothing'})")
    sweep = _keys(data["sweep"], "sweep")
    _no_unknown(sweep, _TOP_KEYS, "sweep")
    check_grid_size(sweep, DEFAULT_MAX_POINTS if max_points is None else max_points)
    name = _run_name(str(sweep.get("name", Path(source).stem or "sweep")))
    dataset = _dataset(sweep.get("dataset", "digits"))
    split = str(sweep.get("split", "train"))
    if split not in ("train", "test", "all"):
        raise SpecError(f"sweep.split must be train, test or all, got {split!r}")
    rounds = _positive_int(sweep.get("rounds", 1), "sweep.rounds")
    batch_size = _positive_int(sweep.get("batch_size", 1), "sweep.batch_size")
    defenses = _defenses(sweep.get("defense", []))
    if not defenses:
        raise SpecError("sweep: list at least one [[sweep.defense]] (reference = true for the "
                        "no-defense point)")
    audit = _audit(sweep["audit"], defenses) if "audit" in sweep else None
    return SweepSpec(
        name=name,
        dataset=dataset,
        split=split,
        models=_models(sweep),
        attacks=_attacks(sweep.get("attack", [{"name": "inverting-gradients"}])),
        protocols=_protocols(sweep.get("protocol", [{}]), batch_size),
        trained=_trained(sweep.get("trained", [False])),
        defenses=defenses,
        rounds=rounds,
        batch_size=batch_size,
        seed=int(sweep.get("seed", 0)),
        utility=_utility(sweep.get("utility", {})),
        images=str(sweep["images"]) if "images" in sweep else None,
        data_root=str(sweep["data_root"]) if sweep.get("data_root") else None,
        train_epochs=_positive_int(sweep.get("train_epochs", 20), "sweep.train_epochs"),
        resources=_resources(sweep.get("resources", {})),
        portfolio=_portfolio(sweep),
        audit=audit,
        source=text,
    )


def applicable(attack: str, protocol: Protocol, setting: UpdateSetting | None = None) -> bool:
    """Whether ``attack`` can attack a victim speaking ``protocol``: an attack on updates
    whose accepted update kinds (``update_kinds`` of its class, default any) include the
    protocol's (``fedavg`` inverts FedAvg deltas only), and — given the point's ``setting`` —
    that does not know itself unsuited to it (``Attack.unsuited``: spear on a noisy update or a
    64-image sum)."""
    from fedleak.attacks import attack_class

    cls = attack_class(attack)
    kinds = getattr(cls, "update_kinds", None)
    if cls.threat_model != "update" or not (kinds is None or protocol.update_kind() in kinds):
        return False
    return setting is None or cls.unsuited(setting) is None


def _portfolio(sweep: dict[str, Any]) -> bool:
    """``portfolio``, checked: a boolean; with it on, every protocol has an applicable attack
    and the attacks share one budget (:meth:`~fedleak.attacks.base.Attack.budget`: objective
    evaluations, where they have one)."""
    value = sweep.get("portfolio", False)
    if not isinstance(value, bool):
        raise SpecError(f"sweep.portfolio must be true or false, got {value!r}")
    if not value:
        return False
    from fedleak.attacks import create_attack

    attacks = _attacks(sweep.get("attack", [{"name": "inverting-gradients"}]))
    for protocol in _protocols(sweep.get("protocol", [{}])):
        if not any(applicable(name, protocol) for name, _ in attacks):
            raise SpecError(f"sweep.portfolio: no listed attack can attack a {protocol.kind} "
                            "victim's updates; add one (inverting-gradients attacks both)")
    budgets = {name + str(options): create_attack(name, split_architecture(options)[0]).budget()
               for name, options in attacks}
    known = {b for b in budgets.values() if b is not None}
    if len(known) > 1:
        listed = ", ".join(f"{k.split('{')[0]}: {v}" for k, v in budgets.items()
                           if v is not None)
        raise SpecError(f"sweep.portfolio: the attacks must share one budget of objective "
                        f"evaluations (iterations × restarts, × inner for L-BFGS), but theirs "
                        f"differ ({listed}); give every [[sweep.attack]] the same (L-BFGS: "
                        "iterations = the others' / inner)")
    return True


# --------------------------------------------------------------------------- axes


def _keys(table: Any, where: str) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise SpecError(f"{where} must be a table")
    return {k.replace("-", "_"): v for k, v in table.items()}


def _no_unknown(table: dict[str, Any], valid: set[str], where: str) -> None:
    unknown = sorted(set(table) - valid)
    if unknown:
        raise SpecError(f"{where}: unknown key(s) {', '.join(unknown)}; valid: "
                        f"{', '.join(sorted(valid))}")


def _tables(value: Any, where: str) -> list[dict[str, Any]]:
    items = value if isinstance(value, list) else [value]
    return [_keys(item, f"{where}[{i}]") for i, item in enumerate(items)]


def _positive_int(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpecError(f"{where} must be an integer >= 1, got {value!r}")
    return value


def _dataset(name: Any) -> str:
    from fedleak.harness.zoo.datasets import DATASET_NAMES

    if name not in DATASET_NAMES:
        raise SpecError(f"sweep.dataset: unknown data set {name!r}; choose one of "
                        f"{', '.join(DATASET_NAMES)}")
    return str(name)


def _models(sweep: dict[str, Any]) -> list[str]:
    from fedleak.harness.zoo.models import ModelSpec, model_names

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
        if spec.name not in model_names():
            raise SpecError(f"sweep.models: unknown model {spec.name!r}; choose one of "
                            f"{', '.join(model_names())}")
        out.append(str(spec))
    if not out:
        raise SpecError("sweep.models: list at least one model")
    return out


def _attacks(value: Any) -> list[tuple[str, dict[str, Any]]]:
    from fedleak.attacks import AttackConfigError, create_attack

    out = []
    for i, table in enumerate(_tables(value, "sweep.attack")):
        where = f"sweep.attack[{i}]"
        if "name" not in table:
            raise SpecError(f"{where}: give the attack's name")
        name = str(table.pop("name"))
        options = {**_keys(table.pop("options", {}), f"{where}.options"), **table}
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
              "calibration": "calibration_fraction", "threshold": "threshold"}


def _audit(value: Any, defenses: list[DefenseSetting]) -> dict[str, Any]:
    """``[sweep.audit]`` as ``AuditSettings`` fields, checked as the victim will check them."""
    from fedleak.harness.victim.audit import AuditRequest
    from fedleak.harness.wire.request_errors import InvalidArgument

    table = _keys(value, "sweep.audit")
    _no_unknown(table, set(AUDIT_KEYS), "sweep.audit")
    out = {AUDIT_KEYS[k]: v for k, v in table.items() if k != "threshold"}
    threshold = table.get("threshold", "split")
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


def _protocols(value: Any, batch_size: int | None = None) -> list[Protocol]:
    """The ``[[sweep.protocol]]`` tables; a shuffled FedAvg whose order matters for the
    sweep's ``batch_size`` is refused: no replay matches it exactly, and a sweep's figures are
    headline figures (:mod:`~fedleak.harness.federated.replay_fidelity`)."""
    out = []
    for i, table in enumerate(_tables(value, "sweep.protocol")):
        where = f"sweep.protocol[{i}]"
        _no_unknown(table, set(OPTION_FIELDS), where)
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


def _trained(value: Any) -> list[bool | str]:
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


def _resources(value: Any) -> PointResources:
    table = _keys(value, "sweep.resources")
    _no_unknown(table, {"num_cpus", "num_gpus"}, "sweep.resources")
    return PointResources(**table)


def _utility(value: Any) -> UtilitySettings:
    table = _keys(value, "sweep.utility")
    valid = {f.name for f in fields(UtilitySettings)}
    _no_unknown(table, valid, "sweep.utility")
    try:
        return UtilitySettings(**table)
    except TypeError as err:
        raise SpecError(f"sweep.utility: {err}") from None


def _defenses(value: Any) -> list[DefenseSetting]:
    out: list[DefenseSetting] = []
    for i, table in enumerate(_tables(value, "sweep.defense")):
        where = f"sweep.defense[{i}]"
        _no_unknown(table, _DEFENSE_KEYS, where)
        deployment = _deployment(table, where)
        if table.get("reference"):
            if set(table) - {"reference", "label"}:
                raise SpecError(f"{where}: a reference table takes no other keys than label")
            out.append(replace(DefenseSetting((), str(table.get("label", "no defense")), "none",
                                              strength=0.0, reference=True), **deployment))
        elif "chain" in table:
            out.append(replace(_fixed_chain(table, where), **deployment))
        elif "name" in table:
            out.extend(replace(d, **deployment) for d in _swept(table, where))
        else:
            raise SpecError(f"{where}: give reference = true, a name (with param and values), "
                            "or a chain")
    return out


def _deployment(table: dict[str, Any], where: str) -> dict[str, Any]:
    """A defense table's own ``protocol`` (replacing the grid's for its points) and ``utility``
    (overriding [sweep.utility] fields), popped from ``table`` and checked."""
    out: dict[str, Any] = {}
    if "protocol" in table:
        (out["protocol"],) = _protocols([table.pop("protocol")])
    if "utility" in table:
        overrides = _keys(table.pop("utility"), f"{where}.utility")
        _no_unknown(overrides, {f.name for f in fields(UtilitySettings)}, f"{where}.utility")
        try:
            UtilitySettings(**overrides)
        except TypeError as err:
            raise SpecError(f"{where}.utility: {err}") from None
        out["utility"] = tuple(sorted(overrides.items()))
    return out


def _fixed_chain(table: dict[str, Any], where: str) -> DefenseSetting:
    if set(table) - {"chain", "label", "users"}:
        raise SpecError(f"{where}: a chain table takes only chain, label and users")
    specs = [str(s) for s in (table["chain"] if isinstance(table["chain"], list)
                              else [table["chain"]])]
    chain = tuple(_canonical(*_parse(s, where)) for s in specs)
    users = _users(table, where)
    _check_chain(chain, where, users)
    label = str(table.get("label", " + ".join(chain) or "no defense"))
    return DefenseSetting(chain, label, label, reference=not chain,
                          strength=0.0 if not chain else None, users=users)


def _users(table: dict[str, Any], where: str) -> int:
    """``users`` of a defense table: how many users a secure-aggregation chain sums (>= 2)."""
    users = table.get("users", 1)
    if isinstance(users, bool) or not isinstance(users, int) or users < 1:
        raise SpecError(f"{where}: users must be a whole number >= 1, got {users!r}")
    return users


def _swept(table: dict[str, Any], where: str) -> list[DefenseSetting]:
    name = str(table["name"])
    fixed = _keys(table.get("params", {}), f"{where}.params")
    param = table.get("param")
    values = table.get("values")
    if (param is None) != (values is None):
        raise SpecError(f"{where}: give param and values together")
    users = _users(table, where)
    if param is None:
        chain = (_canonical(name, fixed),)
        _check_chain(chain, where, users)
        return [DefenseSetting(chain, str(table.get("label", chain[0])), name, users=users)]
    if not isinstance(values, list) or not values:
        raise SpecError(f"{where}: values must be a non-empty list")
    param = str(param).replace("_", "-")
    group = str(table.get("label", name))
    out = []
    for index, value in enumerate(values):
        chain = (_canonical(name, {**fixed, param: value}),)
        _check_chain(chain, where, users)
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        strength = float(value) if numeric else float(index + 1)
        out.append(DefenseSetting(chain, f"{name} {param}={_format(value)}", group, param,
                                  strength, users=users))
    return out


def _parse(text: str, where: str) -> tuple[str, dict[str, Any]]:
    from fedleak.defenses import DefenseConfigError, parse_defense_spec

    try:
        return parse_defense_spec(text)
    except DefenseConfigError as err:
        raise SpecError(f"{where}: {err}") from None


def _canonical(name: str, params: dict[str, Any]) -> str:
    """``name:key=value,...`` with keys in hyphen form, sorted."""
    items = sorted((k.replace("_", "-"), _format(v)) for k, v in params.items())
    return name + (":" + ",".join(f"{k}={v}" for k, v in items) if items else "")


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _check_chain(chain: tuple[str, ...], where: str, users: int = 1) -> None:
    """Build the chain as the victim will: unknown names, keys or values fail here; secure
    aggregation needs ``users >= 2`` (and only it uses them)."""
    from fedleak.defenses import DefenseConfigError, build_chain, parse_defense_spec

    try:
        built = build_chain([parse_defense_spec(s) for s in chain])
    except DefenseConfigError as err:
        raise SpecError(f"{where}: {err}") from None
    transport = built.transport
    if transport is not None and users < 2:
        raise SpecError(f"{where}: {transport.name} aggregates several users' updates; give the "
                        "table users = K (K >= 2 users, each with batch_size images per round)")
    if transport is None and users != 1:
        raise SpecError(f"{where}: users = {users} needs a secure-aggregation defense (secagg) "
                        "in the chain; a single user's victim has one user")
    if transport is not None:
        try:
            transport.threshold(users)
        except ValueError as err:
            raise SpecError(f"{where}: {err}") from None
