"""A whole audited Flower federation: the ServerApp, the ClientApp, and Flower's simulation.

One :class:`FederationSettings` says everything: how many nodes and rounds, the data set (each
node holds the images ``partition-id::num-partitions`` of its training split and trains on the
next ``images`` of them each round), the model, the clients' procedure, their defenses
(update defenses as :class:`~fedleak.harness.flower.node.mods.DefenseMod`, DP-SGD in
:func:`~fedleak.harness.flower.node.train.train`), and the audit (attack, options, seed, record
only), and whether the nodes mask their updates with Flower's SecAgg+ (the server then holds
only their aggregate, and the audit attacks that:
:mod:`~fedleak.harness.flower.secagg.aggregate_audit`). ``fedleak flower simulate`` builds it from
its options and runs :func:`simulate` (Flower's simulation engine); for a real SuperLink and
SuperNodes, ``flwr run`` loads
:data:`server_app` and :data:`client_app`, which read the same settings from the run config
(``[tool.flwr.app.config]``, keys as in :meth:`FederationSettings.from_run_config`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable
from flwr.server import ServerConfig
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.server.workflow import DefaultWorkflow
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fedleak.defenses.chain import build_chain, parse_defense_spec
from fedleak.harness.attacker.records import METRICS_NAME
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.flower.audit_end import ended_by
from fedleak.harness.flower.audit_worker import DEFAULT_QUEUE
from fedleak.harness.flower.auditor import Auditor
from fedleak.harness.flower.leakage_audit import LeakageAudit
from fedleak.harness.flower.node.mods import DefenseMod
from fedleak.harness.flower.node.node_scoring import SCORE_ACTION, score_reply
from fedleak.harness.flower.node.train import ParametersRefused, train
from fedleak.harness.flower.procedure import LocalProcedure
from fedleak.harness.flower.secagg.aggregate_audit import AggregateAudit
from fedleak.harness.flower.secagg.legacy import LegacyLayout, parameters_of
from fedleak.harness.flower.secagg.secaggplus_settings import SecAggPlus
from fedleak.harness.zoo.datasets import ImageDataset, load_dataset
from fedleak.harness.zoo.models import build_model

#: Flower error code of a train message a node's parameter check (vet) refused
VET_ERROR = 122
#: run-config keys that are lists, written as one space-separated string
LIST_KEYS = ("defenses", "options", "probe")
#: settings that are no run-config key (the nodes' operators decide reveal)
NOT_RUN_CONFIG = ("extra_config", "allow_reveal")


@dataclass(frozen=True)
class FederationSettings:
    """An audited federation (module doc); every field has a run-config key (``-`` for ``_``)."""

    nodes: int = 2
    rounds: int = 1
    dataset: str = "digits"
    model: str = "lenet-zhu"
    images: int = 1
    protocol: str = "fedsgd"
    local_epochs: int = 1
    local_batch_size: int = 0
    lr: float = 1e-4
    batchnorm: str = "train"
    momentum: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    shuffle: bool = False
    defenses: tuple[str, ...] = ()
    dp: str = ""
    attack: str = "inverting-gradients"
    options: tuple[str, ...] = ()
    seed: int = 0
    model_seed: int = 0
    out: str = "runs/flower"
    audit: bool = True
    record_only: bool = False
    score: bool = True
    threads: int = 1
    secagg_plus: bool = False
    secagg_shares: int = 0
    secagg_threshold: int = 0
    secagg_max_weight: float = 0.0
    secagg_clipping_range: float = SecAggPlus.clipping_range
    secagg_quantization_range: int = SecAggPlus.quantization_range
    #: the audit's queue bound (updates waiting in its worker), see AuditOptions
    queue: int = DEFAULT_QUEUE
    #: attack in the round instead of in the niced worker after it (see AuditOptions)
    inline: bool = False
    #: replace a run already in ``out`` (else it is refused)
    overwrite: bool = False
    #: malicious-server probe attacks after the federation (trap-weights, fishing), see
    #: :mod:`~fedleak.harness.flower.probe`
    probe: tuple[str, ...] = ()
    #: simulation only: the simulated nodes' operator lets them reveal their batch for the
    #: comparison pictures (on a real SuperNode its operator sets fedleak-allow-reveal in its
    #: --node-config; a run config cannot)
    allow_reveal: bool = False
    extra_config: dict[str, Any] = field(default_factory=dict)

    def procedure(self) -> LocalProcedure:
        """The clients' procedure, as the train config states it."""
        return LocalProcedure(Protocol.from_options({
            "kind": self.protocol, "local_epochs": self.local_epochs,
            "local_batch_size": self.local_batch_size, "lr": self.lr,
            "batchnorm": self.batchnorm, "momentum": float(self.momentum),
            "weight_decay": float(self.weight_decay), "nesterov": self.nesterov,
            "shuffle_batches": self.shuffle}))

    def secagg(self) -> SecAggPlus:
        """The SecAgg+ settings (max weight 0: the nodes' batch size, the finest quantisation
        SecAgg+ allows for their weights)."""
        return SecAggPlus(int(self.secagg_shares), int(self.secagg_threshold),
                          float(self.secagg_max_weight or self.images),
                          float(self.secagg_clipping_range), int(self.secagg_quantization_range))

    def attack_options(self) -> dict[str, str]:
        """``options`` (``key=value`` each) as a mapping."""
        out = {}
        for pair in self.options:
            key, sep, value = pair.partition("=")
            if not sep:
                raise ValueError(f"attack option {pair!r} must look like key=value")
            out[key.strip()] = value.strip()
        return out

    def run_config(self) -> dict[str, Any]:
        """These settings as a Flower run config (``flwr run . --run-config``)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in NOT_RUN_CONFIG:
                continue
            out[f.name.replace("_", "-")] = " ".join(value) if f.name in LIST_KEYS else value
        return out

    @classmethod
    def from_run_config(cls, config: Mapping[str, Any]) -> FederationSettings:
        """Settings from a run config; unknown keys are refused with the valid ones."""
        names = {f.name.replace("_", "-"): f for f in dataclasses.fields(cls)
                 if f.name not in NOT_RUN_CONFIG}
        if "allow-reveal" in config:
            raise ValueError("allow-reveal is not a run-config key: whether a node reveals its "
                             "batch is its operator's choice, `--node-config "
                             "'fedleak-allow-reveal=true'` on that SuperNode")
        unknown = sorted(set(config) - set(names))
        if unknown:
            raise ValueError(f"unknown run-config key(s) {unknown}; valid: {sorted(names)}")
        values: dict[str, Any] = {}
        for key, value in config.items():
            name = names[key].name
            values[name] = tuple(str(value).split()) if name in LIST_KEYS else value
        return cls(**values)


def node_batch(data: ImageDataset, partition: int, partitions: int, server_round: int,
               images: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Node ``partition``'s batch in round ``server_round`` (1-based): the next ``images`` of
    its share ``partition::partitions`` of the data, wrapping around."""
    pool = torch.arange(partition, len(data), partitions)
    if len(pool) < images:
        raise ValueError(f"node {partition} holds {len(pool)} images, fewer than the {images} "
                         "it trains on per round: use fewer nodes or images")
    start = ((server_round - 1) * images) % len(pool)
    chosen = pool[(start + torch.arange(images)) % len(pool)]
    return data.images[chosen], data.labels[chosen]


