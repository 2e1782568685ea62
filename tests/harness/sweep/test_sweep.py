"""Sweeps: spec expansion and validation, the crash-safe store, and real sweeps via the CLI.

The end-to-end tests run ``fedleak sweep`` as a person does, with victim processes on loopback;
one of them SIGKILLs the whole sweep (process group: the sweep, its workers and its victims)
half-way and checks that running it again finishes without repeating or losing a measurement.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedleak.harness.sweep.grid.spec import SpecError, load_preset, parse_spec
from fedleak.harness.sweep.runner import pack_units
from fedleak.harness.sweep.store import DuplicateMeasurement, ResultStore
from tests.helpers import tiny_spec
from tests.paths import REPO

SPEC = """
[sweep]
name = "unit"
dataset = "digits"
models = ["mlp:width=16,depth=1"]
rounds = 2
batch_size = 1

[[sweep.attack]]
name = "inverting-gradients"
iterations = 10

[sweep.utility]
rounds = 4
batch_size = 4

[[sweep.defense]]
reference = true

[[sweep.defense]]
name = "dpsgd"
param = "noise-multiplier"
values = [0.1, 1.0]
params = { max-grad-norm = 2.0 }

[[sweep.defense]]
chain = ["noise:sigma=0.01", "prune:p=0.5"]
label = "noise+prune"

[[sweep.defense]]
reference = true
"""


def fedleak(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fedleak", *args], capture_output=True,
                          text=True, timeout=timeout)


def rows(db: Path) -> list[tuple]:
    """Every measurement row, read-only (an empty list while the store is being created)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return con.execute("SELECT id, point_id, kind, metrics, started_at, finished_at "
                           "FROM measurements ORDER BY id").fetchall()
    except sqlite3.OperationalError as err:
        if "no such table" in str(err):
            return []
        raise
    finally:
        con.close()


# --------------------------------------------------------------------------- spec


def test_spec_expands_the_grid_with_stable_ids() -> None:
    spec = parse_spec(SPEC)
    points = spec.points()
    assert [p.label for p in points] == ["no defense", "dpsgd noise-multiplier=0.1",
                                         "dpsgd noise-multiplier=1.0", "noise+prune"]
    reference, weak, strong, chain = points  # the second reference table is the same point
    assert reference.reference and reference.defenses == () and reference.strength == 0.0
    assert weak.defenses == ("dpsgd:max-grad-norm=2.0,noise-multiplier=0.1",)
    assert (weak.group, weak.param, weak.strength) == ("dpsgd", "noise-multiplier", 0.1)
    assert chain.defenses == ("noise:sigma=0.01", "prune:p=0.5")
    assert reference.images == "0-1" and reference.rounds == 2
    assert reference.attack_options == {"iterations": 10}
    assert len({p.point_id for p in points}) == 4
    assert [p.point_id for p in parse_spec(SPEC).points()] == [p.point_id for p in points]
    changed = parse_spec(SPEC.replace("iterations = 10", "iterations = 11")).points()
    assert not {p.point_id for p in changed} & {p.point_id for p in points}
    victim = weak.victim_settings()  # the point starts its victims from typed settings
    assert victim.defenses == weak.defenses and victim.dataset == "digits"


def test_point_ids_are_stable_across_versions() -> None:
    """A run folder written by an earlier fedleak resumes: the quick preset's ids are fixed
    (its adaptive attack's points keep the ids of the single-attack preset before the
    portfolio; the plain attack's ten points come after them). Since 0.2.0 the preset also
    audits every setting, which is part of what is measured: without its audit table a point
    has the id it always had, with it a new one."""
    points = load_preset("quick").points()
    assert all(p.audit is not None for p in points)
    assert all(dataclasses.replace(p, audit=None).point_id != p.point_id for p in points)
    assert [dataclasses.replace(p, audit=None).point_id for p in points][:10] == [
        "0fa89b108588eeb7", "fc5726d5b1a4c43d", "9f60a761d62278ea", "82ecbd19a1016717",
        "46402144df103a15", "d221b8825c6884c5", "cf2b4c8aa6556445", "e9e0f1428077f8e3",
        "e14d074d9506b0f3", "0b26cfc781062bf2"]


