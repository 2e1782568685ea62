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
