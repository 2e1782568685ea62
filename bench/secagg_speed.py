"""Time each phase of secure aggregation (SecAgg, Bonawitz et al. 2017) in one process.

K users with d-coordinate float32 updates run every round through real messages (each one
encoded to bytes and decoded, as a transport would); one or more users drop out before
masking, so the server must rebuild their mask keys and recompute their pairwise masks with
every survivor (the expensive case). Prints the median over repeats of each phase, per user
where users work in parallel, and the bytes each user sends.

    python bench/secagg_speed.py [--users 8] [--length 1000000] [--dropouts 1] [--repeats 3]
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import TypeVar

import click
import numpy as np

from fedleak.defenses.secagg import (
    SecAggConfig,
    SecAggServer,
    SecAggUser,
    decode_message,
)
from fedleak.defenses.secagg.messages import Message

M = TypeVar("M", bound=Message)
T = TypeVar("T")


def wire(message: M) -> M:
    """``message`` after a trip through its byte encoding, as a transport would carry it."""
    return decode_message(message.to_bytes())  # type: ignore[return-value]


def one_run(
    users: int, length: int, dropouts: int, threshold: int, seed: int
) -> tuple[dict[str, float], dict[str, int]]:
    rng = np.random.default_rng(seed)
    updates = [rng.normal(0.0, 0.01, length).astype(np.float32) for _ in range(users)]
    config = SecAggConfig(threshold, clip=1.0, vector_length=length, num_users=users)
    times: dict[str, float] = {}
    sizes: dict[str, int] = {}

    def timed(name: str, work: Callable[[], T]) -> T:
        started = time.perf_counter()
        out = work()
        times[name] = time.perf_counter() - started
        return out

    clients = timed("r0 user: key generation (all users)",
                    lambda: [SecAggUser(u, config) for u in range(users)])
    server = SecAggServer(config)
    advertised = [wire(c.advertise_keys()) for c in clients]
    sizes["r0 AdvertiseKeys"] = len(advertised[0].to_bytes())
    request = wire(timed("r0 server: collect keys", lambda: server.advertise_keys(advertised)))
    shared = timed("r1 user: Shamir-share + encrypt (all users)",
                   lambda: [wire(c.share_keys(request)) for c in clients])
    sizes["r1 ShareKeys"] = len(shared[0].to_bytes())
    routed = timed("r1 server: route ciphertexts", lambda: server.share_keys(shared))
    alive = clients[dropouts:]
    per_user = []
    masked = []
    for client in alive:
        started = time.perf_counter()
        request_u = wire(routed[client.user_id])
        message = client.masked_input_collection(request_u, updates[client.user_id])
        per_user.append(time.perf_counter() - started)
        masked.append(message)
    times["r2 user: quantise + mask (per user)"] = statistics.median(per_user)
    data = timed("r2 user: encode y_u to bytes (per user)", lambda: masked[0].to_bytes())
    sizes["r2 MaskedInput"] = len(data)
    timed("r2 server: decode y_u from bytes (per user)", lambda: decode_message(data))
    unmask = wire(timed("r2 server: collect masked inputs",
                        lambda: server.masked_input_collection(masked)))
    answers = timed("r4 user: unmasking shares (all survivors)",
                    lambda: [wire(c.unmasking(unmask)) for c in alive])
    sizes["r4 UnmaskingShares"] = len(answers[0].to_bytes())
    result = timed("r4 server: reconstruct + unmask", lambda: server.unmasking(answers))
    expected = np.sum([np.asarray(updates[c.user_id], dtype=np.float64) for c in alive], axis=0)
    error = float(np.max(np.abs(result.total - expected)))
    assert error <= config.quantizer.error_bound(len(alive)), error
    return times, sizes


@click.command()
@click.option("--users", default=8, show_default=True, help="K, the number of users")
@click.option("--length", default=1_000_000, show_default=True, help="d, coordinates per update")
@click.option("--dropouts", default=1, show_default=True, help="users dropping before masking")
@click.option("--threshold", default=None, type=int, help="t (default: floor(K/2) + 1)")
@click.option("--repeats", default=3, show_default=True)
def main(users: int, length: int, dropouts: int, threshold: int | None, repeats: int) -> None:
    threshold = threshold or users // 2 + 1
    collected: dict[str, list[float]] = defaultdict(list)
    sizes: dict[str, int] = {}
    for repeat in range(repeats):
        times, sizes = one_run(users, length, dropouts, threshold, seed=repeat)
        for name, seconds in times.items():
            collected[name].append(seconds)
    print(f"SecAgg: K={users} users, d={length:,} coordinates, t={threshold}, "
          f"{dropouts} dropout(s) before masking, median of {repeats}")
    for name, values in collected.items():
        print(f"  {name:46s} {statistics.median(values) * 1e3:9.1f} ms")
    print("bytes sent per user:")
    for name, size in sizes.items():
        print(f"  {name:46s} {size:12,d} B")


if __name__ == "__main__":
    main()
