"""DAGER in process, at the issue's size: ROUGE per batch, where it stops, LAMP/TAG beside it.

The server's view of each round is built by the harness's own in-process path
(``observe_text``: the victim's FedSGD update of the mean loss, no defense) from the bundled
Shakespeare's held-out ``test`` roles — text no attack was tuned on — with the bundled BPE
tokenizer (4096 tokens), and attacked by the registered attacks (``dager``, ``lamp``, ``tag``),
then scored as the victim scores (ROUGE-1/2 F over sentences matched one to one, padding never
counting, exact sentences). Models are random-initialised GPT-2 language models and BERT
classifiers (``--hidden`` 768, ``--layers`` 2, 12 heads; seed ``--seed``). Batches are
consecutive rows of the split (``--batch-size`` sentences of at most ``--seq-len`` tokens:
Shakespeare's speeches are 8–32 tokens, so B·T counts the tokens the batch really holds).

    OMP_NUM_THREADS=1 python bench/dager.py --part decoder --batches 10
    OMP_NUM_THREADS=1 python bench/dager.py --part encoder --batches 10
    OMP_NUM_THREADS=1 python bench/dager.py --part sweep --sweep 8,16,24,32,36,40,48
    OMP_NUM_THREADS=1 python bench/dager.py --part baselines --batches 2 --iterations 500

``--part sweep`` runs the decoder at growing batch sizes: the tokens in span (every token but
each sentence's last, which has no δ) against the hidden size d — the cliff. ``--part
baselines`` runs LAMP and TAG (``--iterations`` continuous steps, the projection restricted
to the batch's token set as the registered attacks do) on the first batches, beside DAGER's
work and time on the same batches. Rows go to ``--json`` as they finish. Wall times depend on
the machine's load: the load average is printed with them.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import click
import torch

from fedleak.attacks import create_attack
from fedleak.attacks.text_observation import TextObservation, TextReconstruction
from fedleak.harness.federated.text_observe import observe_text
from fedleak.harness.metrics.text_metrics import score_sentences
from fedleak.harness.zoo.text.text_datasets import TextDataset, load_text_dataset
from fedleak.harness.zoo.text.text_models import TextModel, build_text_model

#: the ROUGE bar of the issue
BAR = 0.99


def batch_round(data: TextDataset, model: TextModel, start: int, size: int,
                public: list[list[int]]) -> tuple[TextObservation, torch.Tensor]:
    """The server's view of one FedSGD round on rows ``start : start + size`` and the truth."""
    tokens, labels = data.tokens[start:start + size], data.labels[start:start + size]
    generator = torch.Generator().manual_seed(start)
    return observe_text(model, tokens, labels, data.info, generator=generator,
                        public_sequences=public), tokens


def scored(data: TextDataset, truth: torch.Tensor, found: TextReconstruction
           ) -> dict[str, Any]:
    tok = data.info.checked_tokenizer
    true_text = [tok.text_tokens(row) for row in truth.tolist()]
    score = score_sentences(true_text, [tok.text_tokens(list(s)) for s in found.sequences],
                            tok.decode, found.padding)
    return {"rouge1": round(score.rouge1, 4), "rouge2": round(score.rouge2, 4),
            "exact": score.exact, "sentences": len(true_text)}


def attack_round(name: str, options: dict[str, Any], observation: TextObservation,
                 data: TextDataset, truth: torch.Tensor) -> dict[str, Any]:
    started = time.perf_counter()
    found = create_attack(name, options).reconstruct(observation)
    assert isinstance(found, TextReconstruction)
    row = {"attack": name, "wall_s": round(time.perf_counter() - started, 2),
           "load": round(os.getloadavg()[0], 2), "work": found.iterations,
           "tokens": int((truth != data.info.checked_tokenizer.pad_id).sum()),
           **scored(data, truth, found)}
    for key in ("ranks", "certified", "truncated", "hidden_size", "evaluations", "length"):
        if key in found.extras:
            row[key] = found.extras[key]
    if found.warnings:
        row["warnings"] = found.warnings[:3]
    return row


