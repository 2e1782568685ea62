"""The nodes of a text Flower federation: Shakespeare's roles as clients, fedleak's own local
update on each node's sentences, and node-side scoring of a text reconstruction.

As LEAF federates Shakespeare, node p of N holds the train split's speaking roles r with
r mod N = p (:func:`text_node_batch`; ``images`` of the settings is the number of sentences a
node trains on per round, taken in order, wrapping around). The train handler is
:func:`~fedleak.harness.flower.node.train.train` itself — the victim's defended path, so the audit's
replay is exact — on token ids; update defenses run as the same client mod as for images.

The score handler (``query.fedleak_score``) answers a text submission — recovered sentences
as token ids and/or a token set, in the query's arrays and config — against the batch the
node trained on in that round, with the victim's text metrics
(:mod:`~fedleak.harness.metrics.text_metrics`: ROUGE-1/2/L matched one-to-one, exact
sentences, token-set precision and recall, padding never counted), at most once per round
(counted in the node's Flower state), the truth going back only where the node's operator
allows reveal.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedleak.harness.flower.arrays import record_of, tensors
from fedleak.harness.flower.federation import ConfiguredDefenses, FederationSettings
from fedleak.harness.flower.node.node_scoring import (
    REVEALED,
    SCORE_ACTION,
    SCORE_ERROR,
    SCORE_METRICS,
    SUBMISSION_CONFIG,
    SUBMISSION_IMAGES,
)
from fedleak.harness.flower.node.train import held_batch, train
from fedleak.harness.metrics.text_metrics import (
    floor_rouge,
    most_frequent_token,
    score_sentences,
    token_set_score,
)
from fedleak.harness.victim.scoring import precision
from fedleak.harness.victim.text_pool import model_task, model_tokenizer
from fedleak.harness.zoo.text.text_datasets import DEFAULT_SEQ_LEN, TextDataset, load_text_dataset
from fedleak.harness.zoo.text.text_models import build_text_model

#: the node's state record counting its answered text score queries, by round
TEXT_SPENT = "fedleak.text-scored"


@cache
def text_train_data(dataset: str, model: str) -> TextDataset:
    """The train split every node draws its roles from (sequences of the default length)."""
    return load_text_dataset(dataset, "train", task=model_task(model), seq_len=DEFAULT_SEQ_LEN,
                             tokenizer=model_tokenizer(model))


def text_node_batch(data: TextDataset, partition: int, partitions: int, server_round: int,
                    sentences: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Node ``partition``'s batch in ``server_round`` (1-based): the next ``sentences`` of the
    roles it holds (role index mod ``partitions`` = ``partition``), wrapping around."""
    roles: dict[str, int] = {}
    for user in data.users:
        roles.setdefault(user, len(roles))
    pool = torch.tensor([i for i, u in enumerate(data.users)
                         if roles[u] % partitions == partition], dtype=torch.long)
    if len(pool) < sentences:
        raise ValueError(f"node {partition} holds {len(pool)} sentences, fewer than the "
                         f"{sentences} it trains on per round: use fewer nodes or sentences")
    start = ((server_round - 1) * sentences) % len(pool)
    chosen = pool[(start + torch.arange(sentences)) % len(pool)]
    return data.tokens[chosen], data.labels[chosen]


def make_text_client_app(settings: FederationSettings) -> ClientApp:
    """The ClientApp of a text federation (module docstring)."""
    app = ClientApp(mods=[ConfiguredDefenses(settings)])

    @app.train()
    def train_handler(msg: Message, context: Context) -> Message:
        torch.set_num_threads(settings.threads)
        data = text_train_data(settings.dataset, settings.model)
        model = build_text_model(settings.model, data.info)
        config: dict[str, Any] = dict(next(iter(msg.content.config_records.values())))
        server_round = int(config.get("server-round", 1))
        pid = context.node_config.get("partition-id")
        count = context.node_config.get("num-partitions", settings.nodes)
        if not isinstance(pid, int) or not isinstance(count, int):
            raise ValueError("start each SuperNode with --node-config 'partition-id=I "
                             "num-partitions=N' (integers) so it knows its roles")
        tokens, labels = text_node_batch(data, pid, count, server_round, settings.images)
        trained = train(model, msg.content["arrays"], tokens, labels,  # type: ignore[arg-type]
                        data.info, config, defenses=[settings.dp] if settings.dp else [],
                        context=context)
        return Message(trained.content(), reply_to=msg)

    @app.query(SCORE_ACTION)
    def score_handler(msg: Message, context: Context) -> Message:
        data = text_train_data(settings.dataset, settings.model)
        try:
            return Message(text_score(msg, context, data, settings.allow_reveal), reply_to=msg)
        except ValueError as err:
            return Message(Error(SCORE_ERROR, str(err)), reply_to=msg)

    return app


