"""Typed records of an attack run on a text victim: what ``metrics.json`` holds, the summary a
person reads, and the readable comparison of recovered and private sentences.

One :class:`TextRoundRecord` per attacked round with the victim's scores (ROUGE-1/2/L per
private sentence matched one-to-one, exact sentences, token-set precision and recall, canary
secrets); :class:`TextRun` adds the header shared with image runs
(:class:`~fedleak.harness.attacker.records.RunHeader`) and the run's summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedleak.harness.attacker.records import METRICS_NAME, OMIT, RunHeader, to_json, write_json
from fedleak.v1 import victim_pb2 as pb

#: the issue's bar for a recovered batch: ROUGE-1 and ROUGE-2 at least this
ROUGE_BAR = 0.99


@dataclass
class TextRoundRecord:
    """One attacked text round: what came back, what the attack found, the victim's scores."""

    round_id: str
    update_kind: str
    num_sequences: int
    local_steps: int
    victim_metadata: dict[str, str]
    iterations: int
    objective: float
    wall_time_s: float
    sequences: list[list[int]] = field(default_factory=list)
    token_set: list[int] | None = field(default=None, metadata=OMIT)
    rouge1: float | None = None
    rouge2: float | None = None
    rougeL: float | None = None  # noqa: N815 - the metric's own name
    exact: int | None = None
    sentences: list[dict[str, Any]] = field(default_factory=list)
    token_precision: float | None = None
    token_recall: float | None = None
    tokens_recovered: int | None = None
    tokens_true: int | None = None
    count_precision: float | None = field(default=None, metadata=OMIT)
    count_recall: float | None = field(default=None, metadata=OMIT)
    secrets: int | None = field(default=None, metadata=OMIT)
    secrets_recovered: int | None = field(default=None, metadata=OMIT)
    privacy: dict[str, float] | None = field(default=None, metadata=OMIT)
    defenses: list[str] | None = field(default=None, metadata=OMIT)
    attack_extras: dict[str, Any] | None = field(default=None, metadata=OMIT)
    files: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    unscored: str | None = field(default=None, metadata=OMIT)
    reveal_error: str | None = field(default=None, metadata=OMIT)
    #: the attack's budget counted in work (iterations of an optimisation attack)
    budget: int | None = field(default=None, metadata=OMIT)
    #: the floor: ROUGE-1/2/L of a most-frequent-token guess of every private sentence
    #: (:func:`~fedleak.harness.metrics.text_metrics.floor_rouge`), scored by the victim
    floor_rouge1: float | None = field(default=None, metadata=OMIT)
    floor_rouge2: float | None = field(default=None, metadata=OMIT)
    floor_rougeL: float | None = field(default=None, metadata=OMIT)  # noqa: N815

    def score(self, reply: pb.ScoreResponse) -> None:
        """Take the victim's ``Score`` answer (its ``text`` part)."""
        t = reply.text
        if t.sequences_scored:
            self.rouge1, self.rouge2, self.rougeL = t.rouge1, t.rouge2, t.rouge_l
            self.exact = t.exact
            self.sentences = [{"index": s.index, "matched_index": s.matched_index,
                               "rouge1": s.rouge1, "rouge2": s.rouge2, "rougeL": s.rouge_l,
                               "exact": s.exact, "padding": s.padding}
                              for s in t.sentence_scores]
        if t.floor_scored:
            self.floor_rouge1, self.floor_rouge2 = t.floor_rouge1, t.floor_rouge2
            self.floor_rougeL = t.floor_rouge_l
        if t.token_set_scored:
            self.token_precision, self.token_recall = t.token_precision, t.token_recall
            self.tokens_recovered, self.tokens_true = t.tokens_recovered, t.tokens_true
        if t.counts_scored:
            self.count_precision, self.count_recall = t.count_precision, t.count_recall
        if t.secrets:
            self.secrets, self.secrets_recovered = t.secrets, t.secrets_recovered

    @property
    def above_floor(self) -> bool | None:
        """Whether ROUGE-1 or ROUGE-2 exceeds the most-frequent-token guess's (None: either
        is unknown)."""
        if self.rouge1 is None or self.rouge2 is None or self.floor_rouge1 is None \
                or self.floor_rouge2 is None:
            return None
        return self.rouge1 > self.floor_rouge1 or self.rouge2 > self.floor_rouge2

    @property
    def recovered(self) -> bool:
        """ROUGE-1 and ROUGE-2 both at least :data:`ROUGE_BAR`."""
        return (self.rouge1 or 0.0) >= ROUGE_BAR and (self.rouge2 or 0.0) >= ROUGE_BAR


