"""The honest-but-curious server against a text victim: send θ, receive, reconstruct, score.

One round is: ``ComputeUpdate`` with the global parameters (or a secure-aggregation round among
the victim's users, attacking the survivors' sum or one masked vector) → a
:class:`~fedleak.attacks.text_observation.TextObservation` built from what came back and
what ``Describe`` published → the text attack → ``Score`` with the recovered token ids (the
victim decodes and scores them; its sentences stay there) → ``Reveal`` when the victim allows
it and we hold its token, for the readable comparison.

Under ``out``: ``metrics.json`` (rewritten after every round) and per round
``round-NNN/reconstruction.json`` (recovered ids, their text, the token set) and
``round-NNN/comparison.md`` (private beside recovered sentences when revealed, with scores).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from fedleak.attacks import create_attack
from fedleak.attacks.text.text_attack import TextAttack
from fedleak.attacks.text_observation import TextReconstruction
from fedleak.harness.attacker.attack_progress import reconstruct_with_progress
from fedleak.harness.attacker.attack_settings import AttackSettings, jsonable
from fedleak.harness.attacker.client import ReceivedUpdate, VictimClient, VictimError
from fedleak.harness.attacker.described import (
    defense_specs,
    published_defenses,
    victim_protocol,
)
from fedleak.harness.attacker.records import RunHeader
from fedleak.harness.attacker.secagg_rounds import as_received_update, run_secagg
from fedleak.harness.attacker.text.text_described import (
    public_text,
    text_global_parameters,
    text_info,
    text_server_model,
)
from fedleak.harness.attacker.text.text_records import (
    TextRoundRecord,
    TextRun,
    comparison_markdown,
    floor_note,
)
from fedleak.harness.federated.text_observe import text_observation_from_update

GONE_CODES = ("UNAVAILABLE", "DEADLINE_EXCEEDED")


def run_text_attack(client: VictimClient, settings: AttackSettings, out: Path,
                    log: Callable[[str], None] = print) -> TextRun:
    """Attack ``settings.rounds`` rounds of the text victim behind ``client``; write them."""
    if settings.pack > 1 or settings.flip_labels is not None:
        raise ValueError("text attacks run their rounds one by one on the honest server's θ: "
                         "leave --pack at 1 and drop --flip-labels")
    out.mkdir(parents=True, exist_ok=True)
    described = client.describe()
    info = text_info(described)
    model = text_server_model(described, info)
    attack = create_attack(settings.attack, settings.options)
    if not isinstance(attack, TextAttack):
        raise ValueError(f"attack {settings.attack!r} reconstructs images; this victim holds "
                         "text: use token-set, dager, lamp or tag")
    if model.architecture not in attack.architectures:
        raise ValueError(f"attack {settings.attack!r} handles {', '.join(attack.architectures)} "
                         f"models; this victim trains a {model.architecture}")
    params, buffers = text_global_parameters(client, described, info, settings.checkpoint,
                                             settings.model_seed)
    protocol = victim_protocol(described).with_changes(settings.protocol)
    secagg = any(d.name == "secagg" for d in described.defenses)
    run = TextRun(RunHeader.now(
        client.address, f"{described.model.name}", info.name, settings.attack,
        jsonable(dataclasses.asdict(attack.config)), settings.to_json(), settings.device,
        server_role=attack.server_role))
    run.write(out)
    tokenizer = info.checked_tokenizer
    public = public_text(described, info)
    prior = None
    if getattr(attack.config, "prior", None) == "model":
        from fedleak.harness.attacker.text.language_prior import pretrained_prior

        prior = pretrained_prior(tokenizer)
    try:
        for index in range(settings.rounds):
            if secagg:
                aggregation = run_secagg(client, params, buffers, protocol)
                received = as_received_update(aggregation, list(params),
                                              [tuple(t.shape) for t in params.values()],
                                              settings.secagg_target)
            else:
                received = client.compute_update(params, buffers, protocol)
            observation = text_observation_from_update(
                model, params, buffers, received.update, received.protocol, info,
                num_sequences=received.num_images, update_kind=received.update_kind,
                local_steps=received.local_steps, metadata=received.metadata,
                device=settings.device, defenses=published_defenses(described),
                public_sequences=public)
            if prior is not None:
                observation = dataclasses.replace(observation, language_prior=prior)
            started = time.perf_counter()
            found = reconstruct_with_progress(attack, observation, device=settings.device,
                                              seed=settings.seed + index,
                                              label=f"round {index} {settings.attack}",
                                              show=settings.show_progress)
            wall = time.perf_counter() - started
            assert isinstance(found, TextReconstruction)
            entry = round_entry(received, found, wall, attack.budget())
            entry.defenses = defense_specs(described) or None
            finish_round(client, described, received, found, entry, out / f"round-{index:03d}",
                         out, tokenizer, f"round {index}: {settings.attack} against "
                         f"{info.name} ({described.model.name})")
            run.rounds.append(entry)
            run.write(out)
            log(round_summary(index, entry))
    except VictimError as err:
        run.status = "victim gone" if err.code.name in GONE_CODES else "failed"
        run.warnings.append(f"the run stopped: {err}")
        run.write(out)
        raise
    except Exception as err:
        run.status = "failed"
        run.warnings.append(f"the run stopped on an error: {type(err).__name__}: {err}")
        run.write(out)
        raise
    run.status = "finished"
    run.write(out)
    return run


def round_entry(received: ReceivedUpdate, found: TextReconstruction, wall: float,
                budget: int | None) -> TextRoundRecord:
    privacy = {k: float(v) for k, v in received.metadata.items()
               if k in ("epsilon_total", "epsilon_round", "delta")}
    return TextRoundRecord(
        round_id=received.round_id, update_kind=received.update_kind,
        num_sequences=received.num_images, local_steps=received.local_steps,
        victim_metadata=dict(received.metadata), iterations=found.iterations,
        objective=found.objective, wall_time_s=wall, sequences=found.sequences,
        token_set=found.token_set, privacy=privacy or None,
        attack_extras=jsonable(found.extras) or None, warnings=list(found.warnings),
        budget=budget)


def finish_round(client: VictimClient, described: object, received: ReceivedUpdate,
                 found: TextReconstruction, entry: TextRoundRecord, round_dir: Path, out: Path,
                 tokenizer: object, title: str) -> None:
    """Save the recovered text, score it on the victim, reveal for the comparison."""
    round_dir.mkdir(parents=True, exist_ok=True)
    decode = tokenizer.decode  # type: ignore[attr-defined]
    recovered = [decode(s) for s in found.sequences]
    (round_dir / "reconstruction.json").write_text(json.dumps(
        {"sequences": found.sequences, "text": recovered, "token_set": found.token_set,
         "token_counts": found.token_counts, "padding": found.padding}, indent=2))
    entry.files["reconstruction"] = str((round_dir / "reconstruction.json").relative_to(out))
    tokens = padded(found.sequences)
    counts = None if found.token_counts is None or found.token_set is None else \
        [found.token_counts.get(t, 1) for t in found.token_set]
    try:
        reply = client.score_text(received.round_id, tokens, found.token_set, counts,
                                  list(found.padding) if tokens is not None else None,
                                  received.user_ids)
    except VictimError as err:
        if err.code.name not in GONE_CODES:
            raise
        entry.unscored = f"victim gone: {err.details}"
        raise
    entry.score(reply)
    private = None
    if getattr(described, "reveal_enabled", False) and client.token:
        try:
            truth, _ = client.reveal(received.round_id)
            private = [decode(ids) + cut_mark(tokenizer, ids, len(row))
                       for row in truth.tolist() for ids in [[t for t in row if t >= 0]]]
            if received.user_ids:
                per_user = len(private) // max(1, getattr(described, "num_users", 1))
                private = [p for u in sorted(received.user_ids)
                           for p in private[u * per_user:(u + 1) * per_user]]
        except VictimError as err:
            entry.reveal_error = str(err)
    (round_dir / "comparison.md").write_text(comparison_markdown(title, recovered, entry,
                                                                 private))
    entry.files["comparison"] = str((round_dir / "comparison.md").relative_to(out))


def cut_mark(tokenizer: object, ids: list[int], seq_len: int) -> str:
    """`` (cut at T tokens)`` after a private sentence that fills the T positions (the
    tokenizer's :meth:`~fedleak.harness.zoo.text.tokenizer.TextTokenizer.fills`), else ''."""
    fills, pad = getattr(tokenizer, "fills", None), getattr(tokenizer, "pad_id", None)
    content = list(ids)
    while content and content[-1] == pad:  # the trailing run of padding is no content
        content.pop()
    return f" (cut at {seq_len} tokens)" if callable(fills) and fills(content, seq_len) else ""


def padded(sequences: list[list[int]]) -> torch.Tensor | None:
    """Recovered sentences as one [m, L] id tensor, -1 after each sentence (None: none)."""
    if not sequences:
        return None
    width = max(1, max(len(s) for s in sequences))
    tokens = torch.full((len(sequences), width), -1, dtype=torch.int64)
    for i, s in enumerate(sequences):
        tokens[i, :len(s)] = torch.tensor(s, dtype=torch.int64)
    return tokens


def round_summary(index: int, entry: TextRoundRecord) -> str:
    parts = [f"round {index}:"]
    if entry.rouge1 is not None:
        parts.append(f"ROUGE-1 {entry.rouge1:.4f}, ROUGE-2 {entry.rouge2:.4f}, ROUGE-L "
                     f"{entry.rougeL:.4f}, exact {entry.exact}/{entry.num_sequences}"
                     f"{floor_note(entry)};")
    if entry.token_precision is not None:
        parts.append(f"token set P {entry.token_precision:.4f} R {entry.token_recall:.4f};")
    parts.append(f"{entry.wall_time_s:.1f} s")
    return " ".join(parts)
