"""``.. fedleak-sweep-schema::``: every table and key a sweep spec may hold, as the parser in
``fedleak/harness/sweep/grid/spec.py`` (with ``grid_axes.py`` and ``defense_axis.py``) accepts them,
with defaults read from the code.

The keys are not copied from the parser: for each table the extension feeds
:func:`~fedleak.harness.sweep.grid.spec.parse_spec` a spec with an unknown key and reads the list of
valid keys from the error it answers, so a key added to or removed from the parser shows up
here (and a key without a description below fails the build, naming it). Defaults come from a
minimal spec parsed by the same function and from the settings dataclasses it builds.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from table_nodes import literal, table

logger = logging.getLogger(__name__)

PROBE = "zzz_not_a_key"
MINIMAL = "[sweep]\n[[sweep.defense]]\nreference = true\n"

# table → (TOML header, spec text with an unknown key in that table, what the table is: MyST
# Markdown, parsed as the page that holds the directive is)
TABLES: dict[str, tuple[str, str, str]] = {
    "sweep": ("[sweep]", f"[sweep]\n{PROBE} = 1\n",
              "The grid's axes and what every point shares."),
    "attack": ("[[sweep.attack]]", "",
               "One table per attack (the attack axis). Keys other than the ones below are "
               "the attack's own options, checked against its config: see "
               "{doc}`attacks-and-defenses`. Default: one `inverting-gradients` table."),
    "protocol": ("[[sweep.protocol]]", f"{MINIMAL}[[sweep.protocol]]\n{PROBE} = 1\n",
                 "One table per protocol setting (the protocol axis); the same names as the "
                 "CLI's protocol options. Default: one FedSGD table."),
    "utility": ("[sweep.utility]", f"{MINIMAL}[sweep.utility]\n{PROBE} = 1\n",
                "Federated training through the same defended path, for the utility (test "
                "accuracy) of each defense setting."),
    "resources": ("[sweep.resources]", f"{MINIMAL}[sweep.resources]\n{PROBE} = 1\n",
                  "What one point needs of a Ray node (`fedleak sweep --ray`); not part of "
                  "a point's id."),
    "audit": ("[sweep.audit]", f"{MINIMAL}[sweep.audit]\n{PROBE} = 1\n",
              "Every point also plays the audit game against its own victim and stores an "
              "ε lower bound beside the accountant's ε ({doc}`/audit`). Optional."),
    "defense": ("[[sweep.defense]]", f"[sweep]\n[[sweep.defense]]\n{PROBE} = 1\n",
                "One table per defense setting (the defense axis): a reference point "
                "(`reference`), a registered defense with one swept parameter (`name`, "
                "`param`, `values`, `params`) or fixed (`name`, `params`), or a fixed "
                "chain (`chain`). At least one is required."),
}

# (type, meaning) of every key, by table. The parser decides which keys exist; these say what
# they mean. A key the parser accepts that is missing here, or one here it refuses, fails the
# build.
MEANINGS: dict[str, dict[str, tuple[str, str]]] = {
    "sweep": {
        "name": ("string", "names the run folder runs/sweep-NAME (one plain path component); "
                           "default: the spec file's stem"),
        "dataset": ("string", "data set by name: digits, faces, photos, cifar10, cifar100, "
                              "imagefolder; text: shakespeare, textfile (docs/text.md)"),
        "seq_len": ("integer ≥ 1", "text data sets: tokens per sequence T (default 32)"),
        "description": ("string", "one line saying what the spec measures; `fedleak sweep "
                                  "--help` lists it beside each bundled preset (default empty)"),
        "split": ("string", "the split the attacked images come from: train, test or all"),
        "data_root": ("string", "folder of the torchvision data sets (cifar10, cifar100, "
                                "imagefolder)"),
        "models": ("list of strings", "model axis: zoo specs NAME[:key=value,...] "
                                      "(fedleak list names them)"),
        "model": ("string or list", "the same as models (give one of the two)"),
        "trained": ("list of bool / path", "false: seeded initialisation; true: the sweep "
                                           "trains a checkpoint (train_epochs); a path: that "
                                           "state dict"),
        "train_epochs": ("integer ≥ 1", "epochs of the checkpoint a trained = true point "
                                        "trains"),
        "rounds": ("integer ≥ 1", "K: private batches attacked per point"),
        "batch_size": ("integer ≥ 1", "n: private images per batch"),
        "images": ("string", "which images of the split form the private pool, e.g. "
                             "\"10-12\"; default: the first K·n (K·n·users with secure "
                             "aggregation)"),
        "seed": ("integer", "model initialisation (both victims) and defense randomness"),
        "portfolio": ("bool", "true: every point is attacked by each listed attack that "
                              "applies to it, at one shared budget; the report shows the "
                              "strongest per defense setting"),
        "attack": ("array of tables", "the [[sweep.attack]] tables below"),
        "protocol": ("array of tables", "the [[sweep.protocol]] tables below"),
        "utility": ("table", "the [sweep.utility] table below"),
        "audit": ("table", "the [sweep.audit] table below (optional)"),
        "resources": ("table", "the [sweep.resources] table below"),
        "defense": ("array of tables", "the [[sweep.defense]] tables below"),
    },
    "attack": {
        "name": ("string", "the attack's registered name (required)"),
        "options": ("table", "the attack's options, as an alternative to writing them as "
                             "keys of this table"),
        "architecture": ("string", "a server-designed architecture the user runs around every "
                                   "model of the grid (imprint:bins=K), for malicious-"
                                   "architecture attacks"),
    },
    "protocol": {
        "kind": ("string", "fedsgd (one gradient) or fedavg (a parameter delta after local "
                           "training)"),
        "local_epochs": ("integer", "FedAvg: E local epochs"),
        "local_batch_size": ("integer", "FedAvg: B images per local step (0 = all n)"),
        "lr": ("float", "FedAvg: τ, the user's local learning rate"),
        "batchnorm": ("string", "train (batch statistics) or eval (running statistics)"),
        "momentum": ("float ≥ 0", "FedAvg: μ of the local torch.optim.SGD (default 0)"),
        "weight_decay": ("float ≥ 0", "FedAvg: λ of the local SGD (default 0)"),
        "nesterov": ("bool", "FedAvg: Nesterov momentum (needs momentum > 0)"),
        "shuffle_batches": ("bool", "FedAvg: a new secret order every epoch; refused when it "
                                    "matters for batch_size (several batches an epoch): no "
                                    "replay is exact"),
    },
    "utility": {
        "enabled": ("bool", "false: measure the attack only"),
        "rounds": ("integer ≥ 1", "R federated rounds through the defended path"),
        "batch_size": ("integer ≥ 1", "B images per round"),
        "lr": ("float > 0", "FedSGD server rate η (FedAvg applies Δ as it is)"),
        "schedule": ("string", "cosine or constant (FedSGD rate over the rounds)"),
        "evaluations": ("integer ≥ 1", "test-accuracy checkpoints along the way (the curve)"),
    },
    "audit": {
        "trials": ("integer ≥ 2", "audit trials per point, about half with the canary (default "
                                  "2000)"),
        "canary": ("string", "gradient, input or client (client: every defense table needs "
                             "users ≥ 2 and secagg)"),
        "direction": ("string", "the gradient canary's direction: dirac (a quiet coordinate) or "
                                "random (a seeded unit direction)"),
        "seed": ("integer", "the public canary's seed (never the coins')"),
        "norm": ("float > 0", "the canary's L2 norm"),
        "delta": ("float", "δ of the ε lower bounds"),
        "confidence": ("float in (0, 1)", "confidence of every bound"),
        "calibration": ("float in (0, 1)", "the held-out fraction of trials that picks the "
                                           "threshold (threshold = split)"),
        "threshold": ("string or float", "half-shift (fixed from public settings, default; "
                                         "split where they do not fix the shift), split "
                                         "(held-out calibration) or a declared number"),
        "detect_shortfall": ("float in (0, 1)", "trials 0: as many as catch noise this factor "
                                                "of the declared std (default 0.9)"),
        "power": ("float in (0, 1)", "the probability the trials and the verdict's power "
                                     "statement use (default 0.99)"),
        "false_alarm": ("float in (0, 0.5)", "the verdict's family-wise false-alarm rate "
                                             "(default 1e-4)"),
        "coverage": ("bool", "canaries over every parameter tensor and the declared geometry "
                             "(default true)"),
    },
    "resources": {
        "num_cpus": ("number ≥ 0", "CPUs a point takes (also its torch threads)"),
        "num_gpus": ("number ≥ 0", "GPUs a point takes; > 0 runs its attack on cuda"),
    },
    "defense": {
        "reference": ("bool", "true: the no-defense point every curve starts from (only label "
                              "may go with it)"),
        "name": ("string", "a registered defense (fedleak list names them)"),
        "param": ("string", "the swept parameter of that defense (give values with it)"),
        "values": ("list", "the swept parameter's values, weakest first: one point each"),
        "params": ("table", "fixed parameters of that defense"),
        "chain": ("list of strings", "a fixed chain NAME:key=value,... in order: one point"),
        "label": ("string", "what the report calls this setting (or this swept group)"),
        "users": ("integer ≥ 1", "users a secure-aggregation chain sums (≥ 2 with secagg, "
                                 "each with batch_size images per round; 1 otherwise)"),
        "protocol": ("table", "this setting's own protocol (the keys of [[sweep.protocol]]), "
                              "in place of the grid's: e.g. DP-SGD deployed as FedAvg"),
        "utility": ("table", "this setting's own utility training (keys of [sweep.utility]), "
                             "merged over the sweep's"),
    },
}

VALID = re.compile(r"unknown key\(s\) " + PROBE + r"; valid: (?P<keys>.+)$")


def accepted_keys(table_name: str) -> set[str]:
    """The keys the parser accepts in ``table_name``, read from the error it gives a probe."""
    from fedleak.harness.sweep.grid import spec
    from fedleak.harness.sweep.grid.architecture import ARCHITECTURE_KEY

    if table_name == "attack":  # the rest of an attack table is the attack's own options
        return {"name", "options", ARCHITECTURE_KEY}
    try:
        spec.parse_spec(TABLES[table_name][1], "probe")
    except spec.SpecError as err:
        found = VALID.search(str(err))
        if found:
            return {key.strip() for key in found.group("keys").split(",")}
        raise RuntimeError(f"sweep schema: the parser's answer to an unknown key in "
                           f"{TABLES[table_name][0]} no longer lists the valid keys "
                           f"({err}); update docs/_ext/sweep_schema.py") from err
    raise RuntimeError(f"sweep schema: the parser accepted an unknown key in "
                       f"{TABLES[table_name][0]}")


def show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(show(v) for v in value) + "]"
    return repr(value)


def defaults() -> dict[str, dict[str, str]]:
    """Each table's defaults, from a minimal spec and the dataclasses the parser builds."""
    from fedleak.harness.federated.protocol import OPTION_FIELDS, Protocol
    from fedleak.harness.sweep.grid import spec
    from fedleak.harness.sweep.grid.points import PointResources, UtilitySettings

    parsed = spec.parse_spec(MINIMAL, "minimal.toml")
    top = {"dataset": parsed.dataset, "split": parsed.split, "models": parsed.models,
           "trained": parsed.trained, "train_epochs": parsed.train_epochs,
           "rounds": parsed.rounds, "batch_size": parsed.batch_size, "seed": parsed.seed,
           "portfolio": parsed.portfolio}
    protocol = Protocol()
    utility, resources = UtilitySettings(), PointResources()
    return {
        "sweep": {key: show(value) for key, value in top.items()},
        "attack": {},
        "protocol": {key: show(getattr(protocol, field))
                     for key, field in OPTION_FIELDS.items()},
        "utility": {f.name: show(getattr(utility, f.name)) for f in dataclasses.fields(utility)},
        "resources": {f.name: show(getattr(resources, f.name))
                      for f in dataclasses.fields(resources)},
        "defense": {"reference": "false", "users": "1"},
        "audit": {"trials": "2000", "threshold": "half-shift", "detect_shortfall": "0.9",
                  "power": "0.99", "false_alarm": "1e-4", "coverage": "true"},
    }


