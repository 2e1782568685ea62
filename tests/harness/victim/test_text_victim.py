"""A text victim and a text attack as two processes: Describe, ComputeUpdate, Score on token ids
inside the victim, Reveal, bad input refused, secure aggregation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch

from fedleak.harness.attacker.client import VictimClient, VictimError
from fedleak.harness.attacker.text.text_described import text_info, text_server_model
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.zoo.text.tokenizer import load_tokenizer

pytestmark = pytest.mark.integration
TOKEN = "text-token"
MODEL = "gpt2:hidden=64,heads=2"


@pytest.fixture(scope="module")
def victim() -> Iterator[VictimProcess]:
    args = ["--dataset", "shakespeare", "--split", "test", "--model", MODEL, "--seq-len", "16",
            "--batch-size", "3", "--allow-reveal", "--canaries", "2", "--shuffle"]
    with VictimProcess(args, token=TOKEN) as process:
        yield process


def fedleak(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fedleak", *args], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "FEDLEAK_TOKEN": TOKEN})


def test_describe_publishes_the_text_facts(victim: VictimProcess) -> None:
    with VictimClient(victim.address, token=TOKEN) as client:
        described = client.describe()
    text = described.data.text
    assert list(described.data.shape) == [16] and text.seq_len == 16 and text.task == "lm"
    assert text.architecture == "decoder" and text.secrets == 2
    assert text.tokenizer_sha256 == load_tokenizer().sha256
    info = text_info(described)
    model = text_server_model(described, info)
    assert [p.name for p in described.parameters] == [n for n, _ in model.named_parameters()]


def test_token_set_attack_over_the_wire(victim: VictimProcess, tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = fedleak("attack", "--victim", victim.address, "--attack", "token-set", "--rounds",
                   "2", "--out", str(out), "--quiet")
    assert done.returncode == 0, done.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["threat_model"] == "text-update" and metrics["status"] == "finished"
    for r in metrics["rounds"]:
        assert r["token_precision"] == 1.0 and r["token_recall"] == 1.0
        assert r["tokens_recovered"] == r["tokens_true"] > 0
        assert (out / r["files"]["comparison"]).read_text().startswith("# round")
    assert "token set: mean precision 1.0000, recall 1.0000" in done.stdout


def test_dager_recovers_every_sentence_over_the_wire(victim: VictimProcess,
                                                   tmp_path: Path) -> None:
    out = tmp_path / "dager"
    done = fedleak("attack", "--victim", victim.address, "--attack", "dager", "--out", str(out),
                   "--quiet")
    assert done.returncode == 0, done.stderr
    entry = json.loads((out / "metrics.json").read_text())["rounds"][0]
    assert entry["rouge1"] == entry["rouge2"] == entry["rougeL"] == 1.0
    assert entry["exact"] == entry["num_sequences"] == 3
    # the floor: a most-frequent-token guess of every sentence, well below a full recovery
    assert 0 <= entry["floor_rouge1"] < 0.5 and entry["floor_rouge2"] == 0.0
    assert "floor (the most frequent token repeated)" in done.stdout
    comparison = (out / entry["files"]["comparison"]).read_text()
    assert "| yes |" in comparison and "private" in comparison  # revealed beside recovered


def test_token_set_on_a_fedavg_round_the_server_asks_for(victim: VictimProcess,
                                                        tmp_path: Path) -> None:
    out = tmp_path / "fedavg"
    done = fedleak("attack", "--victim", victim.address, "--attack", "token-set", "--protocol",
                   "fedavg", "--local-epochs", "2", "--local-batch-size", "2", "--lr", "0.01",
                   "--out", str(out), "--quiet")
    assert done.returncode == 0, done.stderr
    entry = json.loads((out / "metrics.json").read_text())["rounds"][0]
    assert entry["update_kind"] == "delta" and entry["local_steps"] == 4
    assert entry["token_precision"] == 1.0 and entry["token_recall"] == 1.0


def test_an_image_attack_is_refused_by_name(victim: VictimProcess, tmp_path: Path) -> None:
    done = fedleak("attack", "--victim", victim.address, "--attack", "dlg", "--out",
                   str(tmp_path / "x"), "--quiet")
    assert done.returncode != 0 and "token-set" in done.stderr


def test_score_checks_before_it_spends(victim: VictimProcess) -> None:
    with VictimClient(victim.address, token=TOKEN) as client:
        params, buffers = client.global_model()
        got = client.compute_update(params, buffers)
        for bad in (torch.full((3, 4), 10**6), torch.zeros(0, 4)):
            with pytest.raises(VictimError) as err:
                client.score_text(got.round_id, bad)
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(VictimError, match="holds text"):
            client.score(got.round_id, torch.zeros(3, 16))
        truth, labels = client.reveal(got.round_id)
        assert truth.shape == (3, 16) and labels.numel() == 0
        reply = client.score_text(got.round_id, truth)  # the private batch itself: exact
        assert reply.text.exact == 3 and reply.text.rouge1 == 1.0
        assert reply.text.token_precision == reply.text.token_recall == 1.0
        with pytest.raises(VictimError) as err:  # a submission is final
            client.score_text(got.round_id, truth)
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_secure_aggregation_of_text_users(tmp_path: Path) -> None:
    args = ["--dataset", "shakespeare", "--split", "test", "--model", MODEL, "--seq-len", "16",
            "--batch-size", "2", "--users", "2", "--defense", "secagg"]
    with VictimProcess(args, token=TOKEN) as process:
        out = tmp_path / "sum"
        done = fedleak("attack", "--victim", process.address, "--attack", "token-set", "--out",
                       str(out), "--quiet")
    assert done.returncode == 0, done.stderr
    entry = json.loads((out / "metrics.json").read_text())["rounds"][0]
    assert entry["num_sequences"] == 4  # both users' sentences are in the sum
    assert entry["token_precision"] == 1.0 and entry["token_recall"] == 1.0


def test_audit_a_dp_sgd_text_victim(tmp_path: Path) -> None:
    """DP-SGD on the transformer (per-example gradients under vmap) audited with a gradient
    canary: ε_LB beside the claim, no violation; an input canary is refused for text."""
    args = ["--dataset", "shakespeare", "--split", "test", "--model", MODEL, "--seq-len", "12",
            "--batch-size", "2", "--allow-audit", "--defense",
            "dpsgd:noise-multiplier=1.0,max-grad-norm=1.0"]
    with VictimProcess(args, token=TOKEN) as process:
        done = fedleak("audit", "--victim", process.address, "--trials", "60", "--out",
                       str(tmp_path / "audit"), "--quiet")
        assert done.returncode == 0, done.stderr
        refused = fedleak("audit", "--victim", process.address, "--canary", "input",
                          "--trials", "10", "--out", str(tmp_path / "input"), "--quiet")
        assert refused.returncode != 0 and "gradient canary" in refused.stderr
    report = json.loads((tmp_path / "audit" / "audit.json").read_text())
    assert 4.0 < report["claim"]["epsilon"] < 5.5  # σ = 1, one full-batch step, δ = 1e-5
    assert not report["violation"]
    assert all(b["epsilon"] <= report["claim"]["epsilon"] for b in report["bounds"]
               if not b["is_estimate"])
