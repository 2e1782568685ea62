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
    rounds = getattr(record, "rounds", [])
    per_round = [{"rouge1": r.rouge1, "rouge2": r.rouge2, "exact": r.exact,
                  "token_precision": r.token_precision, "token_recall": r.token_recall,
                  "work": r.iterations, "attack_s": round(r.wall_time_s, 2),
                  "ranks": (r.attack_extras or {}).get("ranks"),
                  "epsilon": (r.privacy or {}).get("epsilon_round")} for r in rounds]
    return {"attack": attack, "wall_s": round(time.perf_counter() - started, 1), **summary,
            "per_round": per_round}


def scan_chart(rows: list[dict[str, object]], hidden: int, path: Path) -> None:
    """ROUGE-1/2 against the batch's first-layer rank (distinct token vectors) over d."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(r["ranks"][0], r["rouge1"], r["rouge2"], f"{row['batch']}x{row['seq_len']}")
              for row in rows if row.get("attack") == "dager"
              for r in row["per_round"] if r.get("ranks")]  # type: ignore[union-attr]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.scatter([p[0] / hidden for p in points], [p[1] for p in points], label="ROUGE-1")
    ax.scatter([p[0] / hidden for p in points], [p[2] for p in points], marker="x",
               label="ROUGE-2")
    for x, y, _, label in points:
        ax.annotate(label, (x / hidden, y), textcoords="offset points", xytext=(4, 4),
                    fontsize=7)
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel(f"first-layer rank (distinct token vectors) / hidden size {hidden}")
    ax.set_ylabel("DAGER ROUGE")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
    parser.add_argument("--chart", type=Path, default=None,
                        help="with --scan: DAGER's ROUGE against the rank over d, as a PNG")
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
    if args.chart:
        hidden = int(dict(kv.split("=") for kv in args.model.split(":", 1)[1].split(","))
                     .get("hidden", 256)) if ":" in args.model else 256
        scan_chart(rows, hidden, args.chart)
        print(f"chart: {args.chart}")


if __name__ == "__main__":
    main()
