"""Mechanisms, not classes: every defense declares what it claims, the harness reads only the
declarations, and a third-party per-example DP-SGD gets exactly what ``dpsgd`` gets."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import math
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from fedleak.defenses import Defense, build_chain, create_defense, defense_names
from fedleak.defenses.accounting import make_accountant
from fedleak.defenses.mechanism import (
    Clip,
    DeclarationError,
    Mechanism,
    Noise,
    Sampling,
    Shares,
    mechanism_from_params,
)
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.remote_defense.declaration import mechanism_from_pb, mechanism_to_pb
from fedleak.harness.victim.audit.claim import trial_claim
from fedleak.v1 import defense_pb2 as dpb
from tests.paths import REPO

ROOT = REPO
PLUGINS = ROOT / "tests" / "test_plugin_package"
#: where privacy is reasoned about: none of it may look at a defense's class
READERS = [*sorted((ROOT / "fedleak" / "harness").rglob("*.py")),
           *(ROOT / "fedleak" / "defenses" / f for f in ("chain.py", "composition.py",
                                                         "accounting.py", "mechanism.py"))]


@pytest.fixture(scope="module")
def plugins() -> Iterator[None]:
    yield from installed([PLUGINS])


def installed(paths: list[Path]) -> Iterator[None]:
    """Put plug-in packages on sys.path for a module's tests; take them and the classes
    their entry points registered away after, so later tests see the registry unchanged."""
    from fedleak.defenses.defense_registry import DEFENSES

    added = [str(p) for p in paths if str(p) not in sys.path]
    known, broken = set(DEFENSES._classes), set(DEFENSES._broken)
    sys.path[:0] = added
    try:
        yield
    finally:
        for path in added:
            sys.path.remove(path)
        for loaded in set(DEFENSES._classes) - known:
            DEFENSES._classes.pop(loaded)
        for loaded in set(DEFENSES._broken) - broken:
            DEFENSES._broken.pop(loaded)


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _class_names(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.Tuple):
        return [n for e in node.elts for n in _class_names(e)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _class_names(node.left) + _class_names(node.right)
    return [node]


def _is_defense_class(module: object, node: ast.expr) -> bool:
    try:
        value = eval(compile(ast.Expression(node), "<check>", "eval"), dict(vars(module)))  # noqa: S307
    except Exception:  # noqa: BLE001 - a local name, not a module-level class
        return False
    return isinstance(value, type) and issubclass(value, Defense)


def test_no_isinstance_on_defense_classes_in_the_harness() -> None:
    """isinstance/issubclass/type(...) is on a Defense class anywhere the harness or the chain
    reasons about privacy fails here: read ``defense.declared()`` (or its stage) instead."""
    found = []
    for path in READERS:
        tree = ast.parse(path.read_text())
        module = importlib.import_module(_module_name(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("isinstance", "issubclass") and len(node.args) == 2:
                if any(_is_defense_class(module, n) for n in _class_names(node.args[1])):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call) and \
                    isinstance(node.left.func, ast.Name) and node.left.func.id == "type":
                if any(_is_defense_class(module, c) for c in node.comparators):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"class checks on defenses at {found}; read the declaration instead"


def test_the_check_would_catch_a_class_check() -> None:
    """The scan above resolves names the way a module would: it sees DPSGD here."""
    from fedleak.defenses import dpsgd

    node = ast.parse("isinstance(x, DPSGD | ClientDP)").body[0].value
    assert isinstance(node, ast.Call)
    namespace = types.SimpleNamespace(DPSGD=dpsgd.DPSGD, ClientDP=object)
    assert any(_is_defense_class(namespace, n) for n in _class_names(node.args[1]))


@pytest.mark.parametrize("name", [n for n in defense_names() if n not in ("remote",)])
def test_every_registered_defense_declares_at_its_own_stage(name: str) -> None:
    try:
        defense = create_defense(name)
    except ValueError:
        pytest.skip(f"{name} has no default configuration")
    declared = defense.declared()
    assert declared is None or declared.stage == defense.stage
    if declared is not None:  # what Describe publishes reads back
        assert mechanism_from_params(declared.to_params()) == declared


def test_builtins_declare_what_they_do() -> None:
    dp = create_defense("dpsgd", {"noise-multiplier": "0.7", "max-grad-norm": "2",
                                  "clipping": "per-layer", "poisson": "true"}).declared()
    assert dp == Mechanism("per-example", clip=Clip(2.0, "per-tensor"), noise=Noise(1.4),
                           sampling=Sampling("poisson"), accountant="rdp", unit="example")
    client = create_defense("client-dp", {"variant": "distributed", "users": "4"}).declared()
    assert client is not None and client.shares == Shares(4)
    assert client.share_std == pytest.approx(0.5)
    assert create_defense("noise", {"distribution": "laplace", "sigma": "1"}).declared() \
        == Mechanism("update", noise=Noise(math.sqrt(2), "laplace"))
    assert create_defense("prune").declared() is None


def test_a_declaration_a_defense_cannot_keep_is_refused() -> None:
    with pytest.raises(DeclarationError, match="clip"):
        Mechanism("per-example", noise=Noise(1.0))
    with pytest.raises(DeclarationError, match="geometry"):
        Clip(1.0, "diagonal")


def test_the_declared_clip_is_a_reference_map() -> None:
    x = [torch.tensor([3.0, 4.0]), torch.tensor([12.0])]  # ‖x‖ = 13
    total = Clip(1.0).apply(x)
    assert float(torch.cat(total).norm()) == pytest.approx(1.0)
    per = Clip(math.sqrt(2), "per-tensor").apply(x)  # each to 1
    assert [float(t.norm()) for t in per] == pytest.approx([1.0, 1.0])
    assert Clip(math.sqrt(2), "per-tensor").sensitivity(["a", "b"]) == pytest.approx(math.sqrt(2))


def test_the_accountant_reads_the_declaration_as_opacus_does() -> None:
    dp = create_defense("dpsgd", {"noise-multiplier": "1.1", "poisson": "true"})
    got = dp.account(steps=20, sample_rate=0.25)
    reference = make_accountant("rdp")
    reference.history.append((1.1, 0.25, 20))
    assert float(got["epsilon_round"]) == pytest.approx(reference.get_epsilon(1e-5), rel=1e-5)
    chain = build_chain([("clip", {"max-norm": "1"}), ("noise", {"sigma": "2"})])
    composed = chain.accountant.rounds()  # clip then noise compose into a user-level claim
    assert composed["noise_multiplier"] == "1" and composed["privacy_unit"] == "user"


def test_a_third_party_dpsgd_gets_exactly_what_dpsgd_gets(plugins: None) -> None:
    ours = build_chain([("dpsgd", {"noise-multiplier": "1.3"})])
    theirs = build_chain([("private-sgd", {"noise-multiplier": "1.3"})])
    assert type(theirs.per_example).__mro__[1].__name__ == "PerExampleDefense"
    assert ours.per_example_mechanism == theirs.per_example_mechanism
    for protocol in (Protocol(), Protocol(kind="fedavg", local_epochs=2, batch_size=4)):
        a = trial_claim(ours, "gradient", 10.0, protocol, 8, 1, 1e-5)
        b = trial_claim(theirs, "gradient", 10.0, protocol, 8, 1, 1e-5)
        assert a.mechanism.replace("dpsgd", "private-sgd") == b.mechanism  # by name only
        assert dataclasses.replace(a, mechanism="") == dataclasses.replace(b, mechanism="")
        assert math.isfinite(a.epsilon)
    assert ours.accountant.local_training(8, 0, 1, 1) == \
        theirs.accountant.local_training(8, 0, 1, 1)
    grads = [torch.randn(6, 4, 3), torch.randn(6, 4)]
    a = ours.per_example.privatise(grads, 6, torch.Generator().manual_seed(2))  # type: ignore
    b = theirs.per_example.privatise(grads, 6, torch.Generator().manual_seed(2))  # type: ignore
    assert all(torch.allclose(x, y, rtol=1e-6, atol=1e-7) for x, y in zip(a, b, strict=True))


def test_declarations_cross_the_proto_and_old_claims_read_as_before() -> None:
    for mechanism in (
        Mechanism("per-example", clip=Clip(2.0, "per-tensor", (1.0, 1.0, math.sqrt(2))),
                  noise=Noise(3.0), sampling=Sampling("poisson", 0.25), accountant="prv",
                  delta=1e-6, unit="example"),
        Mechanism("update", clip=Clip(1.0), noise=Noise(0.5), shares=Shares(4, "compensated"),
                  accountant="rdp", unit="user", user_sample_rate=0.1),
    ):
        assert mechanism_from_pb(mechanism_to_pb(mechanism)) == mechanism
    old = mechanism_from_pb(dpb.GaussianClaim(clip_norm=1.0, noise_std=2.0))
    assert old == Mechanism("update", clip=Clip(1.0), noise=Noise(2.0))
    with pytest.raises(DeclarationError):
        mechanism_from_pb(dpb.GaussianClaim(noise_std=1.0, stage="per-example"))


def test_describe_publishes_declarations_without_breaking_specs() -> None:
    from fedleak.attacks.published import published

    chain = build_chain([("dpsgd", {"noise-multiplier": "2"}), ("prune", {"p": "0.5"})])
    links = published(chain.describe())
    assert links[0].params["declared.noise-std"] == "2"
    assert "declared" not in links[0].spec() and build_chain(
        [(d.name, d.options()) for d in links]).per_example_mechanism == \
        chain.per_example_mechanism


def test_the_mechanism_module_has_no_class_reads() -> None:
    """The declared types are data: the composition never asks which defense it walks."""
    chain = build_chain([("clip", {"max-norm": "0.5"}), ("noise", {"sigma": "1"})])
    composition = chain.update_composition()
    assert composition.gaussian and composition.distance(10.0, ["w"]) == pytest.approx(1.0)
    mapped = composition.declared_map([torch.ones(4) * 10], ["w"])
    assert float(mapped[0].norm()) == pytest.approx(0.5)
    assert np.isclose(composition.noise_std, 1.0)


def test_the_fisher_ceiling_and_the_dp_release_read_the_declaration(plugins: None) -> None:
    """A third-party DP-SGD gets dpsgd's Fisher ceilings and DP release settings; a plug-in
    that declares nothing gets a note naming the declaration."""
    from fedleak.harness.victim.rounds import Round
    from fedleak.harness.victim.scoring.fisher import fisher_ceilings
    from fedleak.harness.victim.settings import VictimSettings, create_victim
    from fedleak.harness.zoo.datasets import normalize  # noqa: F401  (the victim's space)

    victim = create_victim(VictimSettings(dataset="digits", model="mlp:width=16,depth=1",
                                          split="all", images="0-3", batch_size=4,
                                          defenses=("dpsgd:noise-multiplier=2",)))
    params, buffers = victim.global_model()
    round_ = Round("r", torch.arange(4), Protocol(), parameters=params, buffers=buffers)
    images, labels = victim.data.images[:4], victim.data.labels[:4]
    ceilings = {}
    for spec in (("dpsgd", {"noise-multiplier": "2"}),
                 ("private-sgd", {"noise-multiplier": "2"})):
        answer = fisher_ceilings(victim.model, build_chain([spec]), round_, images, labels,
                                 victim.info)
        assert answer.ceilings is not None, answer.note
        ceilings[spec[0]] = answer.ceilings
    assert ceilings["dpsgd"] == pytest.approx(ceilings["private-sgd"], rel=1e-9)
    none = fisher_ceilings(victim.model, build_chain([("prune", {})]), round_, images, labels,
                           victim.info)
    assert none.ceilings is None and "declares no per-example Gaussian" in none.note


def test_the_dp_release_trains_by_the_declaration(plugins: None) -> None:
    from fedleak.harness.victim.release.releaser import ModelReleaser
    from fedleak.harness.wire.request_errors import FailedPrecondition

    def release_dp(*specs: tuple[str, dict[str, str]]) -> Mechanism | None:
        return ModelReleaser._dp(types.SimpleNamespace(defenses=build_chain(list(specs))))  # type: ignore[arg-type]

    ours = release_dp(("dpsgd", {"noise-multiplier": "0.5"}))
    theirs = release_dp(("private-sgd", {"noise-multiplier": "0.5"}))
    assert ours == theirs and ours is not None and ours.noise_multiplier == 0.5
    with pytest.raises(FailedPrecondition, match="declares"):
        release_dp(("private-sgd", {"poisson": "true"}))
    assert release_dp() is None
