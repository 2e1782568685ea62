"""Text attacks over the wire: a text victim process and this process as the server.

For each attack, starts ``fedleak victim serve`` on the bundled Shakespeare (the held-out
``test`` roles by default: text no attack was tuned on), attacks ``--rounds`` rounds of
``--batch-size`` sentences of ``--seq-len`` tokens, and prints per round the victim's ROUGE-1/2/L,
exact sentences and token-set precision/recall, then per attack how many rounds reached ROUGE-1
and ROUGE-2 >= 0.99 and the wall time. With ``--audit-trials`` it also audits the victim's chain
(`fedleak audit`'s game: ε_LB beside the claimed ε). ``--scan B×T,...`` repeats the run for each
batch size × length (where DAGER stops: B·T against the hidden size).

    OMP_NUM_THREADS=2 python bench/text_attacks.py --model gpt2:hidden=768,heads=12,layers=2 \\
        --attacks token-set,dager --rounds 10
    fedleak train-model --dataset shakespeare --model bert:hidden=768,heads=12,layers=2 \
        --steps 150 --out bert768.pt
    python bench/text_attacks.py --model bert:hidden=768,heads=12,layers=2 --attacks dager \
        --checkpoint bert768.pt
    python bench/text_attacks.py --defense dpsgd:noise-multiplier=1.1 --audit-trials 1000
    python bench/text_attacks.py --attacks dager --rounds 3 --scan 8x32,16x32,32x32,24x64

Figures depend on the machine's load: report them with ``uptime``'s load average.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import tempfile
import time
from pathlib import Path

from fedleak.harness.attacker.attack_settings import AttackSettings
from fedleak.harness.attacker.client import VictimClient
from fedleak.harness.attacker.run import run_attack
from fedleak.harness.victim.process import VictimProcess


def victim_args(args: argparse.Namespace, batch: int, length: int) -> list[str]:
    out = ["--dataset", "shakespeare", "--split", args.split, "--model", args.model,
           "--batch-size", str(batch), "--seq-len", str(length), "--seed", str(args.seed),
           "--shuffle", "--allow-reveal", "--allow-audit", "--defense-seed", str(args.seed),
           "--protocol", args.protocol, "--max-message-mb", "512"]
    if args.protocol == "fedavg":
        out += ["--local-epochs", "1", "--local-batch-size", str(args.local_batch_size),
                "--lr", str(args.lr)]
    for spec in args.defense:
        out += ["--defense", spec]
    if args.checkpoint:
        out += ["--checkpoint", str(args.checkpoint)]
    return out


def attack_once(address: str, token: str, attack: str, options: dict[str, str],
                rounds: int, out: Path) -> dict[str, object]:
    settings = AttackSettings(attack=attack, options=dict(options), rounds=rounds,
                              show_progress=False, seed=0)
    started = time.perf_counter()
    with VictimClient(address, token=token, max_message_bytes=512 << 20) as client:
        record = run_attack(client, settings, out, log=lambda line: print("   ", line))
    summary = record.summary() if callable(getattr(record, "summary", None)) else {}
    return {"attack": attack, "wall_s": round(time.perf_counter() - started, 1), **summary}


def audit_once(address: str, trials: int, out: Path) -> dict[str, object]:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "fedleak", "audit", "--victim", address,
                           "--trials", str(trials), "--out", str(out), "--quiet"],
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        return {"audit_error": done.stderr[-500:]}
    report = json.loads((out / "audit.json").read_text())
    bounds = {b["estimator"]: b["epsilon"] for b in report.get("bounds", [])
              if not b.get("is_estimate")}
    return {"epsilon_claimed": report.get("claim", {}).get("epsilon"), "epsilon_lb": bounds,
            "violation": report.get("violation")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2:hidden=768,heads=12,layers=2")
    parser.add_argument("--attacks", default="token-set,dager")
    parser.add_argument("--option", action="append", default=[], metavar="ATTACK:KEY=VALUE")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--split", default="test")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--protocol", default="fedsgd", choices=["fedsgd", "fedavg"])
    parser.add_argument("--local-batch-size", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--defense", action="append", default=[])
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="the global model: a state dict (fedleak train-model)")
    parser.add_argument("--audit-trials", type=int, default=0)
    parser.add_argument("--scan", default="", help="B×T sizes, e.g. 8x32,16x32")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write the rows here too")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="fedleak-text-"))
    sizes = [tuple(int(v) for v in s.lower().split("x")) for s in args.scan.split(",") if s] \
        or [(args.batch_size, args.seq_len)]
    options: dict[str, dict[str, str]] = {}
    for item in args.option:
        attack, _, pair = item.partition(":")
        key, _, value = pair.partition("=")
        options.setdefault(attack, {})[key] = value
    print(f"load average {os.getloadavg()[0]:.2f} at start; model {args.model}; "
          f"defenses {args.defense or 'none'}; split {args.split}")
    rows = []
    for batch, length in sizes:
        token = secrets.token_hex(8)
        with VictimProcess(victim_args(args, batch, length), token=token) as victim:
            for attack in [a for a in args.attacks.split(",") if a]:
                print(f"== {attack} on {batch}x{length} ({args.rounds} rounds)")
                row = attack_once(victim.address, token, attack, options.get(attack, {}),
                                  args.rounds, out / f"{attack}-{batch}x{length}")
                row.update(batch=batch, seq_len=length, model=args.model,
                           defenses=args.defense)
                print(json.dumps(row))
                rows.append(row)
            if args.audit_trials:
                audit = audit_once(victim.address, args.audit_trials,
                                   out / f"audit-{batch}x{length}")
                print(json.dumps(audit))
                rows.append({"audit": audit, "batch": batch, "seq_len": length})
    print(f"load average {os.getloadavg()[0]:.2f} at the end; runs under {out}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