class SweepSchemaDirective(SphinxDirective):
    has_content = False

    def run(self) -> list[nodes.Node]:
        from fedleak.harness.sweep.grid import axes as grid_axes
        from fedleak.harness.sweep.grid import defense_axis, spec

        for module in (spec, grid_axes, defense_axis):
            self.env.note_dependency(module.__file__)
        known = defaults()
        out: list[nodes.Node] = []
        for name, (header, _, what) in TABLES.items():
            keys = accepted_keys(name)
            meanings = MEANINGS[name]
            for key in sorted(keys - set(meanings)):
                logger.warning("sweep schema: the parser accepts %s key %r, which "
                               "docs/_ext/sweep_schema.py does not describe; add it to MEANINGS",
                               header, key, location=self.get_location())
            for key in sorted(set(meanings) - keys):
                logger.warning("sweep schema: docs/_ext/sweep_schema.py describes %s key %r, "
                               "which the parser refuses; remove it from MEANINGS", header, key,
                               location=self.get_location())
            section = nodes.section(ids=[nodes.make_id(f"sweep-{name}")])
            section += nodes.title(header, header)
            section.extend(self.parse_text_to_nodes(what))
            rows = [[literal(key), kind, literal(known[name][key]) if key in known[name] else "",
                     meaning] for key, (kind, meaning) in meanings.items() if key in keys]
            section += table(["key", "type", "default", "meaning"], rows, [16, 16, 18, 50])
            out.append(section)
        return out


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("fedleak-sweep-schema", SweepSchemaDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