BENCH_SPECS = sorted((REPO / "bench" / "specs").glob("*.toml"))


@pytest.mark.parametrize("path", BENCH_SPECS, ids=[p.stem for p in BENCH_SPECS])
def test_bench_specs_still_parse(path: Path) -> None:
    """The specs behind README's figures load with today's attacks and options."""
    from fedleak.harness.sweep.grid.spec import load_spec

    spec = load_spec(path)
    assert spec.points()
    if "portfolio" in path.stem:
        assert spec.portfolio and len({p.attack for p in spec.points()}) == 2


def test_quick_preset_covers_dpsgd_prune_and_noise_against_a_reference() -> None:
    spec = load_preset("quick")
    assert spec.portfolio and len(spec.attacks) == 2  # adaptive and plain, worst case reported
    points = [p for p in spec.points() if "objective" not in p.attack_options]
    groups = [p.group for p in points]
    assert groups.count("none") == 1 and points[0].reference
    for name in ("dpsgd", "prune", "noise"):
        strengths = [p.strength for p in points if p.group == name]
        assert len(strengths) == 3 and strengths == sorted(strengths)


@pytest.mark.parametrize("change, message", [
    ('name = "dpsgd"', "unknown defense 'dpsgdx'; choose one of client-dp, clip, dpsgd"),
    ('param = "noise-multiplier"', "has no option 'sigmaa'; valid: noise-multiplier"),
    ("values = [0.1, 1.0]", "noise-multiplier must be >= 0"),
    ('name = "inverting-gradients"',
     "unknown attack 'ig'; choose one of analytic, cocktail-party, dager, dlg"),
    ("iterations = 10", "has no option 'iterationz'; valid: iterations"),
    ('models = ["mlp:width=16,depth=1"]', "unknown model 'vgg'; choose one of lenet-zhu"),
    ('dataset = "digits"', "unknown data set 'mnist'; choose one of digits"),
    ("batch_size = 4", "unknown key(s) batchsize; valid: batch_size"),
    ("rounds = 2", "sweep.rounds must be an integer >= 1"),
])
def test_spec_errors_name_the_table_and_the_valid_choices(change: str, message: str) -> None:
    bad = {
        'name = "dpsgd"': 'name = "dpsgdx"',
        'param = "noise-multiplier"': 'param = "sigmaa"',
        "values = [0.1, 1.0]": "values = [-1.0]",
        'name = "inverting-gradients"': 'name = "ig"',
        "iterations = 10": "iterationz = 10",
        'models = ["mlp:width=16,depth=1"]': 'models = ["vgg"]',
        'dataset = "digits"': 'dataset = "mnist"',
        "batch_size = 4": "batchsize = 4",
        "rounds = 2": "rounds = 0",
    }[change]
    with pytest.raises(SpecError) as err:
        parse_spec(SPEC.replace(change, bad, 1))
    assert message in str(err.value)


def test_spec_refuses_what_cannot_run() -> None:
    with pytest.raises(SpecError, match="at least one"):
        parse_spec('[sweep]\ndataset = "digits"\n')
    with pytest.raises(SpecError, match="secagg"):
        parse_spec(tiny_spec('[[sweep.defense]]\nchain = ["secagg"]'))
    with pytest.raises(SpecError, match="at most one per-example"):
        parse_spec(tiny_spec('[[sweep.defense]]\nchain = ["dpsgd", "dpsgd"]'))
    with pytest.raises(SpecError, match="not valid TOML"):
        parse_spec("[sweep")


def test_a_grid_too_large_is_refused_before_a_point_is_built() -> None:
    """A million points used to be accepted silently (--list: 110 s, 937 MB)."""
    values = ", ".join(str(i / 10) for i in range(1, 1001))
    huge = SPEC.replace("values = [0.1, 1.0]", f"values = [{values}]").replace(
        'models = ["mlp:width=16,depth=1"]',
        "models = [" + ", ".join(f'"mlp:width={w},depth=1"' for w in range(1, 12)) + "]")
    with pytest.raises(SpecError) as refused:
        parse_spec(huge)  # 1 attack x 11 models x 1,003 defense settings
    assert "11,033 points" in str(refused.value) and "--max-points 11033" in str(refused.value)
    assert len(parse_spec(huge, max_points=11_033).models) == 11


