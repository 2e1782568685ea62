"""A victim as one typed object: JSON for child processes, and `victim serve --settings`."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from fedleak.harness.cli.main import main
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.victim.release.releaser import ReleaseSettings
from fedleak.harness.victim.settings import SetupError, VictimSettings


def test_settings_round_trip_through_json() -> None:
    settings = VictimSettings(dataset="digits", model="mlp:width=16,depth=1", images="0-3",
                              protocol=Protocol("fedavg", 2, 1, 0.01),
                              defenses=("clip:max-norm=1",),
                              secagg_drops=("1@masked-input",), defense_seed=3,
                              release=ReleaseSettings(size=4, lr=0.1))
    assert VictimSettings.from_json(settings.to_json()) == settings
    with pytest.raises(SetupError, match="unknown victim setting.*colour"):
        VictimSettings.from_json('{"colour": "red"}')
    with pytest.raises(SetupError, match="not valid JSON"):
        VictimSettings.from_json("{")
    with pytest.raises(ValueError, match="local_epochs"):
        VictimSettings.from_json('{"protocol": {"local_epochs": 0}}')


def test_settings_file_describes_the_whole_victim(tmp_path) -> None:
    path = tmp_path / "victim.json"
    path.write_text(dataclasses.replace(VictimSettings(), dataset="digits").to_json())
    result = CliRunner().invoke(main, ["victim", "serve", "--settings", str(path),
                                       "--dataset", "faces", "--lr", "0.1", "--port", "0",
                                       "--defense", "clip:max-norm=1", "-n", "2"])
    assert result.exit_code == 2
    # by the flags a person typed (--defense, not its parameter name), serving ones left open
    assert "drop --batch-size, --dataset, --defense, --lr or" in result.output
    bad = tmp_path / "bad.json"
    bad.write_text('{"dataset": "digits", "shape": 3}')
    result = CliRunner().invoke(main, ["victim", "serve", "--settings", str(bad)])
    assert result.exit_code == 2 and "unknown victim setting(s) shape" in result.output



def test_a_model_that_cannot_train_as_served_refuses_to_start_naming_the_fixes() -> None:
    """ResNet-18 at 32×32 shrinks its feature map to 1×1: BatchNorm in training mode on a batch
    of one image has one value per channel and every round would fail. The victim runs the
    model the way it will train (BatchNorm mode, each local batch size) before it starts."""
    import torch

    from fedleak.harness.victim.settings import check_trainable, create_victim

    with pytest.raises(SetupError, match="batch of 1 image") as info:
        create_victim(VictimSettings(dataset="photos", model="resnet18", batch_size=1))
    for fix in ("--batchnorm eval", "--batch-size", "--image-size"):
        assert fix in str(info.value)
    # the same 1×1 feature map in a tiny network
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1),
                              torch.nn.BatchNorm2d(4), torch.nn.Flatten())
    images = torch.rand(3, 3, 8, 8)
    # FedAvg's last local batch of 3 images in batches of 2 holds one image too
    with pytest.raises(SetupError, match="--local-batch-size"):
        check_trainable(net, Protocol("fedavg", 1, 2, 0.1), images, "tiny")
    check_trainable(net, Protocol("fedavg", 1, 3, 0.1), images, "tiny")  # one batch of 3
    check_trainable(net, Protocol(batchnorm="eval"), images[:1], "tiny")
    assert net.training and int(net[2].num_batches_tracked) == 0  # a copy ran, not the model
