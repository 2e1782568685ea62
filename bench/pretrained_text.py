"""Text attacks on the pretrained victims, in process: LAMP's priors on MiniLM, DAGER on both.

The server's view of each round is the harness's own in-process path (``observe_text``: the
victim's FedSGD update of the mean loss, no defense) on *Alice's Adventures in Wonderland*'s
held-out chapters (``alice``, split ``test``: text no attack was tuned on), each model with
its own tokenizer; batches are consecutive rows (``--batch-size`` sentences of at most
``--seq-len`` tokens), model seed 0 (MiniLM's fresh classification head), attack seed 0.

    OMP_NUM_THREADS=1 python bench/pretrained_text.py --part lamp --batches 5 --iterations 200
    OMP_NUM_THREADS=1 python bench/pretrained_text.py --part dager --model minilm --batches 10
    OMP_NUM_THREADS=1 python bench/pretrained_text.py --part dager --model minilm --batches 10 \
        --batch-size 8 --seq-len 32 --shuffle --max-evaluations 60000

``--part lamp`` runs LAMP on MiniLM (2 × 16 by default) with each prior on the same batches:
``none`` (the reconstruction loss alone), ``bigram`` (counted from the book's other chapters,
the public text the server holds) and ``model`` (SmolLM2-135M's perplexity of each candidate,
re-tokenised, as the paper scores BERT's candidates with GPT-2); TAG beside them. ``--part
dager`` runs DAGER on ``--model``; ``--part floor`` scores two guesses that use no gradient on
the same batches (``floor-prior``: the public text's most frequent tokens filling each
sentence's length; ``floor-bag``: the batch's token set in a random order, seed 0).
Rows go to ``--json`` as they finish; wall times depend on the machine's load (printed
with them), CPU seconds of this process are printed too.
"""

from __future__ import annotations

import dataclasses
import resource
import sys
import time
from pathlib import Path
from typing import Any

import click
import torch

sys.path.insert(0, str(Path(__file__).parent))
from dager import attack_round, batch_round, emit  # noqa: E402

from fedleak.harness.attacker.text.language_prior import pretrained_prior  # noqa: E402
from fedleak.harness.metrics.text_metrics import (  # noqa: E402
    prior_guess,
    score_sentences,
    shuffled_bag,
)
from fedleak.harness.zoo.text.pretrained import PRETRAINED_MODELS, pretrained_folder  # noqa: E402
from fedleak.harness.zoo.text.text_datasets import load_text_dataset  # noqa: E402
from fedleak.harness.zoo.text.text_models import build_text_model  # noqa: E402


def floor_rows(data: Any, truth: torch.Tensor, public: list[list[int]]) -> list[dict[str, Any]]:
    """The no-gradient floors of one batch, scored as LAMP's sentences are (``scored``)."""
    tok = data.info.checked_tokenizer
    true_text = [tok.text_tokens(row) for row in truth.tolist()]
    guesses = {"floor-prior": prior_guess(public, [len(s) for s in true_text]),
               "floor-bag": shuffled_bag(true_text, seed=0)}
    rows = []
    for attack, sentences in guesses.items():
        score = score_sentences(true_text, sentences, tok.decode)
        rows.append({"attack": attack, "rouge1": round(score.rouge1, 4),
                     "rouge2": round(score.rouge2, 4), "exact": score.exact,
                     "sentences": len(true_text)})
    return rows


def _cpu() -> float:
    return round(time.process_time(), 1)


@click.command()
@click.option("--part", type=click.Choice(["lamp", "dager", "floor"]), default="lamp")
@click.option("--model", "name", type=click.Choice(list(PRETRAINED_MODELS)), default="minilm")
@click.option("--batches", default=5, show_default=True)
@click.option("--batch-size", default=2, show_default=True)
@click.option("--seq-len", default=16, show_default=True)
@click.option("--iterations", default=200, show_default=True)
@click.option("--priors", default="none,bigram,model", show_default=True)
@click.option("--discrete-every", default=50, show_default=True)
@click.option("--tag/--no-tag", default=True, show_default=True)
@click.option("--shuffle/--in-order", default=False, show_default=True,
              help="shuffle the split with seed 0, as the victim's --shuffle does")
@click.option("--max-evaluations", default=None, type=int, help="DAGER's budget")
@click.option("--pick", default=None,
              help="comma-separated batch indices to run (of the first --batches); default all")
@click.option("--json", "out", type=click.Path(path_type=Path), default=None)
def main(part: str, name: str, batches: int, batch_size: int, seq_len: int, iterations: int,
         priors: str, discrete_every: int, tag: bool, shuffle: bool, max_evaluations: int | None,
         pick: str | None, out: Path | None) -> None:
    torch.set_num_threads(1)
    task = PRETRAINED_MODELS[name].task
    folder = str(pretrained_folder(name))
    data = load_text_dataset("alice", "test", task=task, seq_len=seq_len, tokenizer=folder)
    if shuffle:  # the victim's private_pool(shuffle=True, seed=0)
        data = data.select(torch.randperm(len(data.labels),
                                          generator=torch.Generator().manual_seed(0)))
    public_data = load_text_dataset("alice", "train", task=task, seq_len=seq_len,
                                    tokenizer=data.info.checked_tokenizer)
    pad = data.info.checked_tokenizer.pad_id
    public = [[t for t in row if t != pad] for row in public_data.tokens.tolist()]
    if part == "floor":
        for batch in range(batches):
            truth = data.tokens[batch * batch_size:(batch + 1) * batch_size]
            for row in floor_rows(data, truth, public):
                emit(dict(row, model=name, batch=batch, shape=f"{batch_size}x{seq_len}"), out)
        return
    torch.manual_seed(0)
    model = build_text_model(name, data.info)
    score: Any = None
    if part == "lamp" and "model" in priors.split(","):
        score = pretrained_prior(data.info.checked_tokenizer)
    chosen = range(batches) if pick is None else [int(b) for b in pick.split(",")]
    for batch in chosen:
        observation, truth = batch_round(data, model, batch * batch_size, batch_size, public)
        observation = dataclasses.replace(observation, language_prior=score)
        runs: list[tuple[str, dict[str, Any]]] = []
        if part == "dager":
            runs = [("dager", {} if max_evaluations is None
                      else {"max_evaluations": max_evaluations})]
        else:
            runs = [("lamp", {"iterations": iterations, "prior": p,
                              "discrete_every": discrete_every}) for p in priors.split(",")]
            if tag:
                runs.append(("tag", {"iterations": iterations}))
        for attack, options in runs:
            before = time.process_time()
            row = attack_round(attack, options, observation, data, truth)
            row.update(model=name, batch=batch, shape=f"{batch_size}x{seq_len}",
                       prior=options.get("prior"), cpu_s=round(time.process_time() - before, 1),
                       peak_gb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
                                     2))
            emit(row, out)


if __name__ == "__main__":
    main()