def mean_of(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


@dataclass
class TextRun:
    """A run against a text victim's updates."""

    header: RunHeader
    rounds: list[TextRoundRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    status: str = "running"
    #: why the run ended as it did (a Flower audit), and the phase a running audit is in
    status_reason: str | None = None
    phase: str | None = None

    def summary(self) -> dict[str, Any]:
        r = [x for x in self.rounds if x.unscored is None]
        scored = [x for x in r if x.rouge1 is not None]
        privacy = next((x.privacy for x in reversed(r) if x.privacy), {})
        return {
            "rounds": len(r), "sentences": sum(x.num_sequences for x in scored),
            "rouge1": mean_of([x.rouge1 for x in r]), "rouge2": mean_of([x.rouge2 for x in r]),
            "rougeL": mean_of([x.rougeL for x in r]),
            "exact": sum(x.exact or 0 for x in scored) if scored else None,
            "rounds_at_rouge_bar": sum(x.recovered for x in scored) if scored else None,
            "rouge_bar": ROUGE_BAR,
            "floor_rouge1": mean_of([x.floor_rouge1 for x in r]),
            "floor_rouge2": mean_of([x.floor_rouge2 for x in r]),
            "floor_rougeL": mean_of([x.floor_rougeL for x in r]),
            "rounds_above_floor": sum(bool(x.above_floor) for x in scored)
            if any(x.above_floor is not None for x in scored) else None,
            "token_precision": mean_of([x.token_precision for x in r]),
            "token_recall": mean_of([x.token_recall for x in r]),
            "secrets": sum(x.secrets or 0 for x in r),
            "secrets_recovered": sum(x.secrets_recovered or 0 for x in r),
            "wall_time_s": float(sum(x.wall_time_s for x in self.rounds)),
            "epsilon": privacy.get("epsilon_total"), "delta": privacy.get("delta"),
        }

    def to_json(self) -> dict[str, Any]:
        return {**to_json(self.header), "threat_model": "text-update", "status": self.status,
                **({"status_reason": self.status_reason} if self.status_reason else {}),
                **({"phase": self.phase} if self.phase else {}),
                "rounds": to_json(self.rounds), "summary": self.summary(),
                "warnings": list(self.warnings)}

    def write(self, out: Path) -> None:
        write_json(out / METRICS_NAME, self.to_json())

    def summary_lines(self, out: Path) -> list[str]:
        """One line per round, the means, and where the files are."""
        lines = ["", f"{'round':>5}  {'ROUGE-1':>7}  {'ROUGE-2':>7}  {'ROUGE-L':>7}  "
                     f"{'exact':>7}  {'token P':>7}  {'token R':>7}  {'time s':>7}"]
        for i, r in enumerate(self.rounds):
            if r.unscored:
                lines.append(f"{i:>5}  unscored: {r.unscored}")
                continue
            exact = "-" if r.exact is None else f"{r.exact}/{r.num_sequences}"
            lines.append(f"{i:>5}  {_f(r.rouge1):>7}  {_f(r.rouge2):>7}  {_f(r.rougeL):>7}  "
                         f"{exact:>7}  {_f(r.token_precision):>7}  {_f(r.token_recall):>7}  "
                         f"{r.wall_time_s:>7.1f}")
        s = self.summary()
        if s["rouge1"] is not None:
            lines.append(f"mean ROUGE-1 {s['rouge1']:.4f}, ROUGE-2 {s['rouge2']:.4f}, ROUGE-L "
                         f"{s['rougeL']:.4f}; {s['exact']} of {s['sentences']} sentence(s) "
                         f"exact; {s['rounds_at_rouge_bar']} of {s['rounds']} round(s) with "
                         f"ROUGE-1 and ROUGE-2 >= {ROUGE_BAR}")
        if s["floor_rouge1"] is not None:
            lines.append(floor_line(s))
        if s["token_precision"] is not None:
            lines.append(f"token set: mean precision {s['token_precision']:.4f}, recall "
                         f"{s['token_recall']:.4f}")
        if s["secrets"]:
            lines.append(f"canary secrets recovered: {s['secrets_recovered']} of "
                         f"{s['secrets']}")
        if s["epsilon"] is not None:
            lines.append(f"privacy spent (the victim's DP accountant): ε = {s['epsilon']:.4g}")
        lines.append(f"metrics: {out / METRICS_NAME}")
        for r in self.rounds:
            if "comparison" in r.files:
                lines.append(f"text: {out / r.files['comparison']}")
        lines += [f"warning: {w}" for w in
                  [*self.warnings, *sorted({w for r in self.rounds for w in r.warnings})]]
        return lines


def floor_line(summary: dict[str, Any]) -> str:
    """The run's floor beside its ROUGE, in words when no round is above it."""
    where = (f"floor (the most frequent token repeated): ROUGE-1 {summary['floor_rouge1']:.4f}, "
             f"ROUGE-2 {summary['floor_rouge2']:.4f}, ROUGE-L {summary['floor_rougeL']:.4f}")
    if summary["rounds_above_floor"] == 0:
        return f"no sentence recovered beyond a most-frequent-token guess ({where})"
    return f"{summary['rounds_above_floor']} of {summary['rounds']} round(s) above it ({where})"


def floor_note(record: TextRoundRecord) -> str:
    """A round's floor beside its ROUGE (empty without one)."""
    if record.floor_rouge1 is None:
        return ""
    words = "" if record.above_floor else ": nothing beyond it"
    return (f" (floor: most-frequent-token guess ROUGE-1 {record.floor_rouge1:.4f}, "
            f"ROUGE-2 {record.floor_rouge2:.4f}{words})")


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def comparison_markdown(title: str, recovered: list[str], record: TextRoundRecord,
                        private: list[str] | None) -> str:
    """The round as a person reads it: each private sentence (when revealed) beside the
    recovered sentence matched to it, with its scores; then the recovered token set size."""
    lines = [f"# {title}", ""]
    if record.rouge1 is not None:
        lines.append(f"ROUGE-1 {record.rouge1:.4f}, ROUGE-2 {record.rouge2:.4f}, ROUGE-L "
                     f"{record.rougeL:.4f}, exact {record.exact} of {record.num_sequences}"
                     f"{floor_note(record)}")
        lines.append("")
    if record.sentences:
        head = "| # | private | recovered | R-1 | R-2 | R-L | exact |" if private else \
            "| # | recovered | R-1 | R-2 | R-L | exact |"
        lines += [head, "|" + "|".join("---" for _ in range(head.count("|") - 1)) + "|"]
        for s in record.sentences:
            j = s["matched_index"]
            got = _cell(recovered[j]) if 0 <= j < len(recovered) else "(none)"
            if s["padding"]:
                got = "(nothing recovered: see why below)" if record.warnings else \
                    "(nothing recovered)"
            cells = [str(s["index"])] + ([_cell(private[s["index"]])] if private else []) + \
                [got, f"{s['rouge1']:.3f}", f"{s['rouge2']:.3f}", f"{s['rougeL']:.3f}",
                 "yes" if s["exact"] else ""]
            lines.append("| " + " | ".join(cells) + " |")
    elif recovered:
        lines += [f"- {_cell(t)}" for t in recovered]
    if record.warnings:  # why the attack recovered less than the batch, in its own words
        lines += ["", "The attack said:", *[f"- {_cell(w)}" for w in record.warnings]]
    if record.token_precision is not None:
        lines += ["", f"token set: {record.tokens_recovered} id(s) submitted, precision "
                      f"{record.token_precision:.4f}, recall {record.token_recall:.4f} of the "
                      f"batch's {record.tokens_true}"]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") or "(empty)"
