"""The user's own model (``module:factory``) and images (an image folder at its own size and
normalisation) on fedleak's victim, attacked from another process.

Flower's quickstart ``Net`` served by ``fedleak victim serve --model pytorchexample.task:Net``
on photos written as an image folder with the quickstart's normalisation; the attacker imports
the factory only because its user named it (``--model-factory``), and refuses otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.zoo.bundled_images import photo_crops
from fedleak.harness.zoo.datasets import DatasetError, load_dataset
from fedleak.harness.zoo.folder_look import FolderLookError, folder_look, with_look
from fedleak.harness.zoo.image_files import SkippedFilesWarning
from fedleak.harness.zoo.model_spec import ModelError, ModelSpec
from fedleak.harness.zoo.models import build_model
from fedleak.harness.zoo.user_models import is_factory, trust, user_model
from tests.paths import REPO

ROOT = REPO
EXAMPLE = ROOT / "examples" / "flower_quickstart"
NET = "pytorchexample.task:Net"


@pytest.fixture()
def example_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE))


def photo_folder(root: Path, count: int, size: int) -> Path:
    """``count`` photo crops as PNGs, one sub-folder per photograph (ten classes)."""
    images, labels = photo_crops(count, size=size, seed=3)
    for i, (x, y) in enumerate(zip(images, labels, strict=True)):
        (root / f"class-{int(y)}").mkdir(parents=True, exist_ok=True)
        pixels = (x.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        Image.fromarray(pixels).save(root / f"class-{int(y)}" / f"{i:03d}.png")
    return root


def test_a_factory_is_parsed_built_checked_and_imported_only_when_named(
        example_on_path: None) -> None:
    assert is_factory(NET) and not is_factory("mlp:width=3") and not is_factory("lenet-zhu")
    spec = ModelSpec.parse(NET)
    assert spec.name == "factory" and ModelSpec.parse(str(spec)) == spec
    with pytest.raises(ModelError, match="--model-factory pytorchexample.task:NoSuchNet"):
        build_model("pytorchexample.task:NoSuchNet", (3, 32, 32), 10)
    model = user_model(NET)  # this process's user named it
    assert type(model).__name__ == "Net"
    assert type(build_model(spec, (3, 32, 32), 10)).__name__ == "Net"
    with pytest.raises(ModelError, match=r"must give \[1, 5\]"):
        build_model(spec, (3, 32, 32), 5)
    with pytest.raises(ModelError, match="cannot import"):
        user_model("no_such_module_here:Net")
    trust("pytorchexample.task:load_centralized_dataset")
    with pytest.raises(ModelError, match="not a torch nn.Module"):
        build_model("pytorchexample.task:load_centralized_dataset", (3, 32, 32), 10)


HOSTILE_FACTORIES = '''
import sys, threading, torch
from torch import nn

class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3 * 2 * 2, 2)
    def forward(self, x):
        return self.fc(x.flatten(1))

class Boom(nn.Module):
    def forward(self, x):
        raise KeyError("no such layer")

def boom(): raise RuntimeError("boom inside")
def leaves(): sys.exit(3)
def interrupts(): raise KeyboardInterrupt
def typo(): return len(3)
def needs(width): return Tiny()
def frozen(): return nn.Flatten()
def hangs(): threading.Event().wait()
def bad_forward():
    m = Tiny(); m.forward = Boom().forward; return m
def pair():
    m = Tiny(); m.forward = lambda x: (x, x); return m
'''


@pytest.mark.parametrize(("factory", "said"), [
    ("boom", "the factory t6h:boom raised RuntimeError: boom inside"),
    ("leaves", "the factory t6h:leaves raised SystemExit: 3"),
    ("interrupts", "the factory t6h:interrupts raised KeyboardInterrupt"),
    ("typo", "the factory t6h:typo raised TypeError: object of type 'int' has no len"),
    ("needs", "must build the model with no arguments"),
    ("frozen", "no trainable parameters"),
    ("hangs", "did not return within 0.3 s"),
    ("bad_forward", "forward of the model t6h:bad_forward() on one input of [3, 2, 2] raised "
                    "KeyError"),
    ("pair", "returns a tuple for one input"),
])
def test_every_failure_of_a_factory_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             factory: str, said: str) -> None:
    (tmp_path / "t6h.py").write_text(HOSTILE_FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("FEDLEAK_FACTORY_DEADLINE", "0.3")
    trust(f"t6h:{factory}")
    with pytest.raises(ModelError) as refused:
        build_model(f"t6h:{factory}", (3, 2, 2), 2)
    assert said in str(refused.value)
    trust("t6h:Tiny")
    assert tuple(build_model("t6h:Tiny", (3, 2, 2), 2)(torch.zeros(1, 3, 2, 2)).shape) == (1, 2)


def test_an_image_folder_at_its_own_size_and_normalisation(tmp_path: Path) -> None:
    folder = photo_folder(tmp_path / "photos", 10, 64)
    name = with_look("imagefolder", 48, "0.5/0.5")
    assert name == "imagefolder:size=48,mean=0.5;0.5;0.5,std=0.5;0.5;0.5"
    assert folder_look(name)[1].size == 48
    data = load_dataset(name, "all", folder)
    assert data.images.shape == (10, 3, 48, 48) and data.info.mean == (0.5, 0.5, 0.5)
    assert data.info.name == name and data.info.shape == (3, 48, 48)
    assert load_dataset("imagefolder", "all", folder).images.shape[-1] == 32
    with pytest.raises(FolderLookError, match="imagefolder"):
        with_look("photos", 224, None)
    with pytest.raises(FolderLookError, match="MEAN/STD"):
        with_look("imagefolder", None, "half")


def test_every_unusable_file_of_an_image_folder_is_named_at_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = photo_folder(tmp_path / "photos", 6, 8)
    bad = folder / "class-0"
    (bad / "empty.png").write_bytes(b"")
    (bad / "garbage.jpg").write_bytes(bytes(range(256)) * 4)
    (bad / "text.png").write_text("not a picture")
    whole = bad / "whole.png"
    Image.new("RGB", (64, 64), (10, 200, 30)).save(whole)
    (bad / "truncated.png").write_bytes(whole.read_bytes()[:60])
    Image.new("L", (400, 300)).save(bad / "large.png")  # 120,000 px: over the test's ceiling
    Image.new("L", (2, 200)).save(bad / "sliver.png")
    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 0, 255))]
    frames[0].save(bad / "moving.gif", save_all=True, append_images=frames[1:])
    (bad / "notes.txt").write_text("skipped")
    monkeypatch.setenv("FEDLEAK_MAX_IMAGE_PIXELS", "100000")
    with pytest.warns(SkippedFilesWarning, match="notes.txt"), \
            pytest.raises(DatasetError) as refused:
        load_dataset("imagefolder", "all", folder)
    said = str(refused.value)
    for name, reason in [("empty.png", "empty"), ("garbage.jpg", "not an image"),
                         ("text.png", "not an image"), ("truncated.png", "cannot be decoded"),
                         ("large.png", "over the ceiling of 100,000"),
                         ("sliver.png", "sliver"), ("moving.gif", "animated (2 frames)")]:
        assert f"{bad / name}: " in said and reason in said.split(name, 1)[1].split("\n")[0]
    assert "7 file(s)" in said and "whole.png" not in said
    for name in ("empty.png", "garbage.jpg", "text.png", "truncated.png", "large.png",
                 "sliver.png", "moving.gif"):
        (bad / name).unlink()
    Image.new("RGB", (8, 8)).save(bad / "still.gif")
    with pytest.warns(SkippedFilesWarning):
        data = load_dataset("imagefolder", "all", folder)
    assert data.images.shape == (8, 3, 32, 32)  # six crops, whole.png, the still GIF


@pytest.mark.e2e
def test_the_quickstart_net_on_fedleaks_victim_attacked_from_another_process(
        tmp_path: Path) -> None:
    folder = photo_folder(tmp_path / "photos", 10, 32)
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(EXAMPLE)])}
    args = ["--dataset", "imagefolder", "--data-root", str(folder), "--split", "all",
            "--normalization", "0.5/0.5", "--model", NET, "--batch-size", "4",
            "--protocol", "fedavg", "--local-batch-size", "2", "--lr", "0.1",
            "--momentum", "0.9", "--shuffle-batches", "--seed", "0"]
    with VictimProcess(args, env=env) as victim:
        def attack(*extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "fedleak", "attack", "--victim", victim.address,
                 "--attack", "fedavg-shuffled", "--iterations", "8", "--quiet",
                 "--out", str(tmp_path / "run"), *extra],
                capture_output=True, text=True, timeout=600,
                env={**os.environ, **env, "OMP_NUM_THREADS": "1"})

        refused = attack()
        assert refused.returncode != 0
        assert "--model-factory pytorchexample.task:Net" in refused.stderr + refused.stdout
        done = attack("--model-factory", NET)
        assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["victim_model"].startswith("factory:path=pytorchexample.task:Net")
    (entry,) = metrics["rounds"]
    assert entry["replay"] == "modelled" and entry["iterations"] == 8
    assert entry["mean_psnr"] is not None
    assert "8 of 8 iterations" in done.stdout
    torch.testing.assert_close(torch.tensor(metrics["rounds"][0]["num_images"]),
                               torch.tensor(4))
