"""Label recovery from the last layer: iDLG for one image, the counting estimate for several."""

from __future__ import annotations

import pytest
import torch

from fedleak.attacks.labels import (
    LabelRecoveryError,
    count_labels,
    dummy_probabilities,
    idlg_label,
    last_layer_gradients,
    recover_labels,
)
from fedleak.harness.federated.protocol import Protocol
from tests.helpers import make_observation

FEDSGD = Protocol()
FEDAVG = Protocol(kind="fedavg", local_epochs=2, batch_size=1, learning_rate=1e-2)
MODELS = [
    ("lenet-zhu", (3, 16, 16)),
    ("mlp:width=32,depth=2", (1, 6, 6)),
    ("mlp:width=32,depth=2,bias=false", (1, 6, 6)),
]


def _image(shape: tuple[int, int, int], seed: int) -> torch.Tensor:
    return torch.rand(1, *shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("protocol", [FEDSGD, FEDAVG], ids=["fedsgd", "fedavg"])
@pytest.mark.parametrize(("model", "shape"), MODELS, ids=[m for m, _ in MODELS])
def test_idlg_is_exact_for_one_image(model: str, shape: tuple[int, int, int], protocol: Protocol):
    for label in (0, 3, 6, 9):
        observation = make_observation(
            model, shape, 10, _image(shape, label), torch.tensor([label]), protocol, seed=label
        )
        assert idlg_label(observation) == label
        assert recover_labels(observation).tolist() == [label]


def test_bias_free_model_uses_weight_rows():
    observation = make_observation(
        "mlp:width=16,depth=1,bias=false", (1, 4, 4), 10, _image((1, 4, 4), 0), torch.tensor([2])
    )
    weight, bias = last_layer_gradients(observation)
    assert bias is None and weight.shape == (10, 16)


def test_supplied_labels_are_returned():
    observation = make_observation(
        "lenet-zhu", (3, 16, 16), 10, torch.rand(2, 3, 16, 16), torch.tensor([4, 1]),
        give_labels=True,
    )
    assert recover_labels(observation).tolist() == [4, 1]


def test_count_labels_inverts_the_uniform_prediction_model():
    # g_c = s - k_c / n with s = 0.1 for every class, counts k = {1: 2, 3: 1, 7: 1}, n = 4.
    counts = torch.zeros(10)
    counts[1], counts[3], counts[7] = 2, 1, 1
    scores = 0.1 - counts / 4
    labels = count_labels(scores, 4)
    assert sorted(labels.tolist()) == [1, 1, 3, 7]
    assert labels[0].item() == 1  # most negative first


def test_distinct_labels_of_a_batch_are_found():
    labels = torch.tensor([2, 5, 8])
    observation = make_observation(
        "mlp:width=32,depth=2", (1, 6, 6), 10, torch.rand(3, 1, 6, 6), labels
    )
    assert sorted(recover_labels(observation).tolist()) == [2, 5, 8]


def test_update_without_a_class_layer_is_refused():
    observation = make_observation(
        "mlp:width=16,depth=1", (1, 4, 4), 10, _image((1, 4, 4), 0), torch.tensor([2])
    )
    observation.num_classes = 7
    with pytest.raises(LabelRecoveryError, match="7 rows"):
        recover_labels(observation)


def test_count_labels_is_exact_with_the_expected_probabilities():
    # non-uniform mean prediction s_c; counts k = {0: 3, 2: 1, 9: 4}, n = 8
    expected = torch.softmax(torch.linspace(-1.0, 1.5, 10), 0)
    counts = torch.zeros(10)
    counts[0], counts[2], counts[9] = 3, 1, 4
    scores = expected - counts / 8
    labels = count_labels(scores, 8, expected)
    assert sorted(labels.tolist()) == [0, 0, 0, 2, 9, 9, 9, 9]


def test_dummy_probabilities_are_a_distribution():
    observation = make_observation(
        "convnet:width=4", (1, 8, 8), 10, torch.rand(4, 1, 8, 8), torch.tensor([1, 1, 5, 8])
    )
    probabilities = dummy_probabilities(observation)
    assert probabilities is not None and probabilities.shape == (10,)
    assert probabilities.sum().item() == pytest.approx(1.0, abs=1e-5)
    assert (probabilities > 0).all()
    bias_free = make_observation(
        "mlp:width=8,depth=1,bias=false", (1, 4, 4), 10, torch.rand(2, 1, 4, 4),
        torch.tensor([2, 3]),
    )
    assert dummy_probabilities(bias_free) is None
    assert sorted(recover_labels(bias_free).tolist()) == [2, 3]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dummy_counting_recovers_batches_with_repeated_labels(seed: int):
    # an untrained BatchNorm ConvNet: its mean prediction hardly depends on the input
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (8,), generator=g)  # 8 labels from 4 classes: repeats
    observation = make_observation(
        "convnet:width=4", (1, 8, 8), 10, torch.rand(8, 1, 8, 8, generator=g), labels, seed=seed
    )
    assert sorted(recover_labels(observation).tolist()) == sorted(labels.tolist())


def test_unknown_method_is_refused():
    observation = make_observation(
        "mlp:width=8,depth=1", (1, 4, 4), 10, torch.rand(2, 1, 4, 4), torch.tensor([2, 3])
    )
    with pytest.raises(ValueError, match="dummy"):
        recover_labels(observation, method="magic")


def test_batch_of_100_end_to_end_scores_every_image_and_its_labels(tmp_path):
    """A victim with --batch-size 100; the attacker takes n from the update and recovers labels."""
    import json
    import subprocess
    import sys

    from fedleak.harness.victim.process import VictimProcess

    args = ["--dataset", "digits", "--model", "convnet:width=4", "--batch-size", "100"]
    with VictimProcess(args) as victim:
        done = subprocess.run(
            [sys.executable, "-m", "fedleak", "attack", "--victim", victim.address,
             "--attack", "inverting-gradients", "--iterations", "2", "--out", str(tmp_path),
             "--quiet"],
            capture_output=True, text=True, timeout=1200,
        )
    assert done.returncode == 0, done.stderr
    r = json.loads((tmp_path / "metrics.json").read_text())["rounds"][0]
    assert r["num_images"] == 100 and len(r["labels"]) == 100 and len(r["images"]) == 100
    assert sorted(s["matched_index"] for s in r["images"]) == list(range(100))
    assert r["label_accuracy"] >= 0.9


def test_dummy_counting_works_on_a_fedavg_delta():
    g = torch.Generator().manual_seed(7)
    labels = torch.tensor([0, 0, 3, 3, 3, 8])
    protocol = Protocol(kind="fedavg", local_epochs=1, batch_size=3, learning_rate=1e-3)
    observation = make_observation(
        "convnet:width=4", (1, 8, 8), 10, torch.rand(6, 1, 8, 8, generator=g), labels, protocol
    )
    probabilities = dummy_probabilities(observation)
    assert probabilities is not None and probabilities.sum().item() == pytest.approx(1, abs=1e-3)
    assert (probabilities > 0).all()
    assert sorted(recover_labels(observation).tolist()) == sorted(labels.tolist())
