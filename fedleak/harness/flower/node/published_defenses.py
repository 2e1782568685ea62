"""The client's defenses travel with its reply, as ``Describe`` publishes a victim's.

Defenses are public mechanisms (Kerckhoffs): the server of a Flower federation may know them,
and an audit that does not is the blind attack, which understates a defended client (the
README's table: about 4.7 dB for pruning). Whatever defends a node's update therefore names
itself in the train reply, in one ConfigRecord, :data:`DEFENSES_RECORD`, whose ``chain`` lists
one link per defense in the order they acted — ``{"name", "params", "stage"}`` as JSON, the
fields of the victim's ``DefenseSpec``, public parameters only (never a seed or noise draw):

- fedleak's own: :func:`~fedleak.harness.flower.node.train.train` publishes its per-example defense
  (``dpsgd``) in the reply content it builds, and every
  :class:`~fedleak.harness.flower.node.mods.DefenseMod` appends its update defenses;
- Flower's own DP mods, wrapped by :func:`publishing`: ``LocalDpMod(C, sensitivity, ε, δ)``
  clips the update to L2 norm C over every array, then adds Gaussian noise of standard
  deviation σ = sensitivity · √(2 ln(1.25/δ)) / ε to every entry (Flower's formula), which is
  fedleak's ``clip:max-norm=C`` then ``noise:sigma=σ``; ``fixedclipping_mod`` and
  ``adaptiveclipping_mod`` clip to the norm the server sends in the train config
  (``clipping_norm``), fedleak's ``clip``. Any other mod can be published with the chain it
  applies, ``publishing(mod, "clip:max-norm=1")``; an unrecognised mod without one is refused,
  since an unnamed defense would make the audit blind without saying so. A published mod
  acts on train messages only: every other message (the audit's score query) passes it
  untouched.

The audit (:class:`~fedleak.harness.flower.leakage_audit.LeakageAudit`) reads the chain with
:func:`published_chain`, records it in ``metrics.json`` and hands it to the attack exactly as
``Describe``'s is handed against ``fedleak victim serve``, so ``objective=auto`` picks the
defense-aware parts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp.typing import ClientAppCallable

from fedleak.attacks.published import PublishedDefense, published
from fedleak.defenses.chain import build_chain, parse_defense_spec
from fedleak.harness.flower.node.query_fields import CLIPPING_NORM_KEY  # noqa: F401  (re-exported)

#: the reply's ConfigRecord naming the defenses that acted on it, in order
DEFENSES_RECORD = "fedleak.defenses"

Link = tuple[str, dict[str, str], str]
Mod = Callable[[Message, Context, ClientAppCallable], Message]


def publish(content: RecordDict, links: Iterable[Link]) -> None:
    """Append ``links`` (name, public params, stage) to the chain ``content`` publishes (an
    empty chain is published too: "no defense" is a statement, no record is none)."""
    links = list(links)
    record = content.config_records.get(DEFENSES_RECORD)
    held = record.get("chain", []) if record is not None else []
    chain = [str(c) for c in held] if isinstance(held, list) else []
    chain += [json.dumps({"name": n, "params": dict(p), "stage": s}, sort_keys=True)
              for n, p, s in links]
    content[DEFENSES_RECORD] = ConfigRecord({"chain": chain})


def published_chain(content: RecordDict) -> tuple[PublishedDefense, ...] | None:
    """The chain a reply publishes (None: it publishes none); ``ValueError`` naming what is
    wrong when the record is malformed."""
    record = content.config_records.get(DEFENSES_RECORD)
    if record is None:
        return None
    chain = record.get("chain", [])
    if not isinstance(chain, list) or not all(isinstance(c, str) for c in chain):
        raise ValueError(f"the reply's {DEFENSES_RECORD} record must hold a list of strings "
                         "under 'chain'")
    links = []
    for text in chain:
        assert isinstance(text, str)
        try:
            link = json.loads(text)
            name, params, stage = str(link["name"]), link.get("params", {}), str(link["stage"])
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"unreadable published defense {text[:80]!r}: {err}") from None
        if not isinstance(params, dict):
            raise ValueError(f"published defense {name!r}: params must be a mapping")
        links.append((name, {str(k): str(v) for k, v in params.items()}, stage))
    return published(links)


def links_of(spec_texts: Sequence[str]) -> list[Link]:
    """(name, public params, stage) of fedleak defense specs, as their defenses publish them."""
    return build_chain([parse_defense_spec(s) for s in spec_texts]).describe()


def local_dp_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """The noise standard deviation of Flower's ``LocalDpMod``: sensitivity ·
    √(2 ln(1.25/δ)) / ε (the Gaussian mechanism's, as flwr computes it)."""
    return sensitivity * math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def recognised(mod: Any) -> Callable[[Message], list[Link]] | None:
    """For a Flower DP mod fedleak recognises, the chain it applies to a train message's reply
    (it may read the message's config); None for any other mod."""
    from flwr.client import mod as legacy
    from flwr.clientapp.mod import LocalDpMod, adaptiveclipping_mod, fixedclipping_mod

    if isinstance(mod, LocalDpMod | legacy.LocalDpMod):
        sigma = local_dp_sigma(mod.sensitivity, mod.epsilon, mod.delta)
        chain = [f"clip:max-norm={mod.clipping_norm!r}", f"noise:sigma={sigma!r}"]
        return lambda msg: links_of(chain)
    if mod in (fixedclipping_mod, adaptiveclipping_mod, legacy.fixedclipping_mod,
               legacy.adaptiveclipping_mod):
        def clipping(msg: Message) -> list[Link]:
            configs = list(msg.content.config_records.values())
            norm = configs[0].get(CLIPPING_NORM_KEY) if len(configs) == 1 else None
            return links_of([f"clip:max-norm={float(norm)!r}"]) \
                if isinstance(norm, int | float) and norm > 0 else []
        return clipping
    return None


def publishing(mod: Mod, *chain: str) -> Mod:
    """``mod``, publishing in every train reply the defenses it applies: ``chain`` (fedleak
    specs, ``clip:max-norm=1``) when given, else what :func:`recognised` reads off a Flower DP
    mod; a mod neither names is refused (``TypeError`` saying what to pass)."""
    if chain:
        links = links_of(chain)

        def describe(msg: Message) -> list[Link]:
            return links
    else:
        found = recognised(mod)
        if found is None:
            raise TypeError(f"fedleak does not recognise the mod {mod!r}: name the defense it "
                            "applies, publishing(mod, 'clip:max-norm=1', 'noise:sigma=0.01') "
                            "(fedleak defense specs; `fedleak list` shows them)")
        describe = found  # type: ignore[assignment]

    def published_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        if not msg.metadata.message_type.startswith("train"):  # the audit's score query, ...
            return call_next(msg, context)  # a defense acts on train replies only
        reply = mod(msg, context, call_next)
        if not reply.has_error():
            publish(reply.content, describe(msg))
        return reply

    published_mod.__name__ = f"publishing({getattr(mod, '__name__', type(mod).__name__)})"
    return published_mod