@cache
def _dataset(name: str) -> ImageDataset:
    return load_dataset(name, "train")


def _settings(given: FederationSettings | None, context: Context) -> FederationSettings:
    return given if given is not None else FederationSettings.from_run_config(context.run_config)


def _partition(context: Context, settings: FederationSettings) -> tuple[int, int]:
    """(partition-id, num-partitions) from the node config (simulation sets both)."""
    pid = context.node_config.get("partition-id")
    count = context.node_config.get("num-partitions", settings.nodes)
    if not isinstance(pid, int) or not isinstance(count, int):
        raise ValueError("start each SuperNode with --node-config 'partition-id=I "
                         "num-partitions=N' (integers) so it knows its share of the data")
    return pid, count


class ConfiguredDefenses:
    """The client mod that applies the settings' update defenses (a :class:`DefenseMod` per
    distinct list of specs, built on first use)."""

    def __init__(self, settings: FederationSettings | None) -> None:
        self.settings = settings
        self._mods: dict[tuple[str, ...], DefenseMod] = {}

    def __call__(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        settings = _settings(self.settings, context)
        update = update_specs(settings.defenses)
        if not update:
            return call_next(msg, context)
        if update not in self._mods:
            self._mods[update] = DefenseMod(*update)
        return self._mods[update](msg, context, call_next)


def parameter_check_specs(specs: tuple[str, ...]) -> tuple[str, ...]:
    """The specs of ``specs`` that check θ before training (``vet``): the train handler runs
    them, not a mod (they need the model and the node's batch)."""
    return tuple(spec for spec in specs
                 if create_defense_from_spec(spec).stage == "parameters")


def update_specs(specs: tuple[str, ...]) -> tuple[str, ...]:
    """The specs of ``specs`` a :class:`DefenseMod` runs (all but the parameter checks)."""
    checks = set(parameter_check_specs(specs))
    return tuple(spec for spec in specs if spec not in checks)


def create_defense_from_spec(spec: str) -> Any:
    """The defense ``spec`` names (``name:key=value,...``)."""
    return build_chain([parse_defense_spec(spec)]).defenses[0]


class ConfiguredSecAgg:
    """The client mod that runs Flower's ``secaggplus_mod`` when the settings ask for SecAgg+."""

    def __init__(self, settings: FederationSettings | None) -> None:
        self.settings = settings

    def __call__(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        if _settings(self.settings, context).secagg_plus:
            return secaggplus_mod(msg, context, call_next)
        return call_next(msg, context)


@cache
def _template(model: str, dataset: str) -> dict[str, torch.Tensor]:
    """The model's state dict (names, shapes, dtypes) that legacy parameters are read into."""
    info = _dataset(dataset).info
    return dict(build_model(model, info.shape, info.num_classes).state_dict())


def make_client_app(settings: FederationSettings | None = None) -> ClientApp:
    """The nodes' ClientApp: fedleak's local update on the node's batch (train), the update
    defenses as a mod, node-side scoring (``query.fedleak_score``) and, when the settings ask,
    Flower's SecAgg+ (``secaggplus_mod``, then the legacy layout it speaks)."""
    def template(context: Context) -> dict[str, torch.Tensor]:
        s = _settings(settings, context)
        return _template(s.model, s.dataset)

    app = ClientApp(mods=[ConfiguredSecAgg(settings), LegacyLayout(template),
                          ConfiguredDefenses(settings)])

    @app.train()
    def train_handler(msg: Message, context: Context) -> Message:
        s = _settings(settings, context)
        torch.set_num_threads(s.threads)
        data = _dataset(s.dataset)
        model = build_model(s.model, data.info.shape, data.info.num_classes)
        config: dict[str, Any] = dict(next(iter(msg.content.config_records.values())))
        server_round = int(config.get("server-round", 1))
        pid, count = _partition(context, s)
        images, labels = node_batch(data, pid, count, server_round, s.images)
        try:
            trained = train(model, msg.content["arrays"], images, labels,  # type: ignore[arg-type]
                            data.info, config, context=context,
                            defenses=[*([s.dp] if s.dp else []),
                                      *parameter_check_specs(s.defenses)])
        except ParametersRefused as err:  # vet: nothing trained on what the server sent
            return Message(Error(VET_ERROR, str(err)), reply_to=msg)
        return Message(trained.content(), reply_to=msg)  # publishes DP-SGD when it ran

    @app.query(SCORE_ACTION)
    def score_handler(msg: Message, context: Context) -> Message:
        s = _settings(settings, context)
        # in simulation the one running it is the nodes' operator; deployed, each SuperNode's
        reveal = True if settings is not None and settings.allow_reveal else None
        return score_reply(msg, context, _dataset(s.dataset).info, allow_reveal=reveal)

    return app


def run_server(grid: Grid, s: FederationSettings, context: Context | None = None
               ) -> Auditor | None:
    """FedAvg over every node for ``s.rounds`` rounds, audited unless ``s.audit`` is False;
    under SecAgg+ (``s.secagg_plus``) through Flower's legacy SecAgg+ workflow."""
    data = _dataset(s.dataset)
    torch.manual_seed(s.model_seed)
    model = build_model(s.model, data.info.shape, data.info.num_classes)
    config = {**s.procedure().config(), **s.extra_config}
    if s.secagg_plus:
        return _run_secagg_plus(grid, s, model, config, context)
    initial = ArrayRecord(model.state_dict())
    inner = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=s.nodes,
                   min_available_nodes=s.nodes)
    if not s.audit:
        inner.start(grid, initial, num_rounds=s.rounds, train_config=ConfigRecord(config))
        return None
    audit = LeakageAudit(inner, s.model, s.dataset, Path(s.out), attack=s.attack,
                         options=s.attack_options(), seed=s.seed, record_only=s.record_only,
                         score=s.score, queue=s.queue, background=not s.inline,
                         overwrite=s.overwrite, probe=s.probe or None)
    audit.start(grid, initial, num_rounds=s.rounds, train_config=ConfigRecord(config))
    return audit  # start() recorded how it ended


def _run_secagg_plus(grid: Grid, s: FederationSettings, model: torch.nn.Module,
                     config: dict[str, Any], context: Context | None) -> Auditor | None:
    """Legacy FedAvg under ``SecAggPlusWorkflow``, wrapped in :class:`AggregateAudit`."""
    secagg = s.secagg()
    secagg.check(s.nodes, s.images)
    inner = LegacyFedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=s.nodes,
                         min_available_clients=s.nodes,
                         initial_parameters=parameters_of(model.state_dict()),
                         on_fit_config_fn=lambda r: {**config, "server-round": r})
    workflow = DefaultWorkflow(fit_workflow=secagg.workflow(s.nodes))
    context = context or Context(run_id=0, node_id=0, node_config={}, state=RecordDict(),
                                 run_config={})
    if not s.audit:
        workflow(grid, LegacyContext(context, ServerConfig(num_rounds=s.rounds), inner))
        return None
    audit = AggregateAudit(inner, s.model, s.dataset, Path(s.out), secagg=secagg, grid=grid,
                           attack=s.attack, options=s.attack_options(), seed=s.seed,
                           record_only=s.record_only, score=s.score,
                           overwrite=s.overwrite, probe=s.probe or None,
                           probe_round=s.rounds + 1 if s.probe else None)
    rounds = s.rounds + (1 if s.probe else 0)  # the probe's round trains nothing
    return _finished(audit, lambda: workflow(grid, LegacyContext(
        context, ServerConfig(num_rounds=rounds), audit)))


