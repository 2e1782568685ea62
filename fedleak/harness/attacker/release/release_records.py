"""Typed records of a run against a released model (Haim et al. 2022): the release as the
server received it, the KKT candidates it submitted, and the victim's per-training-sample
scores, each sample beside its trivial floor (the best constant guess, scored by the victim),
written as ``metrics.json`` and summarised for the terminal like an update run's
(:mod:`~fedleak.harness.attacker.records`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedleak.harness.attacker.records import METRICS_NAME, OMIT, RunHeader, to_json, write_json
from fedleak.harness.metrics.floors import FloorSummary, floor_words


@dataclass
class ReleaseRecord:
    """The release as the server received it."""

    release_id: str
    num_train: int
    binary_task: str
    epochs: int
    loss: float
    train_accuracy: float
    reached_target: bool
    metadata: dict[str, str]
    wall_time_s: float


@dataclass
class CandidatesRecord:
    """What the KKT search produced and submitted."""

    iterations: int
    candidates: int
    submitted: int
    run_settings: Any
    run_objectives: Any
    run_diverged: Any
    wall_time_s: float


@dataclass
class ReleaseSummary:
    """The victim's counts and means over the training set; ``floors`` the samples' trivial
    floors (None from a victim that scores none) and ``recovered_above_floor`` the samples
    recovered at ``recovered_ssim`` *and* ≥ ``floors.margin_db`` of PSNR above their floor."""

    recovered: int
    recovered_ssim: float
    num_train: int
    mean_ssim: float
    mean_psnr: float
    max_ssim: float
    floors: FloorSummary | None = field(default=None, metadata=OMIT)
    recovered_above_floor: int | None = field(default=None, metadata=OMIT)


@dataclass
class TrainingSampleRecord:
    """The victim's score of one training sample: its best candidate by App. B.3 voting."""

    index: int
    nearest_candidate: int
    ssim: float
    psnr: float
    mse: float
    margin: float
    voters: int
    #: the sample's trivial floor (best constant guess), its SSIM and which guess it is
    floor_psnr: float | None = field(default=None, metadata=OMIT)
    floor_ssim: float | None = field(default=None, metadata=OMIT)
    floor_guess: str | None = field(default=None, metadata=OMIT)


@dataclass
class ReleaseRun:
    """A run against a released model (Haim et al. 2022)."""

    header: RunHeader
    defenses: list[str]
    release: ReleaseRecord
    reconstruction: CandidatesRecord
    summary: ReleaseSummary
    training_samples: list[TrainingSampleRecord]
    files: dict[str, str] = field(default_factory=dict)
    local_voting_matches_victim: bool | None = None
    reveal_error: str | None = None
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        header = to_json(self.header)
        out: dict[str, Any] = {"fedleak_version": header.pop("fedleak_version"),
                               "threat_model": "release", "victim": header.pop("victim"),
                               "victim_model": header.pop("victim_model"),
                               "dataset": header.pop("dataset"), "defenses": self.defenses}
        out.update(header)
        for key in ("release", "reconstruction", "summary", "training_samples", "files",
                    "warnings"):
            out[key] = to_json(getattr(self, key))
        for key in ("local_voting_matches_victim", "reveal_error"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    def write(self, out: Path) -> None:
        write_json(out / METRICS_NAME, self.to_json())

    def summary_lines(self, out: Path) -> list[str]:
        """Counts, the ten best-recovered samples, the files."""
        s, r = self.summary, self.release
        lines = ["", f"{'sample':>6}  {'SSIM':>6}  {'PSNR dB':>7}  {'margin':>8}  {'voters':>6}"]
        for t in sorted(self.training_samples, key=lambda t: -t.ssim)[:10]:
            lines.append(f"{t.index:>6}  {t.ssim:>6.3f}  {t.psnr:>7.2f}  {t.margin:>8.3g}  "
                         f"{t.voters:>6}")
        eps = r.metadata.get("epsilon")
        lines.append(f"recovered {s.recovered}/{s.num_train} training samples at SSIM >= "
                     f"{s.recovered_ssim:g} (mean SSIM {s.mean_ssim:.3f})"
                     + (f"; DP release, epsilon {eps}" if eps else ""))
        lines += floor_lines(s)
        lines.append(f"metrics: {out / METRICS_NAME}")
        lines += [f"picture: {out / name}" for name in self.files.values()
                  if name.endswith(".png")]
        lines += [f"warning: {warning}" for warning in self.warnings]
        return lines


def floor_lines(s: ReleaseSummary) -> list[str]:
    """The release's figures beside their floor: the mean PSNR and SSIM against the floor's,
    the floor in words (:func:`~fedleak.harness.metrics.floors.floor_words`), and the recovered
    count that needs the floor margin too."""
    if s.floors is None:
        return []
    f = s.floors
    return [f"mean PSNR {s.mean_psnr:.2f} dB, mean SSIM {s.mean_ssim:.3f}; {floor_words(f)}",
            f"recovered at SSIM >= {s.recovered_ssim:g} and >= {f.margin_db:g} dB above the "
            f"floor: {s.recovered_above_floor}/{s.num_train} training samples"]