def test_the_cli_names_the_flag_for_a_large_grid(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from fedleak.harness.cli.sweep_command import sweep

    spec = tmp_path / "big.toml"
    spec.write_text(SPEC)  # 1 attack x 1 model x 5 defense settings
    refused = CliRunner().invoke(sweep, [str(spec), "--list", "--max-points", "4"])
    assert refused.exit_code == 2 and "--max-points 5" in refused.output
    listed = CliRunner().invoke(sweep, [str(spec), "--list", "--out", str(tmp_path / "run")])
    assert listed.exit_code == 0 and len(listed.output.strip().splitlines()) == 4


def test_an_interrupted_sweep_leaves_no_point_running(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    """SIGINT (KeyboardInterrupt) in the middle of a point: the store keeps what it had and
    the point goes back to pending; a point a killed sweep left running is released too."""
    import fedleak.harness.sweep.runner as runner

    def interrupted(*_: object, **__: object) -> list:
        raise KeyboardInterrupt

    spec = parse_spec(SPEC)
    first = spec.points()[0].point_id
    with ResultStore(tmp_path / "results.sqlite") as store:
        store.add_points(spec.points())
        store.set_status(first, "running")  # as a sweep killed with SIGKILL leaves it
    monkeypatch.setattr(runner, "measure_pack", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runner.run_sweep(spec, tmp_path, runner.SweepOptions(show_progress=False),
                         echo=lambda _: None)
    with ResultStore(tmp_path / "results.sqlite") as store:
        statuses = {p.status for p in store.points()}
    assert statuses == {"pending"}


# --------------------------------------------------------------------------- store


def test_store_commits_each_measurement_and_refuses_duplicates(tmp_path: Path) -> None:
    points = parse_spec(SPEC).points()
    db = tmp_path / "results.sqlite"
    with ResultStore(db) as store:
        store.add_points(points)
        store.add_points(points)  # idempotent
        first = points[0].point_id
        assert not store.done(first, "attack")
        row = store.record(first, "attack", {"mean_psnr": 12.5}, started_at=time.time())
        assert store.done(first, "attack") and not store.done(first, "utility")
        with pytest.raises(DuplicateMeasurement):
            store.record(first, "attack", {"mean_psnr": 1.0}, started_at=time.time())
        store.set_status(first, "running")
    # another connection (a re-run) sees the committed row, untouched
    with ResultStore(db) as store:
        assert [p.point.point_id for p in store.points()] == [p.point_id for p in points]
        (m,) = store.measurements()
        assert (m.id, m.point_id, m.kind, m.metrics) == (row, first, "attack",
                                                         {"mean_psnr": 12.5})
        assert store.points()[0].status == "running"
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


# --------------------------------------------------------------------------- end to end


@pytest.mark.e2e
def test_tiny_sweep_end_to_end_via_the_cli(tmp_path: Path) -> None:
    spec = tmp_path / "tiny.toml"
    spec.write_text(tiny_spec('[[sweep.defense]]\nname = "prune"\nparam = "p"\nvalues = [0.9]'))
    out = tmp_path / "run"
    done = fedleak("sweep", str(spec), "--out", str(out), "--jobs", "2", "--quiet")
    assert done.returncode == 0, done.stderr
    assert "2 point(s) measured, 0 already done, 0 failed" in done.stdout
    assert "no defense" in done.stdout and "prune p=0.9" in done.stdout  # summary table
    measured = rows(out / "results.sqlite")
    assert sorted((r[1], r[2]) for r in measured) == sorted(
        (p.point_id, k) for p in parse_spec(spec.read_text()).points()
        for k in ("attack", "utility"))
    assert (out / "report.html").exists() and (out / "report" / "privacy-utility.png").exists()
    csv = (out / "report" / "results.csv").read_text().splitlines()
    assert len(csv) == 3 and csv[0].startswith("point_id,label")

    again = fedleak("sweep", str(spec), "--out", str(out), "--quiet", "--no-report")
    assert again.returncode == 0, again.stderr
    assert "2 of 2 point(s) already measured" in again.stdout
    assert rows(out / "results.sqlite") == measured
    page = fedleak("report", str(out))
    assert page.returncode == 0 and "report.html" in page.stdout

    if not torch.cuda.is_available():
        bad = fedleak("sweep", str(spec), "--out", str(out), "--device", "cuda")
        assert bad.returncode == 2 and "CUDA is not available" in bad.stderr
    bad = fedleak("sweep", str(spec), "--preset", "quick")
    assert bad.returncode == 2 and "SPEC.toml or --preset" in bad.stderr
    spec.write_text(tiny_spec('[[sweep.defense]]\nname = "prunex"'))
    bad = fedleak("sweep", str(spec), "--out", str(out))
    assert bad.returncode == 2 and "choose one of client-dp, clip, dpsgd" in bad.stderr


def test_points_differing_only_in_defenses_are_attacked_as_one_pack(tmp_path: Path) -> None:
    """--pack-points 3: the three points' victims run side by side and each round is packed:
    the two pruned points' rounds as one computation per half of the default attack (the aware
    and the blind parts, metrics.json says packed_with 2), the undefended point's at the full
    budget (nothing to pack it with); every point measures what it measures alone."""
    spec = tmp_path / "pack.toml"
    spec.write_text(tiny_spec('[[sweep.defense]]\nname = "prune"\nparam = "p"\n'
                              'values = [0.9, 0.99]', utility_rounds=1))
    points = parse_spec(spec.read_text()).points()
    scores = {}
    for pack in ("3", "1"):
        out = tmp_path / f"pack-{pack}"
        done = fedleak("sweep", str(spec), "--out", str(out), "--quiet", "--no-report",
                       "--pack-points", pack)
        assert done.returncode == 0, done.stderr
        assert "3 point(s) measured, 0 already done, 0 failed" in done.stdout
        for point in points:
            run = json.loads((out / "points" / point.point_id / "attack" / "metrics.json")
                             .read_text())
            assert [r.get("packed_with") for r in run["rounds"]] == (
                [2] if pack == "3" and point.defenses else [None])
        scores[pack] = {r[1]: json.loads(r[3])["mean_psnr"] for r in rows(out / "results.sqlite")
                        if r[2] == "attack"}
    assert scores["3"] == pytest.approx(scores["1"], abs=0.05)


def test_a_failed_pack_attacks_its_points_alone(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    """When the packed attack fails (say one point's defense breaks its victim), each point is
    measured alone, so only the bad point fails and its pack mates lose nothing."""
    import fedleak.harness.sweep.measure.point as measure_module
    from fedleak.harness.sweep.measure.point import Credentials, Needs, measure_pack

    points = parse_spec(SPEC).points()[:3]
    alone: list[tuple[str, Needs]] = []

    def broken_pack(*_: object, **__: object) -> list:
        raise RuntimeError("victim of point 2 died")

    def one(point, root, checkpoint, needs, credentials, progress, on_measured, device):
        alone.append((point.point_id, needs))
        if point is points[1]:
            raise ValueError("bad defense")

    class Sink:
        def start(self, *_: object) -> None: ...
        def advance(self, *_: object) -> None: ...
        def end(self, *_: object) -> None: ...

    monkeypatch.setattr(measure_module, "measure_attacks_packed", broken_pack)
    monkeypatch.setattr(measure_module, "measure", one)
    errors = measure_pack(points, tmp_path, [None] * 3, [Needs(True, True)] * 3, Credentials(),
                          Sink(), [lambda *_: None] * 3)
    assert [type(e).__name__ if e else None for e in errors] == [None, "ValueError", None]
    assert alone == [(p.point_id, Needs(True, True)) for p in points]


def test_pack_units_group_points_that_differ_only_in_defenses() -> None:
    points = parse_spec(SPEC).points()  # one reference, two dpsgd, one chain: same attack
    units = pack_units(points, [True] * len(points), 3)
    assert [len(u) for u in units] == [3, 1]
    assert [p for u in units for p in u] == points  # in order, nothing lost or repeated
    assert [len(u) for u in pack_units(points, [True, False, True, True], 2)] == [2, 1, 1]
    assert [len(u) for u in pack_units(points, [True] * len(points), 1)] == [1, 1, 1, 1]
    other = dataclasses.replace(points[1], seed=9)  # another seed: another problem
    assert [len(u) for u in pack_units([points[0], other, points[2]], [True] * 3, 3)] == [2, 1]


@pytest.mark.e2e
def test_sigkill_half_way_then_rerun_repeats_and_loses_nothing(tmp_path: Path) -> None:
    spec = tmp_path / "kill.toml"
    spec.write_text(tiny_spec('[[sweep.defense]]\nname = "noise"\nparam = "sigma"\n'
                              "values = [0.01, 0.1, 1.0]", iterations=30))
    points = parse_spec(spec.read_text()).points()
    expected = {(p.point_id, k) for p in points for k in ("attack", "utility")}
    out = tmp_path / "run"
    db = out / "results.sqlite"
    command = [sys.executable, "-m", "fedleak", "sweep", str(spec), "--out", str(out),
               "--quiet", "--no-report"]
    sweep = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 900  # held at a load average of 20 on 2 cores
        before: list[tuple] = []
        while time.monotonic() < deadline and sweep.poll() is None:
            before = rows(db) if db.exists() else []
            if before:
                break
            time.sleep(0.05)
        assert before and sweep.poll() is None, "the sweep ended before it could be killed"
        os.killpg(sweep.pid, signal.SIGKILL)  # the sweep and its victim processes
        sweep.wait(300)
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
    killed_at = time.time()
    survived = rows(db)
    assert before and set(before) <= set(survived)
    assert len(survived) < len(expected), "the kill came too late to be half-way"

    done = fedleak("sweep", str(spec), "--out", str(out), "--quiet", "--no-report")
    assert done.returncode == 0, done.stderr
    after = rows(db)
    assert {(r[1], r[2]) for r in after} == expected
    assert len(after) == len(expected)  # every point done exactly once
    assert after[:len(survived)] == survived  # the finished ones untouched: ids, times, metrics
    assert all(r[4] >= killed_at - 1 for r in after[len(survived):])  # only new work re-run
    finished = {r[1] for r in survived if r[2] == "utility"}  # both measurements held
    if finished:
        assert f"{len(finished)} of {len(points)} point(s) already measured" in done.stdout


@pytest.mark.e2e
def test_sweep_against_a_victim_the_user_runs(tmp_path: Path) -> None:
    from fedleak.harness.sweep.results import load_results
    from fedleak.harness.sweep.runner import SweepOptions, run_sweep
    from fedleak.harness.victim.process import VictimProcess

    args = ["--dataset", "digits", "--images", "0-1", "--model", "mlp:width=16,depth=1",
            "--allow-reveal", "--defense", "prune:p=0.5"]
    spec = parse_spec(tiny_spec("", rounds=2, utility_rounds=2))
    with VictimProcess(args, token="user-token") as victim:
        options = SweepOptions(victims=(victim.address,), token="user-token",
                               show_progress=False)
        outcome = run_sweep(spec, tmp_path / "run", options, echo=lambda _: None)
    assert not outcome.failed and len(outcome.measured) == 1
    (result,) = load_results(tmp_path / "run")
    assert result.group == "prune" and not result.reference  # what the victim runs
    assert result.attack is not None and result.attack.defenses == ["prune:p=0.5,scope=layer"]
    assert len(result.picture_files()) == 2 and result.accuracy is not None
    assert "comparison" in result.picture_files()[0]  # the token let the sweep reveal


def test_ray_without_the_extra_is_a_clear_error(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(tiny_spec(""))
    code = ("import sys; sys.modules['ray'] = None\n"
            "from fedleak.harness.cli.main import main\n"
            f"main(['sweep', {str(spec)!r}, '--ray', '--out', {str(tmp_path / 'run')!r}])")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=1200)
    assert run.returncode == 2 and "pip install 'fedleak[ray]'" in run.stderr