def _finished(audit: Auditor, run: Callable[[], Any]) -> Auditor:
    """``run()`` the federation; ``audit``'s metrics.json then says how it ended."""
    try:
        run()
    except BaseException as err:
        audit.finish(*ended_by(err, audit.phase))
        raise
    audit.finish()
    return audit


def make_server_app(settings: FederationSettings | None = None) -> ServerApp:
    """The ServerApp: :func:`run_server` with ``settings`` (or the run config's)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_server(grid, _settings(settings, context), context)

    return app


def simulate(settings: FederationSettings, *, verbose: bool = False) -> dict[str, Any]:
    """Run the federation in Flower's simulation engine (Ray, one CPU per node); returns the
    audit's ``metrics.json`` (empty when ``settings.audit`` is False). It starts a Ray instance
    of its own (``address="local"``): joining a cluster already running on the machine would
    fail (Ray refuses ``num_cpus`` when it connects) or borrow another job's workers."""
    from flwr.simulation import run_simulation

    run_simulation(make_server_app(settings), make_client_app(settings),
                   num_supernodes=settings.nodes, verbose_logging=verbose,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   # a Ray of its own, never one already running here
                                   "init_args": {"address": "local",
                                                 "num_cpus": settings.nodes,
                                                 "include_dashboard": False}})
    metrics = Path(settings.out) / METRICS_NAME
    return json.loads(metrics.read_text()) if settings.audit and metrics.exists() else {}


#: for ``flwr run``: both apps read their settings from the run config
server_app = make_server_app()
client_app = make_client_app()