def spec(kind: str, hidden: int, heads: int, layers: int) -> str:
    return f"{'gpt2' if kind == 'decoder' else 'bert'}:hidden={hidden},heads={heads}," \
           f"layers={layers}"


def emit(row: dict[str, Any], out: Path | None) -> None:
    print(json.dumps(row), flush=True)
    if out is not None:
        with out.open("a") as handle:
            handle.write(json.dumps(row) + "\n")


@click.command()
@click.option("--part", type=click.Choice(["decoder", "encoder", "sweep", "baselines"]),
              default="decoder")
@click.option("--batches", default=10, show_default=True)
@click.option("--batch-size", default=8, show_default=True)
@click.option("--seq-len", default=32, show_default=True)
@click.option("--hidden", default=768, show_default=True)
@click.option("--heads", default=12, show_default=True)
@click.option("--layers", default=2, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--sweep", default="8,16,24,32,36,40,48", show_default=True,
              help="decoder batch sizes for --part sweep")
@click.option("--iterations", default=500, show_default=True, help="LAMP/TAG steps")
@click.option("--threads", default=1, show_default=True)
@click.option("--dager-option", multiple=True, metavar="KEY=VALUE")
@click.option("--json", "out", type=click.Path(path_type=Path), default=None)
def main(part: str, batches: int, batch_size: int, seq_len: int, hidden: int, heads: int,
         layers: int, seed: int, sweep: str, iterations: int, threads: int,
         dager_option: tuple[str, ...], out: Path | None) -> None:
    torch.set_num_threads(threads)
    dager_options: dict[str, Any] = {k: float(v) if "." in v or "e" in v else int(v)
                                     for k, v in (o.split("=", 1) for o in dager_option)}
    kind = "encoder" if part == "encoder" else "decoder"
    task = "classify" if kind == "encoder" else "lm"
    data = load_text_dataset("shakespeare", "test", task=task, seq_len=seq_len)
    public = [[t for t in row if t] for row in
              load_text_dataset("shakespeare", "train", task=task, seq_len=seq_len)
              .tokens[:2000].tolist()]
    torch.manual_seed(seed)
    model = build_text_model(spec(kind, hidden, heads, layers), data.info)
    print(f"load average {os.getloadavg()[0]:.2f}; {part}: {spec(kind, hidden, heads, layers)}"
          f", seed {seed}, {threads} thread(s)", flush=True)
    rows = []
    if part in ("decoder", "encoder"):
        for k in range(batches):
            observation, truth = batch_round(data, model, k * batch_size, batch_size, public)
            row = {"part": part, "batch": k, "B": batch_size,
                   **attack_round("dager", dager_options, observation, data, truth)}
            emit(row, out)
            rows.append(row)
        good = sum(r["rouge1"] >= BAR and r["rouge2"] >= BAR for r in rows)
        emit({"part": part, "summary": True, "batches_at_bar": good, "of": len(rows),
              "mean_wall_s": round(sum(r["wall_s"] for r in rows) / len(rows), 1)}, out)
    elif part == "sweep":
        for size in (int(s) for s in sweep.split(",")):
            observation, truth = batch_round(data, model, 0, size, public)
            row = {"part": part, "B": size, "d": hidden,
                   **attack_round("dager", dager_options, observation, data, truth)}
            row["in_span"] = row["tokens"] - size  # a causal LM's last tokens have no δ
            emit(row, out)
    else:
        for k in range(batches):
            observation, truth = batch_round(data, model, k * batch_size, batch_size, public)
            for name, options in (("dager", dager_options),
                                  ("lamp", {"iterations": iterations}),
                                  ("tag", {"iterations": iterations})):
                emit({"part": part, "batch": k, "B": batch_size,
                      **attack_round(name, options, observation, data, truth)}, out)
    print(f"load average {os.getloadavg()[0]:.2f} at the end", flush=True)


if __name__ == "__main__":
    main()
