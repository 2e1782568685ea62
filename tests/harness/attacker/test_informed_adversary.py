"""The informed-adversary game across two processes: `fedleak victim serve --informed-candidates`
and `fedleak informed-adversary`; what crosses the wire; the Fisher ceiling through Score."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import torch

from fedleak.harness.attacker.client import VictimClient, VictimError
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.wire.codec import decode_tensor
from fedleak.harness.zoo.datasets import load_dataset
from fedleak.v1 import victim_pb2 as pb

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GAME = ["--dataset", "digits", "--split", "train", "--images", "0-9", "--model",
        "mlp:width=8,depth=1", "--defense", "dpsgd:noise-multiplier=1,max-grad-norm=0.1",
        "--informed-candidates", "10", "--informed-known", "2", "--defense-seed", "0"]
#: everything InformedTrial carries: public records, the update, the public mechanism
TRIAL_FIELDS = {"trial_id", "candidates", "candidate_labels", "known_images", "known_labels",
                "update", "update_kind", "protocol", "num_images", "local_steps", "metadata",
                "threat_model"}


def fedleak(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "fedleak", *args], capture_output=True,
                          text=True, timeout=600, env=env)


@pytest.mark.e2e
def test_informed_adversary_game_via_the_cli(tmp_path: Path) -> None:
    with VictimProcess(GAME) as victim:
        out = tmp_path / "run"
        done = fedleak("informed-adversary", "--victim", victim.address, "--trials", "40",
                       "--out", str(out), "--quiet", "--bound-samples", "2000")
        assert done.returncode == 0, done.stderr
        assert "trials guessed the target" in done.stdout and "DP bound" in done.stdout
        record = json.loads((out / "metrics.json").read_text())
        s = record["summary"]
        assert (s["trials"], s["victim_trials"]) == (40, 40)  # the victim scored every guess
        assert s["successes"] == s["victim_successes"] == sum(t["success"]
                                                              for t in record["trials"])
        assert s["kappa"] == 0.1 and s["bound_method"] == "gaussian"
        assert s["adjacency"] == "add-remove"
        # seeded: the measured success never exceeds the bound beyond its interval
        assert s["exceeds_bound"] is False and s["ci_low"] <= s["bound"]
        assert "informed adversary" in record["threat_model"]
        assert (out / "informed-adversary.png").stat().st_size > 0
        assert all("target" not in key for t in record["trials"] for key in t)

        with VictimClient(victim.address) as client:
            check_what_crosses_the_wire(client)
            check_fisher_ceiling_through_score(client)


def check_what_crosses_the_wire(client: VictimClient) -> None:
    """A trial carries public records and the update, never the coin nor a private image."""
    assert set(pb.InformedTrial.DESCRIPTOR.fields_by_name) == TRIAL_FIELDS
    described = client.describe()
    assert described.informed_game.candidates == 10
    assert described.informed_game.prior_split == "test"
    params, buffers = client.global_model()
    trial = client.begin_informed_trial(params, buffers)
    sent = torch.cat([decode_tensor(trial.candidates, "c"), decode_tensor(trial.known_images,
                                                                          "k")])
    assert sent.shape == (12, 1, 8, 8)
    private = load_dataset("digits", "train").images[:10]
    distances = (sent[:, None] - private[None]).flatten(2).abs().amax(-1)
    assert float(distances.min()) > 0  # no private image among them
    assert trial.num_images == 3 and trial.metadata["dp_steps"] == "1"
    with pytest.raises(VictimError) as err:
        client.score_informed_guess(trial.trial_id, 10)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    client.score_informed_guess(trial.trial_id, 0)
    with pytest.raises(VictimError) as err:
        client.score_informed_guess(trial.trial_id, 1)
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION and "final" in str(err.value)


def check_fisher_ceiling_through_score(client: VictimClient) -> None:
    """One DP-SGD FedSGD round: Score answers a finite PSNR ceiling per private image."""
    params, buffers = client.global_model()
    update = client.compute_update(params, buffers)
    reply = client.score(update.round_id, torch.full((1, 1, 8, 8), 0.5))
    assert reply.fisher_bounded, reply.fisher_note
    ceiling = reply.images[0].fisher_psnr_ceiling
    assert math.isfinite(ceiling) and reply.mean_fisher_psnr_ceiling == ceiling
    assert "Guo et al." in reply.fisher_note


def test_a_victim_without_the_game_is_refused_by_name(tmp_path: Path) -> None:
    args = ["--dataset", "digits", "--split", "train", "--images", "0-1", "--model",
            "mlp:width=8,depth=1"]
    with VictimProcess(args) as victim:
        done = fedleak("informed-adversary", "--victim", victim.address, "--trials", "1",
                       "--out", str(tmp_path / "x"), "--quiet")
        assert done.returncode == 1 and "--informed-candidates" in done.stderr
        with VictimClient(victim.address) as client:
            params, buffers = client.global_model()
            update = client.compute_update(params, buffers)
            reply = client.score(update.round_id, torch.full((1, 1, 8, 8), 0.5))
            assert not reply.fisher_bounded and "no per-example Gaussian" in reply.fisher_note
    bad = fedleak("victim", "serve", "--dataset", "digits", "--split", "all",
                  "--informed-candidates", "10")
    assert bad.returncode != 0 and "--split train" in bad.stderr
