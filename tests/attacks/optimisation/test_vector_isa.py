"""Inductor's vector-ISA probe: run once per machine, remembered, trusted only where it passed."""

from __future__ import annotations

import json
import platform

import pytest
import torch._inductor.config as inductor_config

from fedleak.attacks.optimisation.engine import vector_isa

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                reason="Inductor starts probe processes on x86-64 only")


@pytest.fixture(autouse=True)
def untrusted(monkeypatch):
    """Every test starts as a process would: ``cpp.vec_isa_ok`` unset, a listed CPU."""
    monkeypatch.setattr(vector_isa, "listed_isas", lambda: ["avx512", "avx2"])
    with inductor_config.patch({"cpp.vec_isa_ok": None}):  # restored after the test
        yield


def test_the_probe_runs_once_and_a_later_process_trusts_its_answer(monkeypatch, tmp_path):
    probes = []
    monkeypatch.setattr(vector_isa, "probed_isas", lambda: probes.append(1) or ["avx512", "avx2"])
    assert vector_isa.trust_probed_isa(tmp_path)
    assert inductor_config.cpp.vec_isa_ok is True and probes == [1]
    record = json.loads((tmp_path / vector_isa.RECORD).read_text())
    assert list(record.values()) == [True]
    inductor_config.cpp.vec_isa_ok = None  # a later process
    monkeypatch.setattr(vector_isa, "probed_isas", lambda: pytest.fail("probed again"))
    assert vector_isa.trust_probed_isa(tmp_path)
    assert inductor_config.cpp.vec_isa_ok is True


def test_an_isa_that_failed_its_probe_trusts_nothing(monkeypatch, tmp_path):
    probes = []
    monkeypatch.setattr(vector_isa, "probed_isas", lambda: probes.append(1) or ["avx2"])
    assert not vector_isa.trust_probed_isa(tmp_path)
    assert inductor_config.cpp.vec_isa_ok is None  # Inductor probes, as before
    assert not vector_isa.trust_probed_isa(tmp_path)
    assert probes == [1]  # the failure is remembered too


def test_another_cpu_or_compiler_is_probed_anew(monkeypatch, tmp_path):
    probes = []
    monkeypatch.setattr(vector_isa, "probed_isas",
                        lambda: probes.append(1) or vector_isa.listed_isas())
    vector_isa.trust_probed_isa(tmp_path)
    inductor_config.cpp.vec_isa_ok = None
    monkeypatch.setattr(vector_isa, "listed_isas", lambda: ["avx2"])  # another CPU
    vector_isa.trust_probed_isa(tmp_path)
    inductor_config.cpp.vec_isa_ok = None
    monkeypatch.setattr(vector_isa, "compiler_identity", lambda: "/usr/bin/g++-13:1:2")
    vector_isa.trust_probed_isa(tmp_path)
    assert probes == [1, 1, 1]
    assert len(json.loads((tmp_path / vector_isa.RECORD).read_text())) == 3


def test_the_users_setting_and_a_broken_record_are_handled(monkeypatch, tmp_path):
    inductor_config.cpp.vec_isa_ok = False  # TORCHINDUCTOR_VEC_ISA_OK=0
    assert not vector_isa.trust_probed_isa(tmp_path)
    assert inductor_config.cpp.vec_isa_ok is False
    inductor_config.cpp.vec_isa_ok = None
    (tmp_path / vector_isa.RECORD).write_text("not json")
    monkeypatch.setattr(vector_isa, "probed_isas", vector_isa.listed_isas)
    assert vector_isa.trust_probed_isa(tmp_path)  # probed again, record rewritten
    assert json.loads((tmp_path / vector_isa.RECORD).read_text())
