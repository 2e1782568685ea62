"""BatchNorm buffers on the wire, the batch statistics inferred from them, and the prior."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedleak.attacks import create_attack
from fedleak.attacks.optimisation.batch_statistics import (
    LayerStatistics,
    batch_norm_prior,
    layer_distance,
    target_statistics,
)
from fedleak.attacks.parts import PartError
from fedleak.harness.attacker.client import VictimClient
from fedleak.harness.attacker.described import dataset_info, server_model
from fedleak.harness.attacker.update_attack import observation_for
from fedleak.harness.federated.observe import observe
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.victim.config import VictimConfig
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.victim.settings import VictimSettings
from fedleak.harness.zoo.datasets import load_dataset, normalize
from fedleak.harness.zoo.models import build_model


def victim_config(settings: VictimSettings) -> VictimConfig:
    return VictimConfig(model=None, protocol=settings.protocol,  # type: ignore[arg-type]
                        buffers_returned=settings.buffers)

PHOTOS = load_dataset("photos", "all")
FEDAVG = Protocol(kind="fedavg", local_epochs=1, batch_size=2, learning_rate=0.01)
MODEL = "convnet:width=4"


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def convnet_observation(protocol: Protocol = FEDAVG, n: int = 2, **kw):  # noqa: B008
    torch.manual_seed(0)
    model = build_model(MODEL, PHOTOS.info.shape, PHOTOS.info.num_classes)
    return observe(model, PHOTOS.images[:n], PHOTOS.labels[:n], PHOTOS.info, protocol, **kw)


def true_statistics(observation, images: torch.Tensor) -> dict[str, tuple]:
    """Per BatchNorm layer, the mean and biased variance of its input on ``images``."""
    model = observation.simulate.model
    found: dict[str, tuple] = {}
    hooks = [m.register_forward_hook(
        lambda _m, i, _o, name=name: found.__setitem__(
            name, (i[0].mean(dim=(0, 2, 3)), i[0].var(dim=(0, 2, 3), unbiased=False))))
        for name, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
    with torch.no_grad():
        torch.func.functional_call(model, {**observation.simulate.parameters,
                                           **{k: v.clone() for k, v in
                                              observation.simulate.buffers.items()}},
                                   (normalize(images, PHOTOS.info).float(),))
    for h in hooks:
        h.remove()
    return found


@pytest.mark.parametrize("n", [1, 2])
def test_batch_statistics_are_inferred_exactly_from_one_steps_buffers(n: int):
    """Unbiased running variance, momentum 0.1, one forward: exact to float rounding (1e-4;
    n = 1 is the batch of one image of bench/adaptive.py --batchnorm); the prior is ~0 at the
    true images and large elsewhere, in either form."""
    protocol = Protocol(kind="fedavg", local_epochs=1, batch_size=n, learning_rate=0.01)
    observation = convnet_observation(protocol, n=n)
    assert observation.returned_buffers is not None
    targets, source = target_statistics(observation)
    assert source == "returned"
    truth = true_statistics(observation, PHOTOS.images[:n])
    assert len(targets) == len(truth) >= 2
    for target in targets:
        mean, variance = truth[target.name]
        torch.testing.assert_close(target.mean, mean, rtol=1e-3, atol=1e-4)
        torch.testing.assert_close(target.variance, variance, rtol=1e-3, atol=1e-4)
    for form in ("standardised", "yin"):
        prior = batch_norm_prior(observation, targets, form)
        at_truth = float(prior(normalize(PHOTOS.images[:n], PHOTOS.info).float()).detach())
        elsewhere = float(prior(torch.randn(n, 3, 32, 32)).detach())
        assert at_truth < 1e-2 < 1.0 < elsewhere
    fallback, source = target_statistics(convnet_observation(return_buffers=False))
    assert source == "global"
    buffers = observation.simulate.buffers
    torch.testing.assert_close(fallback[0].mean, buffers[f"{fallback[0].name}.running_mean"])


def test_the_standardised_term_is_each_layers_relative_error_and_yin_the_raw_one():
    """Standardised: RMS over channels of (μ − μ̂)/σ̂ plus of (σ − σ̂)/σ̂, so a layer whose
    activations are 100× larger weighs the same; yin: the raw norms of eq. 6."""
    target = LayerStatistics("layer", torch.tensor([0.0, 1.0]), torch.tensor([1.0, 4.0]))
    mean, variance = torch.tensor([0.5, 1.0]), torch.tensor([1.0, 1.0])
    expected = (torch.tensor([0.5, 0.0]).norm() + torch.tensor([0.0, -0.5]).norm()) / 2 ** 0.5
    assert float(layer_distance(mean, variance, target)) == pytest.approx(float(expected))
    scaled = LayerStatistics("layer", target.mean * 100, target.variance * 1e4)
    assert float(layer_distance(mean * 100, variance * 1e4, scaled)) == \
        pytest.approx(float(expected), rel=1e-5)
    raw = torch.tensor([0.5, 0.0]).norm() + torch.tensor([0.0, 3.0]).norm()
    assert float(layer_distance(mean, variance, target, "yin")) == pytest.approx(float(raw))
    with pytest.raises(PartError, match="standardised, yin"):
        batch_norm_prior(convnet_observation(), [target], "raw")


def test_the_prior_runs_in_the_attack_and_is_refused_where_it_cannot():
    observation = convnet_observation()
    result = create_attack("fedavg", {"iterations": 3, "bn": 0.01, "restarts": 2}) \
        .reconstruct(observation)
    assert result.extras["bn_source"] == "returned"
    assert len(result.restart_objectives) == 2
    torch.manual_seed(0)
    lenet = build_model("lenet-zhu", PHOTOS.info.shape, PHOTOS.info.num_classes)
    plain = observe(lenet, PHOTOS.images[:1], PHOTOS.labels[:1], PHOTOS.info)
    with pytest.raises(PartError, match="no(ne)?.*bn=0|bn=0"):
        create_attack("inverting-gradients", {"iterations": 1, "bn": 0.1}).reconstruct(plain)
    fedsgd = convnet_observation(Protocol())
    assert fedsgd.returned_buffers is None  # the victim's default: buffers in FedAvg only
    with pytest.raises(PartError, match="--return-buffers"):
        create_attack("inverting-gradients",
                      {"iterations": 1, "bn": 0.1, "bn-source": "returned"}).reconstruct(fedsgd)


def test_a_fedavg_victim_returns_its_buffers_and_publishes_it():
    args = ["--dataset", "photos", "--split", "all", "--images", "0-3", "--model", MODEL,
            "--batch-size", "2", "--protocol", "fedavg", "--local-epochs", "1",
            "--local-batch-size", "2", "--lr", "0.01"]
    with VictimProcess(args) as victim, VictimClient(victim.address, timeout=60) as client:
        described = client.describe()
        assert described.buffers_returned == "fedavg"
        params, buffers = client.global_model()
        received = client.compute_update(params, buffers)
        assert received.buffers is not None and set(received.buffers) == set(buffers)
        observation = observation_for(server_model(described), params, buffers, received,
                                      dataset_info(described), "cpu")
        targets, source = target_statistics(observation)
        assert source == "returned"
        moved = [name for name in buffers if name.endswith("num_batches_tracked")]
        assert all(int(received.buffers[n]) == int(buffers[n]) + 1 for n in moved)
        fedsgd = client.compute_update(params, buffers,
                                       Protocol(kind="fedsgd"))  # not a FedAvg round
        assert fedsgd.buffers is None
    never = VictimSettings(buffers="never")
    always = VictimSettings(buffers="always")
    assert victim_config(never).returns_buffers(FEDAVG) is False
    assert victim_config(always).returns_buffers(Protocol()) is True
    with pytest.raises(ValueError, match="never, fedavg, always"):
        victim_config(VictimSettings(buffers="sometimes"))


def test_replaying_leaves_the_global_buffers_where_the_server_sent_them():
    """A training-mode replay moves a copy of the running statistics: after any number of
    replays the returned buffers still infer the batch statistics (a second attack on the same
    observation sees what the first saw)."""
    observation = convnet_observation()
    before = {k: v.clone() for k, v in observation.simulate.buffers.items()}
    for _ in range(2):
        observation.simulate(torch.randn(2, *PHOTOS.info.shape), PHOTOS.labels[:2])
    for name, value in observation.simulate.buffers.items():
        assert torch.equal(value, before[name]), name
    targets, source = target_statistics(observation)
    assert source == "returned" and targets
