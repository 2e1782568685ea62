"""A sweep spec (TOML) and the grid of points it expands to.

A spec names the data set and the axes of the grid; every combination of attack × model ×
protocol × trained/untrained × defense setting is one :class:`Point`::

    [sweep]
    name = "quick"
    description = "..."             # optional: one line (``fedleak sweep --help`` lists it)
    dataset = "digits"              # digits, faces, photos, or cifar10/... with data_root
    models = ["mlp:width=64,depth=1"]
    trained = [false]               # false: seeded init; true: the sweep trains a checkpoint;
                                    # "path.pt": that state dict
    rounds = 3                      # K: private batches attacked per point
    batch_size = 1                  # n: private images per batch
    seed = 0
    seq_len = 32                    # text data sets only: tokens per sequence
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

This module reads the ``[sweep]`` table and expands the grid; each axis is parsed in
:mod:`~fedleak.harness.sweep.grid.axes`, the ``[[sweep.defense]]`` tables in
:mod:`~fedleak.harness.sweep.grid.defense_axis`.
"""

from __future__ import annotations

import itertools
import tomllib
from dataclasses import asdict, dataclass, field
from importlib import resources as package_files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from fedleak.attacks.base import UpdateSetting
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.sweep.grid.architecture import server_architecture, split_architecture
from fedleak.harness.sweep.grid.axes import (
    no_unknown_keys,
    parse_attacks,
    parse_audit,
    parse_dataset,
    parse_models,
    parse_protocols,
    parse_resources,
    parse_trained,
    parse_utility,
    positive_int,
    table_keys,
)
from fedleak.harness.sweep.grid.defense_axis import parse_defenses
from fedleak.harness.sweep.grid.points import (
    DefenseSetting,
    Point,
    PointResources,
    SpecError,
    UtilitySettings,
)

PRESETS_PACKAGE = "fedleak.harness.sweep"
PRESETS_FOLDER = "presets"
_TOP_KEYS = {"name", "dataset", "split", "data_root", "model", "models", "trained", "rounds",
             "resources",
             "batch_size", "images", "seed", "train_epochs", "attack", "protocol", "utility",
             "defense", "portfolio", "audit", "seq_len", "description"}


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
    seq_len: int | None = None
    description: str = ""
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
                      train_epochs=self.train_epochs, audit=self.audit, seq_len=self.seq_len)
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


def preset_folder() -> Traversable:
    """The bundled presets' folder (``fedleak/harness/sweep/presets``, package data)."""
    return package_files.files(PRESETS_PACKAGE).joinpath(PRESETS_FOLDER)


def preset_names() -> list[str]:
    """Names of the bundled presets (``fedleak sweep --preset NAME``): the folder's tomls."""
    folder = preset_folder()
    if not folder.is_dir():
        raise SpecError("this installation lacks the bundled presets (fedleak/harness/sweep/"
                        "presets/*.toml must be installed as package data); pass a spec file")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def preset_descriptions() -> dict[str, str]:
    """Each bundled preset's one-line ``description`` (its ``[sweep]`` table's; '' without
    one), by name: what ``fedleak sweep --help`` lists."""
    out = {}
    for name in preset_names():
        try:
            sweep = tomllib.loads(preset_text(name)).get("sweep", {})
        except tomllib.TOMLDecodeError:
            sweep = {}
        out[name] = " ".join(str(sweep.get("description", "")).split())
    return out


def preset_text(name: str) -> str:
    """The TOML text of preset ``name``."""
    if name not in preset_names():
        raise SpecError(f"unknown preset {name!r}; choose one of {', '.join(preset_names())}")
    return preset_folder().joinpath(f"{name}.toml").read_text()


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
    sweep = table_keys(data["sweep"], "sweep")
    no_unknown_keys(sweep, _TOP_KEYS, "sweep")
    check_grid_size(sweep, DEFAULT_MAX_POINTS if max_points is None else max_points)
    name = _run_name(str(sweep.get("name", Path(source).stem or "sweep")))
    dataset = parse_dataset(sweep.get("dataset", "digits"))
    split = str(sweep.get("split", "train"))
    if split not in ("train", "test", "all"):
        raise SpecError(f"sweep.split must be train, test or all, got {split!r}")
    rounds = positive_int(sweep.get("rounds", 1), "sweep.rounds")
    batch_size = positive_int(sweep.get("batch_size", 1), "sweep.batch_size")
    defenses = parse_defenses(sweep.get("defense", []))
    if not defenses:
        raise SpecError("sweep: list at least one [[sweep.defense]] (reference = true for the "
                        "no-defense point)")
    audit = parse_audit(sweep["audit"], defenses) if "audit" in sweep else None
    attacks = parse_attacks(sweep.get("attack", [{"name": "inverting-gradients"}]))
    misfits = [name for name, _ in attacks if not fits_data(name, dataset)]
    if misfits:
        raise SpecError(f"sweep.attack: {', '.join(misfits)} cannot attack {dataset} (text "
                        "attacks such as token-set and dager attack text data sets; the others "
                        "images)")
    return SweepSpec(
        name=name,
        dataset=dataset,
        split=split,
        models=parse_models(sweep),
        attacks=attacks,
        protocols=parse_protocols(sweep.get("protocol", [{}]), batch_size),
        trained=parse_trained(sweep.get("trained", [False])),
        defenses=defenses,
        rounds=rounds,
        batch_size=batch_size,
        seed=int(sweep.get("seed", 0)),
        utility=parse_utility(sweep.get("utility", {})),
        images=str(sweep["images"]) if "images" in sweep else None,
        data_root=str(sweep["data_root"]) if sweep.get("data_root") else None,
        train_epochs=positive_int(sweep.get("train_epochs", 20), "sweep.train_epochs"),
        resources=parse_resources(sweep.get("resources", {})),
        portfolio=_portfolio(sweep),
        audit=audit,
        seq_len=positive_int(sweep["seq_len"], "sweep.seq_len") if "seq_len" in sweep else None,
        description=" ".join(str(sweep.get("description", "")).split()),
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
    if cls.threat_model not in ("update", "text-update") or not (
            kinds is None or protocol.update_kind() in kinds):
        return False
    return setting is None or cls.unsuited(setting) is None


def fits_data(attack: str, dataset: str) -> bool:
    """Whether ``attack`` attacks the kind of data ``dataset`` holds: text attacks
    (threat model ``text-update``) text corpora, the others images."""
    from fedleak.attacks import attack_class
    from fedleak.harness.zoo.text.corpus import TEXT_CORPORA

    return (attack_class(attack).threat_model == "text-update") == (dataset in TEXT_CORPORA)


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

    attacks = parse_attacks(sweep.get("attack", [{"name": "inverting-gradients"}]))
    dataset = str(sweep.get("dataset", "digits"))
    for protocol in parse_protocols(sweep.get("protocol", [{}])):
        if not any(applicable(name, protocol) and fits_data(name, dataset)
                   for name, _ in attacks):
            raise SpecError(f"sweep.portfolio: no listed attack can attack a {protocol.kind} "
                            f"victim's updates of {dataset}; add one (inverting-gradients "
                            "attacks both kinds of image update, token-set any text update)")
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
