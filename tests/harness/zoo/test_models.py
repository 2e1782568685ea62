"""The model zoo: every model builds for the bundled shapes and gives logits per class."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedleak.harness.zoo.models import ModelError, ModelSpec, build_model, model_names


@pytest.mark.parametrize(
    "name, shape",
    [("lenet-zhu", (3, 32, 32)), ("lenet-zhu", (1, 8, 8)), ("convnet:width=8", (3, 32, 32)),
     ("convnet:width=8", (1, 25, 25)),
     ("convnet:width=8", (1, 8, 8)), ("resnet20-4:width=1", (3, 32, 32)),
     ("resnet18", (1, 32, 32)), ("mlp:width=16,depth=1", (1, 8, 8))],
)
def test_models_build_for_data_shapes(name: str, shape: tuple[int, int, int]) -> None:
    model = build_model(name, shape, 7)
    assert model(torch.rand(2, *shape)).shape == (2, 7)
    assert not any(getattr(m, "inplace", False) for m in model.modules())


def test_lenet_zhu_is_dlgs_network() -> None:
    model = build_model("lenet-zhu", (3, 32, 32), 10)
    assert sum(p.numel() for p in model.parameters()) == 15826
    assert all(isinstance(m, nn.Sigmoid) for m in model.body if not isinstance(m, (nn.Conv2d,
                                                                                    nn.Flatten)))
    assert all(p.abs().max() <= 0.5 for p in model.parameters())


def test_convnet_width_scales_channels() -> None:
    model = build_model("convnet:width=4", (3, 32, 32), 10)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 8 and [c.out_channels for c in convs] == [4, 8, 8, 16, 16, 16, 16, 16]
    assert sum(isinstance(m, nn.MaxPool2d) for m in model.modules()) == 2


def test_bias_free_mlp_is_homogeneous() -> None:
    model = build_model("mlp:bias=false,width=8", (1, 8, 8), 2)
    x = torch.rand(3, 1, 8, 8)
    torch.testing.assert_close(model(2 * x), 2 * model(x))


def test_unknown_models_and_options_are_explained() -> None:
    with pytest.raises(ModelError, match="choose one of"):
        build_model("vgg", (3, 32, 32), 10)
    with pytest.raises(ModelError, match="valid: width"):
        build_model("convnet:depth=3", (3, 32, 32), 10)
    with pytest.raises(ModelError, match="must be an integer"):
        build_model("mlp:width=wide", (1, 8, 8), 10)
    assert {"lenet-zhu", "convnet", "resnet20-4", "resnet18", "mlp"} <= set(model_names())
    assert str(ModelSpec.parse("convnet: width = 8")) == "convnet:width=8"