def text_submission(server_round: int, tokens: torch.Tensor | None, padding: list[int],
                    token_set: list[int] | None) -> RecordDict:
    """What the audit sends a node to have round ``server_round``'s text scored."""
    content = RecordDict({SUBMISSION_CONFIG: ConfigRecord({
        "round": server_round, "padding": list(padding), "token-set": list(token_set or []),
        "text": True})})
    if tokens is not None:
        content[SUBMISSION_IMAGES] = record_of({"tokens": tokens.to(torch.int64)})
    return content


def text_score(msg: Message, context: Context, data: TextDataset,
               allow_reveal: bool) -> RecordDict:
    """The node's text scores of a submission (module docstring); ValueError names a refusal."""
    record = msg.content.config_records.get(SUBMISSION_CONFIG)
    config: dict[str, Any] = dict(record) if record is not None else {}
    if not isinstance(config.get("round"), int):
        raise ValueError(f"a text score query carries a ConfigRecord {SUBMISSION_CONFIG!r} "
                         "with the round")
    server_round = int(config["round"])
    batch = held_batch(context, server_round)
    if batch is None:
        raise ValueError(f"this node holds no training batch of round {server_round}: it keeps "
                         "the batches of its last fedleak-keep-rounds rounds (node config)")
    spent = context.state.get(TEXT_SPENT)
    counts: dict[str, Any] = dict(spent) if isinstance(spent, ConfigRecord) else {}
    if counts.get(str(server_round), 0) >= 1:
        raise ValueError(f"round {server_round} of this node was already scored (a "
                         "submission is final)")
    tok = data.info.checked_tokenizer
    truth = [tok.text_tokens(row) for row in batch["images"].tolist()]
    arrays = msg.content.array_records.get(SUBMISSION_IMAGES)
    submitted = [] if arrays is None else [
        tok.text_tokens([t for t in row if 0 <= t < tok.vocab_size])
        for row in tensors(arrays)["tokens"].tolist()]
    padding = [int(j) for j in config.get("padding", [])]
    counts[str(server_round)] = counts.get(str(server_round), 0) + 1
    context.state[TEXT_SPENT] = ConfigRecord(counts)
    metrics: dict[str, Any] = {}
    if submitted:
        s = score_sentences(truth, submitted, tok.decode, padding)
        floor = floor_rouge(truth, most_frequent_token(truth), tok.decode)
        metrics.update({"floor-rouge1": precision.unit(floor[0]),
                        "floor-rouge2": precision.unit(floor[1]),
                        "floor-rouge-l": precision.unit(floor[2])})
        metrics.update({"rouge1": precision.unit(s.rouge1), "rouge2": precision.unit(s.rouge2),
                        "rouge-l": precision.unit(s.rougeL), "exact": s.exact,
                        "sentences": len(truth),
                        # per private sentence, in order: what the comparison table shows
                        "sentence-matched": [x.matched_index for x in s.sentences],
                        "sentence-rouge1": [precision.unit(x.rouge1) for x in s.sentences],
                        "sentence-rouge2": [precision.unit(x.rouge2) for x in s.sentences],
                        "sentence-rouge-l": [precision.unit(x.rougeL) for x in s.sentences],
                        "sentence-exact": [int(x.exact) for x in s.sentences],
                        "sentence-padding": [int(x.padding) for x in s.sentences]})
    stated = [int(t) for t in config.get("token-set", [])]
    recovered = stated or sorted({t for j, row in enumerate(submitted) if j not in padding
                                  for t in row})
    tokens = token_set_score(truth, [t for t in recovered if t not in tok.special_ids])
    metrics.update({"token-precision": precision.unit(tokens.precision),
                    "token-recall": precision.unit(tokens.recall),
                    "tokens-recovered": tokens.recovered, "tokens-true": tokens.true})
    out = RecordDict({SCORE_METRICS: MetricRecord(metrics)})
    if allow_reveal or context.node_config.get("fedleak-allow-reveal") is True:
        out[REVEALED] = record_of({"images": batch["images"]})
    return out
