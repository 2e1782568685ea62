"""Hostile-input fuzzing of the real services: generated ``fedleak.v1`` messages sent to real
``fedleak victim serve`` and ``fedleak defense serve`` processes on loopback.

After every request the fuzzer asserts that

1. the status is a documented one: OK, INVALID_ARGUMENT, FAILED_PRECONDITION, NOT_FOUND,
   UNAUTHENTICATED, RESOURCE_EXHAUSTED or OUT_OF_RANGE, with a non-empty message of bounded
   length (client strings are quoted, never echoed whole); CANCELLED only for a call the
   fuzzer cancelled itself; UNAVAILABLE only for a simulated secure-aggregation dropout; never
   INTERNAL, UNKNOWN or DEADLINE_EXCEEDED (every call has a generous deadline: passing it is a
   hang);
2. the process is still running and answers a known-good request (``Describe`` or ``Info``
   after every request, a clean round, release or update every :data:`GOOD_EVERY` requests),
   and a victim's public global model is what it was at start (no request may change it);
3. replies are well formed: a defended update has the tensors sent (names, order, dtypes,
   shapes), finite; a secure-aggregation user answers with its phase's message.

Messages cover every RPC: parameter lists with missing, unknown, duplicated and renamed
tensors, unknown dtype enums, negative, zero and huge (2**32, 2**62, 2**63 - 1) dimensions,
byte counts that do and do not match, NaN/Inf values; protocol fields at and beyond the
victim's caps; Score with real and made-up round ids (some about 1 MiB), reconstructions,
labels, user ids and features with random headers; Reveal with and without the token;
Release streams, some cancelled; secure-aggregation rounds run honestly with steps inserted,
dropped, repeated or corrupted; DefenseService streams of chunks out of order, cut short,
renamed or reshaped mid-tensor.

Bounded and seeded for CI (hypothesis ``derandomize``): ``FEDLEAK_FUZZ_EXAMPLES`` sets the
examples per test (default :data:`DEFAULT_EXAMPLES`); ``FEDLEAK_FUZZ_REPORT=PATH`` writes a JSON
summary (requests per service and RPC, statuses, failures) when the module finishes::

    FEDLEAK_FUZZ_EXAMPLES=2000 FEDLEAK_FUZZ_REPORT=fuzz.json \\
        .venv/bin/python -m pytest -q -m fuzz tests/integration/test_fuzz_services.py
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedleak.defenses.secagg import (
    AdvertiseKeys,
    MaskedInput,
    MaskedInputRequest,
    ShareKeys,
    ShareKeysRequest,
    UnmaskingRequest,
    UnmaskingShares,
)
from fedleak.harness.remote_defense.wire import UpdateStreamError, assemble_update
from fedleak.harness.victim.process import VictimProcess
from fedleak.harness.wire.channel import SCORE_TOKEN_METADATA_KEY, TOKEN_METADATA_KEY
from fedleak.v1 import defense_pb2 as dpb
from fedleak.v1 import defense_pb2_grpc as dpb_grpc
from fedleak.v1 import victim_pb2 as pb
from fedleak.v1 import victim_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.fuzz, pytest.mark.integration]

#: Examples per test when ``FEDLEAK_FUZZ_EXAMPLES`` is unset (the whole file in about 30 s on
#: two cores).
DEFAULT_EXAMPLES = 40
EXAMPLES = int(os.environ.get("FEDLEAK_FUZZ_EXAMPLES", str(DEFAULT_EXAMPLES)))
REPORT = os.environ.get("FEDLEAK_FUZZ_REPORT", "")
#: Seconds one call may take; past it the call counts as a hang (a call of a second took ten
#: times longer at a load average of 20 on 2 cores: this is far beyond that).
DEADLINE = 300.0
#: A known-good round-starting request after every this many fuzzed requests.
GOOD_EVERY = 8
#: Longest error message a service may answer with (client strings are quoted, not echoed).
MAX_DETAILS = 4096
#: Largest payload a generated tensor may carry.
MAX_FILL = 1 << 20

FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much, HealthCheck.large_base_example],
)
# a hang is caught by DEADLINE; this only bounds a long run (as pyproject's guard, sized for a
# load average of 20 on 2 cores)
TIMEOUT = pytest.mark.timeout(1800 + 3 * EXAMPLES)

Code = grpc.StatusCode
DOCUMENTED = frozenset({Code.OK, Code.INVALID_ARGUMENT, Code.FAILED_PRECONDITION, Code.NOT_FOUND,
                        Code.UNAUTHENTICATED, Code.RESOURCE_EXHAUSTED, Code.OUT_OF_RANGE})

TOKEN = "fuzz-token"
SCORE_TOKEN = "fuzz-score-token"
FEDLEAK = [sys.executable, "-m", "fedleak"]
BATCH = 2
PLAIN_ARGS = ["--dataset", "digits", "--split", "all", "--images", "0-7", "--model",
              "convnet:width=4", "--batch-size", str(BATCH), "--allow-reveal", "--score-budget",
              "1000000", "--image-score-budget", "1000000", "--max-local-steps", "50",
              "--max-message-mb", "2"]
KKT_ARGS = ["--dataset", "digits", "--images", "0-99", "--model", "kkt-mlp:width=32,depth=1",
            "--release-size", "8", "--release-epochs", "40", "--allow-reveal", "--score-budget",
            "1000000", "--image-score-budget", "1000000"]
USERS = 3
DROPPED_USER = 2  # offline from masked-input on
SECAGG_ARGS = ["--dataset", "digits", "--split", "all", "--images", "0-11", "--model",
               "mlp:width=16,depth=1", "--batch-size", str(BATCH), "--users", str(USERS),
               "--defense", "secagg:threshold=2", "--secagg-drop",
               f"{DROPPED_USER}@masked-input", "--allow-reveal", "--secagg-memory-mb", "1"]
#: Rounds of the secure-aggregation victim that fit its 1 MiB budget: 3 users' float64 updates
#: of the 1,210 parameters of mlp:width=16 on 8×8 digits (29 KB a round).
SECAGG_ROUNDS_KEPT = (1 << 20) // (USERS * 1210 * 8)
DEFENSES = ["quantize:bits=4", "prune:p=0.5,scope=global"]
IMAGE_SHAPE = (1, 8, 8)
NUM_CLASSES = 10

# -- the log -------------------------------------------------------------------------------


@dataclass
class FuzzLog:
    """Requests tried and statuses seen per service and RPC, and every failure."""

    requests: defaultdict[str, Counter[str]] = field(
        default_factory=lambda: defaultdict(Counter))
    statuses: defaultdict[str, defaultdict[str, Counter[str]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(Counter)))
    checks: Counter[str] = field(default_factory=Counter)
    messages: defaultdict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    failures: list[dict[str, Any]] = field(default_factory=list)
    crashes: int = 0
    started: float = field(default_factory=time.monotonic)

    def record(self, service: str, rpc: str, code: grpc.StatusCode, details: str = "") -> None:
        self.requests[service][rpc] += 1
        self.statuses[service][rpc][code.name] += 1
        seen = self.messages[f"{service} {rpc} {code.name}"]
        if details and len(seen) < 3 and details[:200] not in seen:
            seen.append(details[:200])

    def fail(self, service: str, rpc: str, problem: str, request: object = None,
             code: grpc.StatusCode | None = None, details: str = "") -> AssertionError:
        """Record a failure and return the assertion to raise."""
        entry = {"service": service, "rpc": rpc, "problem": problem,
                 "code": code.name if code else None, "details": details[:500],
                 "request": _summary(request)}
        self.failures.append(entry)
        return AssertionError(f"{service} {rpc}: {problem}\n{json.dumps(entry, indent=1)}")

    def summary(self) -> dict[str, Any]:
        services = {}
        for service, by_rpc in sorted(self.requests.items()):
            statuses: Counter[str] = Counter()
            for counts in self.statuses[service].values():
                statuses.update(counts)
            services[service] = {
                "requests": sum(by_rpc.values()),
                "requests_per_rpc": dict(sorted(by_rpc.items())),
                "statuses": dict(sorted(statuses.items())),
                "statuses_per_rpc": {rpc: dict(sorted(c.items()))
                                     for rpc, c in sorted(self.statuses[service].items())},
            }
        return {"examples_per_test": EXAMPLES, "seconds": round(time.monotonic() - self.started, 1),
                "requests": sum(s["requests"] for s in services.values()),
                "known_good_checks": dict(sorted(self.checks.items())),
                "services": services, "crashes": self.crashes,
                "failures": len(self.failures), "failure_list": self.failures,
                "sample_messages": dict(sorted(self.messages.items()))}


LOG = FuzzLog()


def _summary(request: object, limit: int = 1500) -> str:
    if request is None:
        return ""
    if isinstance(request, list):
        text = f"{len(request)} messages: " + " | ".join(_summary(r, 300) for r in request[:6])
    else:
        text = str(request)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} characters)"


@pytest.fixture(scope="module", autouse=True)
def fuzz_report() -> Iterator[FuzzLog]:
    """The module's log; written to ``FEDLEAK_FUZZ_REPORT`` at the end when that is set."""
    yield LOG
    if REPORT:
        Path(REPORT).write_text(json.dumps(LOG.summary(), indent=2) + "\n")


# -- services under fuzz ----------------------------------------------------------------------


@dataclass
class Call:
    """One request: the RPC, its message (a list of chunks for Defend), metadata, and what else
    is allowed (codes beyond the documented ones, with a word their message must contain)."""

    rpc: str
    request: Any
    metadata: tuple[tuple[str, str], ...] = ()
    cancel_after: int | None = None  # server streaming: cancel after this many messages
    also: dict[grpc.StatusCode, str] = field(default_factory=dict)
    busy: str = ""  # known-good requests only: retry for a while while refused with this


@dataclass
class Reply:
    code: grpc.StatusCode
    details: str
    message: Any = None  # the response; for streams, the list of messages received


class Service:
    """A running server process under fuzz, its stub, and the known-good request that must
    keep succeeding."""

    def __init__(self, name: str, process: VictimProcess, stub_class: Any) -> None:
        self.name = name
        self.process = process
        options = [("grpc.max_send_message_length", 64 << 20),
                   ("grpc.max_receive_message_length", 64 << 20)]
        self.channel = grpc.insecure_channel(process.address, options=options)
        self.stub = stub_class(self.channel)
        self.sent = 0
        self.good: Callable[[], Call] | None = None
        self.health: Call = Call("Describe", pb.DescribeRequest())
        self.rounds: list[str] = []  # ids of real rounds or releases, newest last
        self.params: list[pb.Tensor] = []  # a victim's global model, as GetGlobalModel sent it
        self.buffers: list[pb.Tensor] = []
        self.on_ok: Callable[[Call, Reply], None] = lambda call, reply: None
        self.invariant: Callable[[], str] = lambda: ""  # what is wrong with its state, or ""

    def invoke(self, call: Call) -> Reply:
        method = getattr(self.stub, call.rpc)
        metadata = list(call.metadata) or None
        try:
            if call.rpc == "Defend":
                stream = method(iter(call.request), timeout=DEADLINE, metadata=metadata)
                return Reply(Code.OK, "", list(stream))
            if call.rpc == "Release":
                stream = method(call.request, timeout=DEADLINE, metadata=metadata)
                got = []
                for message in stream:
                    got.append(message)
                    if call.cancel_after is not None and len(got) > call.cancel_after:
                        stream.cancel()
                return Reply(Code.OK, "", got)
            return Reply(Code.OK, "", method(call.request, timeout=DEADLINE, metadata=metadata))
        except grpc.RpcError as err:
            return Reply(err.code(), err.details() or "")

    def send(self, call: Call) -> Reply:
        """Send a fuzzed request, check its status, then that the service still serves."""
        reply = self.invoke(call)
        LOG.record(self.name, call.rpc, reply.code, reply.details)
        self.sent += 1
        self._check_status(call, reply)
        if reply.code == Code.OK:
            self.on_ok(call, reply)
        self.check_alive(call)
        return reply

    def _check_status(self, call: Call, reply: Reply) -> None:
        code, details = reply.code, reply.details
        if code in call.also:
            if call.also[code] not in details:
                raise LOG.fail(self.name, call.rpc, f"{code.name} without "
                               f"{call.also[code]!r} in its message", call.request, code, details)
        elif code not in DOCUMENTED:
            problem = "hang (deadline passed)" if code == Code.DEADLINE_EXCEEDED else \
                f"undocumented status {code.name}"
            raise LOG.fail(self.name, call.rpc, problem, call.request, code, details)
        if code != Code.OK and not details.strip():
            raise LOG.fail(self.name, call.rpc, "error without a message", call.request, code)
        if "metadata size exceeds" in details:  # the client dropped an over-long message
            raise LOG.fail(self.name, call.rpc, "an error message longer than gRPC's metadata "
                           "limit (the reason never reached the client)", call.request, code,
                           details)
        if len(details) > MAX_DETAILS:
            raise LOG.fail(self.name, call.rpc, f"error message of {len(details)} characters",
                           call.request, code, details)

    def check_alive(self, after: Call | None = None) -> None:
        """The process runs, answers ``health``, and now and then the known-good request."""
        if not self.process.alive():
            LOG.crashes += 1
            raise LOG.fail(self.name, after.rpc if after else "-", "the server process died: "
                           + self.process.stderr_tail()[-1500:],
                           after.request if after else None)
        for call in [self.health] + ([self.good()] if self.good and
                                      self.sent % GOOD_EVERY == 1 else []):
            reply = self.invoke(call)
            waited = time.monotonic() + 10.0
            while call.busy and call.busy in reply.details and time.monotonic() < waited:
                time.sleep(0.05)  # e.g. a cancelled release still stopping
                reply = self.invoke(call)
            LOG.checks[f"{self.name}.{call.rpc}"] += 1
            if reply.code != Code.OK:
                raise LOG.fail(self.name, call.rpc, "a known-good request failed after "
                               f"{_summary(after.request if after else None, 300)}",
                               call.request, reply.code, reply.details)
            self.on_ok(call, reply)
            if call is not self.health:
                problem = self.invariant()
                if problem:
                    raise LOG.fail(self.name, after.rpc if after else "-", problem,
                                   after.request if after else None)

    def close(self) -> None:
        self.channel.close()



def _tokens(key: str, token: str) -> tuple[tuple[str, str], ...]:
    return ((key, token),)


def _remember(service: Service, round_id: str) -> None:
    service.rounds.append(round_id)
    del service.rounds[:-32]


def _victim_on_ok(service: Service) -> Callable[[Call, Reply], None]:
    def on_ok(call: Call, reply: Reply) -> None:
        if call.rpc in ("ComputeUpdate", "BeginSecAgg"):
            _remember(service, reply.message.round_id)
        elif call.rpc == "Release" and reply.message and reply.message[-1].HasField("release"):
            _remember(service, reply.message[-1].release.release_id)
    return on_ok


@pytest.fixture(scope="module")
def processes() -> Iterator[dict[str, VictimProcess]]:
    """Every server under fuzz, started before this module opens any gRPC channel, stopped
    when the module ends.

    Starting a child while gRPC channels are live in this process occasionally crashes the
    child before it runs (gRPC's fork handlers, grpc/grpc#43055: "epoll_wait error: Bad file
    descriptor"), so no fixture starts a process after the first channel exists. They start
    from this (the main) thread: a child started from a worker thread gets its parent-death
    signal when that thread ends.
    """
    specs: dict[str, VictimProcess] = {
        "victim": VictimProcess(PLAIN_ARGS, token=TOKEN,
                                env={"FEDLEAK_SCORE_TOKEN": SCORE_TOKEN}),
        "victim-kkt": VictimProcess(KKT_ARGS, token=TOKEN),
        "victim-secagg": VictimProcess(SECAGG_ARGS, token=TOKEN),
        **{f"defense:{spec}": VictimProcess(["--defense", spec],
                                            command=[*FEDLEAK, "defense", "serve"])
           for spec in DEFENSES},
    }
    try:
        for process in specs.values():
            process.start()
        yield specs
    finally:
        for process in specs.values():
            process.stop()


def _victim_service(name: str, process: VictimProcess) -> Service:
    service = Service(name, process, pb_grpc.VictimStub)
    service.health = Call("Describe", pb.DescribeRequest(),
                          _tokens(TOKEN_METADATA_KEY, TOKEN))
    model = service.invoke(Call("GetGlobalModel", pb.GetGlobalModelRequest()))
    assert model.code == Code.OK, model.details
    service.params = list(model.message.parameters)
    service.buffers = list(model.message.buffers)
    service.on_ok = _victim_on_ok(service)

    def unchanged() -> str:
        """The public global model is the victim's configuration: no request may change it."""
        now = service.invoke(Call("GetGlobalModel", pb.GetGlobalModelRequest()))
        if now.code != Code.OK:
            return f"GetGlobalModel failed: {now.code.name}: {now.details}"
        changed = [t.name for t, u in zip([*now.message.parameters, *now.message.buffers],
                                          [*service.params, *service.buffers], strict=False)
                   if t.SerializeToString() != u.SerializeToString()]
        if changed or now.message != model.message:
            return f"a request changed the global model: {changed[:5] or 'its tensor list'}"
        return ""

    service.invariant = unchanged
    return service


def _warmed_up(service: Service) -> Service:
    """``service`` after one known-good request (a victim's first round or release)."""
    assert service.good is not None
    call = service.good()
    reply = service.invoke(call)
    assert reply.code == Code.OK, reply.details
    service.on_ok(call, reply)
    service.check_alive()
    return service


@pytest.fixture(scope="module")
def victim(processes: dict[str, VictimProcess]) -> Iterator[Service]:
    """A convnet (BatchNorm, a linear ``fc``) victim on digits; Score needs the score token."""
    service = _victim_service("victim", processes["victim"])
    service.good = lambda: Call("ComputeUpdate", pb.ComputeUpdateRequest(
        parameters=service.params, buffers=service.buffers))
    try:
        yield _warmed_up(service)
    finally:
        service.close()


@pytest.fixture(scope="module")
def kkt_victim(processes: dict[str, VictimProcess]) -> Iterator[Service]:
    """A one-output kkt-mlp victim that releases models (40 epochs at most)."""
    service = _victim_service("victim-kkt", processes["victim-kkt"])
    service.good = lambda: Call("Release", pb.ReleaseRequest(max_epochs=3, report_every=1),
                                busy="already training")
    try:
        yield _warmed_up(service)
    finally:
        service.close()


@pytest.fixture(scope="module")
def secagg_victim(processes: dict[str, VictimProcess]) -> Iterator[Service]:
    """Three users aggregating securely (threshold 2); user 2 goes offline at masked-input."""
    service = _victim_service("victim-secagg", processes["victim-secagg"])
    service.good = lambda: Call("BeginSecAgg", pb.BeginSecAggRequest(
        parameters=service.params, buffers=service.buffers))
    try:
        yield _warmed_up(service)
    finally:
        service.close()


GOOD_UPDATE = [("layers.1.weight", (4, 3)), ("layers.1.bias", (4,))]


def _good_defend() -> Call:
    rng = np.random.default_rng(0)
    chunks = []
    for name, shape in GOOD_UPDATE:
        data = rng.normal(size=shape).astype("<f4").tobytes()
        chunks.append(dpb.UpdateChunk(piece=pb.Tensor(name=name, dtype=pb.FLOAT32,
                                                      shape=list(shape), data=data)))
    chunks[0].seed = 7
    return Call("Defend", chunks)


@pytest.fixture(scope="module", params=DEFENSES)
def defense(request: pytest.FixtureRequest,
            processes: dict[str, VictimProcess]) -> Iterator[Service]:
    """``fedleak defense serve`` with one of :data:`DEFENSES`."""
    service = Service(f"defense[{request.param.split(':')[0]}]",
                      processes[f"defense:{request.param}"], dpb_grpc.DefenseServiceStub)
    service.health = Call("Info", dpb.DefenseInfoRequest())
    service.good = _good_defend
    try:
        yield _warmed_up(service)
    finally:
        service.close()


# -- strategies: values ---------------------------------------------------------------------

nan, inf = math.nan, math.inf
FLOAT_DTYPES = (pb.FLOAT32, pb.FLOAT64, pb.FLOAT16, pb.BFLOAT16)
ITEMSIZE = {pb.FLOAT32: 4, pb.FLOAT64: 8, pb.FLOAT16: 2, pb.BFLOAT16: 2, pb.INT64: 8,
            pb.INT32: 4, pb.UINT8: 1, pb.BOOL: 1}
UNKNOWN_DTYPES = [0, 9, 42, -1, 2**31 - 1, -(2**31)]
INT32_EDGES = [0, 1, 2, 3, -1, 2**31 - 1, -(2**31)]
INT64_EDGES = [*INT32_EDGES, 2**32, 2**62, 2**63 - 1, -(2**63)]
HUGE_DIMS = [2**31 - 1, 2**32, 2**62, 2**63 - 1, -1, -(2**63)]
SPECIAL = [nan, inf, -inf, -0.0, 1e30, -1e30, 1e300, 5e-324, 65504.0, 70000.0]
FLOAT_EDGES = [0.0, -0.0, 1e-4, 0.01, 0.5, 1.0, 10.0, 10.000001, 1e300, -1.0, nan, inf, -inf,
               5e-324, 1.7976931348623157e308]
PATTERNS = ["unit", "normal", "special", "one-nan", "zeros", "raw", "big"]
CLEAN_PATTERNS = ["unit", "unit", "normal", "zeros"]

def _rarely(common: st.SearchStrategy[Any], rare: st.SearchStrategy[Any],
            one_in: int = 20) -> st.SearchStrategy[Any]:
    """``rare`` one time in ``one_in``, else ``common``."""
    return st.integers(0, one_in - 1).flatmap(lambda k: rare if k == one_in - 1 else common)


dtypes = st.one_of(st.sampled_from(sorted(ITEMSIZE)), st.sampled_from(UNKNOWN_DTYPES))
float_dtypes = _rarely(st.one_of(st.just(pb.FLOAT32), st.sampled_from(FLOAT_DTYPES)), dtypes, 5)
floats = st.one_of(st.sampled_from(FLOAT_EDGES), st.floats())
int32s = st.one_of(st.sampled_from(INT32_EDGES), st.integers(-(2**31), 2**31 - 1))
int64s = st.one_of(st.sampled_from(INT64_EDGES), st.integers(-(2**63), 2**63 - 1))
dims = st.one_of(st.integers(0, 4), st.integers(0, 4), st.sampled_from(HUGE_DIMS))
many_dims = st.builds(lambda n, last: [1] * n + [last], st.integers(1_000, 100_000),
                      st.sampled_from([-1, 0, 2, 2**62]))
shapes = st.integers(0, 29).flatmap(lambda k: many_dims if k == 29 else
                                    st.lists(dims, max_size=5))
texts = st.text(max_size=24)
huge_texts = st.builds(lambda n, c: c * n, st.integers((1 << 20) - 8, (1 << 20) + 8),
                       st.sampled_from(["a", "\x00", "é"]))


def _count(shape: Sequence[int]) -> int | None:
    """Elements of ``shape``, or None when it has a negative dimension."""
    return None if any(d < 0 for d in shape) else math.prod(shape)


def fill(dtype: int, count: int, pattern: str, seed: int) -> bytes:
    """``count`` elements of ``dtype`` (raw bytes for non-float or unknown dtypes)."""
    rng = np.random.default_rng(seed)
    size = ITEMSIZE.get(dtype, 4)
    if pattern == "raw" or dtype not in FLOAT_DTYPES:
        return rng.bytes(count * size)
    if pattern == "unit":
        values = rng.random(count)
    elif pattern == "normal":
        values = rng.normal(size=count)
    elif pattern == "special":
        values = rng.choice(SPECIAL, count)
    elif pattern == "big":
        values = rng.normal(size=count) * 1e38
    elif pattern == "one-nan":
        values = rng.random(count)
        if count:
            values[rng.integers(count)] = nan
    else:
        values = np.zeros(count)
    with np.errstate(all="ignore"):
        if dtype == pb.BFLOAT16:
            return (values.astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
        wire = {pb.FLOAT32: "<f4", pb.FLOAT64: "<f8", pb.FLOAT16: "<f2"}[dtype]
        return values.astype(wire).tobytes()


def payloads(dtype: int, shape: Sequence[int], clean: bool = False,
             patterns: Sequence[str] = CLEAN_PATTERNS) -> st.SearchStrategy[bytes]:
    """Bytes for a tensor header: mostly exactly right, else a byte short or long, or random;
    ``clean``: exactly right, values of ``patterns``."""
    wrong = st.one_of(st.binary(max_size=64), st.just(b""))
    count = _count(shape)
    if count is None or count * ITEMSIZE.get(dtype, 4) > MAX_FILL:
        return wrong
    exact = st.builds(fill, st.just(dtype), st.just(count),
                      st.sampled_from(list(patterns) if clean else PATTERNS),
                      st.integers(0, 2**32 - 1))
    if clean:
        return exact
    return st.one_of(exact, exact, exact, exact.map(lambda b: b[:-1]),
                     exact.map(lambda b: b + b"\x00"), wrong)


@st.composite
def tensors(draw: st.DrawFn, shape: Sequence[int], dtype: int = pb.FLOAT32,
            name: str = "", names: Sequence[str] = (), odds: int = 4,
            patterns: Sequence[str] = CLEAN_PATTERNS) -> pb.Tensor:
    """A tensor message near ``(name, dtype, shape)``: name, dtype and shape each wrong about
    one time in ``odds``, the payload independently of them; ``odds=0``: exactly that tensor
    with values of ``patterns``."""
    if odds == 0:
        return pb.Tensor(name=name, dtype=dtype, shape=list(shape),
                         data=draw(payloads(dtype, shape, clean=True, patterns=patterns)))
    if draw(st.integers(0, odds - 1)) == 0:
        name = draw(st.one_of(st.sampled_from([*names, "", name]), texts, _rarely(texts,
                                                                                  huge_texts)))
    if draw(st.integers(0, odds - 1)) == 0:
        dtype = draw(dtypes)
    shape = list(shape)
    variant = draw(st.integers(0, 2 * odds - 1))
    if variant == 0:
        shape = draw(shapes)
    elif variant == 1 and shape:
        shape[draw(st.integers(0, len(shape) - 1))] = draw(dims)
    elif variant == 2:
        shape = shape + [1] if draw(st.booleans()) else shape[:-1]
    data = draw(payloads(dtype, shape))
    return pb.Tensor(name=name, dtype=dtype, shape=shape, data=data)


@st.composite
def tensor_lists(draw: st.DrawFn, refs: Sequence[pb.Tensor],
                 others: Sequence[str] = ()) -> list[pb.Tensor]:
    """``refs`` (a model's parameters or buffers) with one to three things wrong."""
    out = [pb.Tensor(name=t.name, dtype=t.dtype, shape=t.shape, data=t.data) for t in refs]
    names = [t.name for t in refs] + list(others)
    ops = draw(st.lists(st.sampled_from(["mutate", "mutate", "drop", "duplicate", "extra",
                                         "shuffle", "poison", "scale", "rename"]),
                        min_size=1, max_size=3))
    for op in ops:
        if not out and op != "extra":
            continue
        i = draw(st.integers(0, max(len(out) - 1, 0)))
        if op == "mutate":
            ref = out[i]
            out[i] = draw(tensors(list(ref.shape), ref.dtype, ref.name, names))
        elif op == "drop":
            del out[i]
        elif op == "duplicate":
            out.insert(draw(st.integers(0, len(out))), out[i])
        elif op == "extra":
            out.append(draw(tensors(draw(shapes), draw(dtypes), draw(texts), names)))
        elif op == "shuffle":
            out = draw(st.permutations(out))
        elif op == "rename":
            out[i] = pb.Tensor(name=draw(st.one_of(st.sampled_from(names), texts)),
                               dtype=out[i].dtype, shape=out[i].shape, data=out[i].data)
        elif op == "poison":  # same header, values that are not finite or far too large
            count = _count(out[i].shape) or 0
            if count * ITEMSIZE.get(out[i].dtype, 4) > MAX_FILL:
                continue
            data = fill(out[i].dtype, count, draw(st.sampled_from(["special", "one-nan", "big"])),
                        draw(st.integers(0, 2**32 - 1)))
            out[i] = pb.Tensor(name=out[i].name, dtype=out[i].dtype, shape=out[i].shape,
                               data=data)
        elif op == "scale" and out[i].dtype == pb.FLOAT32 and len(out[i].data) % 4 == 0:
            values = np.frombuffer(out[i].data, dtype="<f4")
            factor = draw(st.sampled_from([0.0, -1.0, 1e3, 1e15, 1e30, -3e38]))
            with np.errstate(all="ignore"):
                data = (values * np.float32(factor)).astype("<f4").tobytes()
            out[i] = pb.Tensor(name=out[i].name, dtype=out[i].dtype, shape=out[i].shape,
                               data=data)
    return out


KINDS = ["", "", "fedsgd", "fedavg", "fedavg"]
BAD_KINDS = st.one_of(st.sampled_from(["FedAvg", "fedprox", " fedsgd"]), texts)
BATCHNORMS = ["", "", "train", "eval"]
BAD_BATCHNORMS = st.one_of(st.sampled_from(["EVAL", "none"]), texts)
protocols = _rarely(st.builds(
    pb.ProtocolSpec,
    kind=_rarely(st.sampled_from(KINDS), BAD_KINDS, one_in=8),
    num_images=_rarely(st.just(0), st.one_of(st.just(BATCH), int32s), one_in=8),
    local_epochs=_rarely(st.sampled_from([0, 1, 2, 3, 5, 25]),
                         st.one_of(st.sampled_from([26, 100, 101]), int32s), one_in=6),
    batch_size=_rarely(st.sampled_from([0, 1, 2, 3]), int32s, one_in=8),
    learning_rate=_rarely(st.sampled_from([0.0, 1e-4, 0.01, 0.5, 10.0]), floats, one_in=4),
    batchnorm=_rarely(st.sampled_from(BATCHNORMS), BAD_BATCHNORMS, one_in=8),
), st.none(), one_in=3)


def round_ids(known: list[str]) -> st.SearchStrategy[str]:
    """Mostly one of the latest round ids the victim gave out (``known``, read when drawn, so
    the draws do not depend on how many there are); else made up, empty, or about 1 MiB."""
    made_up = st.one_of(texts, st.just(""), st.text(alphabet="0123456789abcdef", min_size=32,
                                                    max_size=32))
    real = st.integers(0, 7).map(lambda k: known[-1 - k % len(known)] if known else "")
    return st.one_of(real, real, _rarely(made_up, huge_texts, one_in=12))


def token_metadata(key: str, token: str) -> st.SearchStrategy[tuple[tuple[str, str], ...]]:
    """Mostly the right token; else none, or a wrong one."""
    wrong = st.sampled_from([(), _tokens(key, "wrong"), _tokens(key, token + "x"),
                             _tokens(key, token[:-1]), _tokens(key, ""),
                             _tokens("x-fedleak-other", token)])
    return _rarely(st.just(_tokens(key, token)), wrong, one_in=6)


# -- strategies: victim requests --------------------------------------------------------------


@st.composite
def round_requests(draw: st.DrawFn, service: Service, kind: type) -> Any:
    """A ComputeUpdateRequest or BeginSecAggRequest: the global model as sent, or with its
    parameters or buffers (or both) wrong; a protocol or none."""
    wrong = draw(st.sampled_from(["none", "none", "parameters", "parameters", "buffers", "both"]))
    params, buffers = list(service.params), list(service.buffers)
    if wrong in ("parameters", "both"):
        params = draw(tensor_lists(service.params, [b.name for b in service.buffers]))
    if wrong in ("buffers", "both"):
        buffers = draw(tensor_lists(service.buffers, [p.name for p in service.params]))
    request = kind(parameters=params, buffers=buffers)
    protocol = draw(protocols)
    if protocol is not None:
        request.protocol.CopyFrom(protocol)
    return request


def compute_update_calls(service: Service) -> st.SearchStrategy[Call]:
    return st.builds(Call, st.just("ComputeUpdate"), round_requests(service,
                                                                    pb.ComputeUpdateRequest))


@st.composite
def score_calls(draw: st.DrawFn, service: Service, images_per_user: int = BATCH,
                layers: Sequence[str] = ("fc",), width: int = 16) -> Call:
    """Score with real or made-up round ids, reconstructions, labels, user ids, features; half
    of them a valid submission for a real round (which the victim then scores)."""
    if draw(st.booleans()):
        return draw(clean_score_calls(service, images_per_user, layers, width))
    request = pb.ScoreRequest(round_id=draw(round_ids(service.rounds)))
    users = draw(st.one_of(st.just([]), st.lists(st.integers(0, USERS - 1), max_size=3),
                           st.lists(int32s, max_size=3)))
    request.user_ids.extend(users)
    n = images_per_user * max(len(set(users)), 1) if service.name == "victim-secagg" else \
        images_per_user
    if draw(st.integers(0, 4)):
        request.images.CopyFrom(draw(tensors([n, *IMAGE_SHAPE], draw(float_dtypes), odds=8)))
    if draw(st.booleans()):
        labels = st.one_of(st.integers(0, NUM_CLASSES - 1), st.integers(0, NUM_CLASSES - 1),
                           st.sampled_from([-1, NUM_CLASSES, 2**63 - 1, -(2**63)]))
        exact = min(n, 16)  # one label per image (not for 200 000 candidates)
        request.labels.extend(draw(st.lists(labels, min_size=exact, max_size=exact)
                                   | st.lists(labels, max_size=16)))
    if draw(st.integers(0, 2)) == 0:
        request.features.CopyFrom(draw(tensors([draw(st.integers(0, 4)), width],
                                               draw(float_dtypes), odds=8)))
        request.feature_layer = draw(st.one_of(st.sampled_from([*layers, "", "body.0", "body",
                                                                "fc.weight", "nonexistent"]),
                                               texts))
    if draw(st.integers(0, 3)) == 0:
        request.recovered_ssim = draw(floats)
    return Call("Score", request, draw(token_metadata(SCORE_TOKEN_METADATA_KEY, SCORE_TOKEN)))


@st.composite
def clean_score_calls(draw: st.DrawFn, service: Service, images_per_user: int,
                      layers: Sequence[str], width: int) -> Call:
    """A valid submission for one of the latest rounds: images on [0, 1] (or, for a release,
    1 to 6 candidates), perhaps labels, features of a linear layer, user ids (secure
    aggregation)."""
    known = service.rounds
    request = pb.ScoreRequest(round_id=draw(st.integers(0, 3).map(
        lambda k: known[-1 - k % len(known)] if known else "")))
    users: list[int] = []
    if service.name == "victim-secagg":
        users = draw(st.lists(st.integers(0, USERS - 1), max_size=USERS, unique=True))
        request.user_ids.extend(users)
    n = images_per_user * max(len(users), 1)
    if service.name == "victim-kkt":
        n = draw(st.integers(1, 6))
    what = draw(st.sampled_from(["images", "images", "labels", "features", "all"]))
    if service.name == "victim-kkt":
        what = "images"  # candidates on [0, 1]: a release scores nothing else
    if what in ("images", "all"):
        request.images.CopyFrom(draw(tensors([n, *IMAGE_SHAPE], odds=0,
                                             patterns=["unit", "unit", "zeros"])))
    if what in ("labels", "all"):
        request.labels.extend(draw(st.lists(st.integers(0, NUM_CLASSES - 1), min_size=n,
                                            max_size=n)))
    if what in ("features", "all"):
        request.features.CopyFrom(draw(tensors([draw(st.integers(1, 4)), width], odds=0)))
        request.feature_layer = draw(st.sampled_from(list(layers)))
    if service.name == "victim-kkt" and draw(st.booleans()):
        request.recovered_ssim = draw(st.floats(-1, 1))
    return Call("Score", request, _tokens(SCORE_TOKEN_METADATA_KEY, SCORE_TOKEN))


@st.composite
def reveal_calls(draw: st.DrawFn, service: Service) -> Call:
    return Call("Reveal", pb.RevealRequest(round_id=draw(round_ids(service.rounds))),
                draw(token_metadata(TOKEN_METADATA_KEY, TOKEN)))


release_requests = st.builds(
    pb.ReleaseRequest,
    learning_rate=_rarely(st.sampled_from([0.0, 0.0, 1e-3, 0.1, 0.5, 2.0, 10.0]), floats, 5),
    max_epochs=_rarely(st.integers(0, 40), st.one_of(st.sampled_from([41, -1]), int64s), 5),
    target_loss=_rarely(st.sampled_from([0.0, 0.0, 1e-5, 0.5, 1e300, 5e-324]), floats, 5),
    report_every=_rarely(st.sampled_from([0, 1, 2, 7, 100]), int32s, 5),
)


@st.composite
def release_calls(draw: st.DrawFn) -> Call:
    cancel_after = draw(_rarely(st.none(), st.integers(0, 2), one_in=6))
    call = Call("Release", draw(release_requests), cancel_after=cancel_after)
    if cancel_after is not None:
        call.also[Code.CANCELLED] = ""
    return call


@st.composite
def secagg_step_calls(draw: st.DrawFn, service: Service) -> Call:
    """A SecAggStep out of any protocol: random round, user, phase and bytes."""
    request = pb.SecAggStepRequest(
        round_id=draw(round_ids(service.rounds)),
        user_id=draw(st.one_of(st.integers(0, USERS), int32s)),
        phase=draw(st.one_of(st.integers(0, 5), int32s)),
        message=draw(st.one_of(st.binary(max_size=80), st.just(b"FLSA\x01")
                               .map(lambda head: head + bytes([2, 255, 255, 255, 255])))),
    )
    return Call("SecAggStep", request, also={Code.UNAVAILABLE: "dropped out"})


def other_victim_calls(service: Service) -> st.SearchStrategy[Call]:
    """Every other RPC, including those meant for another kind of victim."""
    return st.one_of(
        st.builds(Call, st.just("Describe"), st.just(pb.DescribeRequest()),
                  st.one_of(token_metadata(TOKEN_METADATA_KEY, TOKEN),
                            token_metadata(SCORE_TOKEN_METADATA_KEY, SCORE_TOKEN))),
        st.just(Call("GetGlobalModel", pb.GetGlobalModelRequest())),
        reveal_calls(service),
        st.builds(Call, st.just("BeginSecAgg"), round_requests(service, pb.BeginSecAggRequest)),
        secagg_step_calls(service),
        release_calls(),
    )


# -- the victim ---------------------------------------------------------------------------------


@TIMEOUT
@FUZZ
@given(data=st.data())
def test_compute_update_answers_hostile_parameters_and_protocols(
    victim: Service, data: st.DataObject,
) -> None:
    victim.send(data.draw(compute_update_calls(victim), label="call"))


@TIMEOUT
@FUZZ
@given(data=st.data())
def test_score_answers_hostile_submissions(victim: Service, data: st.DataObject) -> None:
    victim.send(data.draw(score_calls(victim), label="call"))


@TIMEOUT
@FUZZ
@given(data=st.data())
def test_every_other_rpc_answers_hostile_requests(victim: Service, data: st.DataObject) -> None:
    victim.send(data.draw(other_victim_calls(victim), label="call"))


# -- model release ----------------------------------------------------------------------------


@TIMEOUT
@FUZZ
@given(data=st.data())
def test_release_and_its_scoring_answer_hostile_requests(
    kkt_victim: Service, data: st.DataObject,
) -> None:
    calls = st.one_of(
        release_calls(), release_calls(),
        score_calls(kkt_victim, images_per_user=draw_candidates(data),
                    layers=("layers.1", "layers.3"), width=64),
        reveal_calls(kkt_victim),
        compute_update_calls(kkt_victim),
    )
    kkt_victim.send(data.draw(calls, label="call"))


def draw_candidates(data: st.DataObject) -> int:
    return data.draw(st.one_of(st.integers(0, 6), st.sampled_from([200_000, 200_001])),
                     label="candidates")


# -- secure aggregation -------------------------------------------------------------------------

PHASES = {pb.ADVERTISE_KEYS: "advertise", pb.SHARE_KEYS: "share", pb.MASKED_INPUT: "masked",
          pb.UNMASKING: "unmask"}
HONEST = ([(u, pb.ADVERTISE_KEYS) for u in range(USERS)]
          + [(u, pb.SHARE_KEYS) for u in range(USERS)]
          + [(u, pb.MASKED_INPUT) for u in range(USERS)]  # DROPPED_USER: UNAVAILABLE
          + [(u, pb.UNMASKING) for u in range(USERS) if u != DROPPED_USER])
MODES = ["honest"] * 6 + ["flip", "truncate", "append", "random", "empty", "other-type", "many"]


@dataclass
class Transcript:
    """What the fuzzing server learnt in one secure-aggregation round."""

    advertised: dict[int, AdvertiseKeys] = field(default_factory=dict)
    shared: dict[int, ShareKeys] = field(default_factory=dict)
    masked: dict[int, MaskedInput] = field(default_factory=dict)
    unmasked: dict[int, UnmaskingShares] = field(default_factory=dict)

    def message(self, user: int, phase: int) -> bytes:
        """The honest server's message to ``user`` in ``phase``, from what it has so far."""
        if phase == pb.SHARE_KEYS:
            keys = tuple(self.advertised[u] for u in sorted(self.advertised))
            return ShareKeysRequest(keys).to_bytes()
        if phase == pb.MASKED_INPUT:
            ciphertexts = {v: s.ciphertexts[user] for v, s in self.shared.items()
                           if v != user and user in s.ciphertexts}
            return MaskedInputRequest(user, ciphertexts).to_bytes()
        if phase == pb.UNMASKING:
            survivors = tuple(sorted(self.masked))
            dropped = tuple(sorted(set(self.shared) - set(self.masked)))
            return UnmaskingRequest(survivors, dropped).to_bytes()
        return b""

    def learn(self, user: int, phase: int, reply: bytes) -> None:
        """Read a user's reply: it must be the message its phase answers with."""
        kinds = {pb.ADVERTISE_KEYS: (AdvertiseKeys, self.advertised),
                 pb.SHARE_KEYS: (ShareKeys, self.shared),
                 pb.MASKED_INPUT: (MaskedInput, self.masked),
                 pb.UNMASKING: (UnmaskingShares, self.unmasked)}
        if phase in kinds:
            kind, into = kinds[phase]
            into[user] = kind.from_bytes(reply)


@st.composite
def secagg_schedules(draw: st.DrawFn) -> list[tuple[int, int, str, Any]]:
    """The honest order of steps with steps inserted, dropped, repeated or swapped; each step
    (user, phase, how its message is made, what the corruption needs)."""
    steps: list[tuple[int, int]] = list(HONEST)
    for op in draw(st.lists(st.sampled_from(["insert", "drop", "repeat", "swap"]), max_size=3)):
        i = draw(st.integers(0, len(steps) - 1)) if steps else 0
        if op == "insert":
            steps.insert(i, (draw(st.one_of(st.integers(0, USERS), int32s)),
                             draw(st.one_of(st.integers(0, 5), int32s))))
        elif op == "drop" and steps:
            del steps[i]
        elif op == "repeat" and steps:
            steps.insert(i, steps[i])
        elif op == "swap" and i + 1 < len(steps):
            steps[i], steps[i + 1] = steps[i + 1], steps[i]
    schedule = []
    for user, phase in steps:
        mode = draw(st.sampled_from(MODES))
        detail: Any = None
        if mode == "flip":
            detail = (draw(st.integers(0, 2**16)), draw(st.integers(1, 255)))
        elif mode == "truncate":
            detail = draw(st.integers(0, 64))
        elif mode == "append":
            detail = draw(st.binary(min_size=1, max_size=8))
        elif mode == "random":
            detail = draw(st.binary(max_size=120))
        elif mode == "other-type":
            detail = draw(st.sampled_from(sorted(PHASES)))
        elif mode == "many":  # a well-formed message listing thousands of users
            detail = draw(st.integers(1_000, 60_000))
        schedule.append((user, phase, mode, detail))
    return schedule


def _corrupt(honest: bytes, mode: str, detail: Any, transcript: Transcript, user: int) -> bytes:
    if mode == "flip" and honest:
        at, xor = detail
        data = bytearray(honest)
        data[at % len(data)] ^= xor
        return bytes(data)
    if mode == "truncate":
        return honest[: max(len(honest) - 1 - detail, 0)]
    if mode == "append":
        return honest + detail
    if mode == "random":
        return detail
    if mode == "empty":
        return b""
    if mode == "many":
        if honest[5:6] == bytes([MaskedInputRequest.MESSAGE_TYPE]):
            return MaskedInputRequest(max(user, 0), {v: b"" for v in range(USERS, detail)}) \
                .to_bytes()
        return UnmaskingRequest(tuple(range(detail)), tuple(range(USERS, detail))).to_bytes()
    if mode == "other-type":
        recipient = user if 0 <= user < USERS else 0
        return transcript.message(recipient, detail) or AdvertiseKeys(0, b"k" * 32, b"m" * 32) \
            .to_bytes()
    return honest


@TIMEOUT
@FUZZ
@given(data=st.data())
def test_secagg_answers_hostile_rounds(
    secagg_victim: Service, data: st.DataObject,
) -> None:
    service = secagg_victim
    begin = data.draw(_rarely(st.just(None), round_requests(service, pb.BeginSecAggRequest),
                              one_in=3), label="begin")
    if begin is not None:  # a hostile BeginSecAgg, then the protocol on a clean round
        service.send(Call("BeginSecAgg", begin))
    reply = service.send(Call("BeginSecAgg", pb.BeginSecAggRequest(
        parameters=service.params, buffers=service.buffers)))
    assert reply.code == Code.OK, reply.details
    round_id = reply.message.round_id
    transcript = Transcript()
    for user, phase, mode, detail in data.draw(secagg_schedules(), label="schedule"):
        target = round_id if data.draw(st.integers(0, 9), label="round") else \
            data.draw(round_ids(service.rounds), label="other round")
        honest = transcript.message(user, phase) if 0 <= user < USERS else b""
        message = _corrupt(honest, mode, detail, transcript, user)
        request = pb.SecAggStepRequest(round_id=target, user_id=user, phase=phase,
                                       message=message)
        got = service.send(Call("SecAggStep", request, also={Code.UNAVAILABLE: "dropped out"}))
        if got.code == Code.OK and target == round_id:
            try:
                transcript.learn(user, phase, got.message.message)
            except ValueError as err:
                raise LOG.fail(service.name, "SecAggStep", f"a reply that is not the phase's "
                               f"message: {err}", request) from err
    if data.draw(st.booleans(), label="score"):
        service.send(data.draw(score_calls(service), label="score call"))


@TIMEOUT
@FUZZ
@given(data=st.data())
def test_secagg_victim_answers_hostile_round_requests(
    secagg_victim: Service, data: st.DataObject,
) -> None:
    calls = st.one_of(
        st.builds(Call, st.just("BeginSecAgg"), round_requests(secagg_victim,
                                                               pb.BeginSecAggRequest)),
        compute_update_calls(secagg_victim),
        secagg_step_calls(secagg_victim),
        reveal_calls(secagg_victim),
    )
    secagg_victim.send(data.draw(calls, label="call"))


# -- the defense service --------------------------------------------------------------------------

piece_names = st.one_of(st.sampled_from(["a", "b", "layers.1.weight", "fc.bias", ""]), texts)
clean_names = st.one_of(st.sampled_from(["a", "b", "layers.1.weight", "fc.bias"]),
                        st.text(min_size=1, max_size=12))


@st.composite
def update_pieces(draw: st.DrawFn, clean: bool = False) -> pb.Tensor:
    """One whole tensor of an update: mostly small, sometimes a multi-chunk one; ``clean``:
    floats of a valid shape, finite."""
    big = st.just([(1 << 18) + 3])
    if clean:
        dtype = draw(st.sampled_from(FLOAT_DTYPES))
        shape = draw(_rarely(st.lists(st.integers(1, 5), max_size=3), big, one_in=10))
        return pb.Tensor(name=draw(clean_names), dtype=dtype, shape=shape,
                         data=draw(payloads(dtype, shape, clean=True)))
    dtype = draw(st.one_of(st.just(pb.FLOAT32), st.sampled_from(FLOAT_DTYPES), dtypes))
    empty_but_huge = st.sampled_from([[0, 2**62], [2**61, 0], [0, 2**63 - 1, 2**63 - 1]])
    shape = draw(_rarely(st.lists(st.integers(0, 5), max_size=3),
                         st.one_of(shapes, big, empty_but_huge, many_dims), one_in=5))
    return pb.Tensor(name=draw(piece_names), dtype=dtype, shape=shape,
                     data=draw(payloads(dtype, shape)))


@st.composite
def update_streams(draw: st.DrawFn) -> list[dpb.UpdateChunk]:
    """An update as chunks (random chunk sizes), then up to two things wrong with the stream;
    a third of them a valid update, untouched."""
    clean = draw(st.integers(0, 2)) == 0
    pieces = st.lists(update_pieces(clean), min_size=int(clean), max_size=4,
                      unique_by=(lambda t: t.name) if clean else None)
    chunks: list[dpb.UpdateChunk] = []
    for piece in draw(pieces):
        size = draw(st.one_of(st.sampled_from([1, 3, 4, 64, 1 << 20]), st.integers(1, 200)))
        size = max(size, len(piece.data) // 64)  # at most 64 chunks a tensor
        for offset in range(0, max(len(piece.data), 1), size):
            part = pb.Tensor(name=piece.name, dtype=piece.dtype, shape=piece.shape,
                             data=piece.data[offset:offset + size])
            chunks.append(dpb.UpdateChunk(piece=part, offset=offset))
    if chunks:
        chunks[0].seed = draw(st.one_of(st.sampled_from([0, 1, 2**63 - 1, 2**64 - 1]),
                                        st.integers(0, 2**64 - 1)))
    ops = st.lists(st.sampled_from(["drop", "duplicate", "swap", "offset", "rename", "reshape",
                                    "redtype", "seed"]), max_size=2)
    for op in draw(st.just([]) if clean else ops):
        if not chunks:
            break
        i = draw(st.integers(0, len(chunks) - 1))
        chunk = dpb.UpdateChunk()
        chunk.CopyFrom(chunks[i])
        if op == "drop":
            del chunks[i]
            continue
        if op == "duplicate":
            chunks.insert(i, chunk)
            continue
        if op == "swap":
            j = draw(st.integers(0, len(chunks) - 1))
            chunks[i], chunks[j] = chunks[j], chunks[i]
            continue
        if op == "offset":
            chunk.offset = draw(st.one_of(st.integers(0, 300), st.sampled_from(
                [2**32, 2**63, 2**64 - 1])))
        elif op == "rename":
            chunk.piece.name = draw(piece_names)
        elif op == "reshape":
            del chunk.piece.shape[:]
            chunk.piece.shape.extend(draw(shapes))
        elif op == "redtype":
            chunk.piece.dtype = draw(dtypes)
        elif op == "seed":
            chunk.seed = draw(st.integers(0, 2**64 - 1))
        chunks[i] = chunk
    return chunks


def _check_defended(service: Service, sent: list[dpb.UpdateChunk],
                    replies: list[dpb.UpdateChunk]) -> None:
    """A defended update has the same tensors (names, order, dtypes, shapes), finite."""
    try:
        expected = assemble_update(sent)
        got = assemble_update(replies, "reply")
    except UpdateStreamError as err:
        raise LOG.fail(service.name, "Defend", f"accepted a stream the wire format refuses, or "
                       f"answered one it cannot read: {err}", sent) from err
    shapes_sent = [(n, t.dtype, tuple(t.shape)) for n, t in zip(expected.names, expected.tensors,
                                                                strict=True)]
    shapes_got = [(n, t.dtype, tuple(t.shape)) for n, t in zip(got.names, got.tensors,
                                                               strict=True)]
    if shapes_got != shapes_sent:
        raise LOG.fail(service.name, "Defend", f"answered {shapes_got[:4]} for {shapes_sent[:4]}",
                       sent)
    bad = [n for n, t in zip(got.names, got.tensors, strict=True) if not t.isfinite().all()]
    if bad:
        raise LOG.fail(service.name, "Defend", f"answered NaN or infinite values in {bad[:4]}",
                       sent)


@TIMEOUT
@FUZZ
@given(data=st.data())
def test_defense_service_answers_hostile_update_streams(
    defense: Service, data: st.DataObject,
) -> None:
    if data.draw(st.integers(0, 9), label="info") == 0:
        defense.send(Call("Info", dpb.DefenseInfoRequest()))
        return
    chunks = data.draw(update_streams(), label="chunks")
    reply = defense.send(Call("Defend", chunks))
    if reply.code == Code.OK:
        _check_defended(defense, chunks, reply.message)


# -- raw bytes, stalled calls, round floods (issue 21) -------------------------------------------

#: Examples of the tests below, which open many calls each: a tenth of the others.
RAW_FUZZ = settings(FUZZ, max_examples=max(4, EXAMPLES // 10))
VICTIM_RPCS = [(m.name, m.server_streaming)
               for m in pb.DESCRIPTOR.services_by_name["Victim"].methods]
IDENTITY = dict(request_serializer=lambda b: b, response_deserializer=lambda b: b)


def send_raw(service: Service, rpc: str, data: list[bytes], path: str,
             streams_in: bool = False, streams_out: bool = False) -> Reply:
    """Send ``data`` as the raw request bytes of ``rpc`` (one message, or a stream of them);
    the status must be a documented one — garbage is ``INVALID_ARGUMENT``, never
    ``INTERNAL`` — and the service must keep serving."""
    method = f"{path}/{rpc}"
    try:
        if streams_in:
            list(service.channel.stream_stream(method, **IDENTITY)(iter(data), timeout=DEADLINE))
        elif streams_out:
            list(service.channel.unary_stream(method, **IDENTITY)(data[0], timeout=DEADLINE))
        else:
            service.channel.unary_unary(method, **IDENTITY)(data[0], timeout=DEADLINE)
        reply = Reply(Code.OK, "")
    except grpc.RpcError as err:
        reply = Reply(err.code(), err.details() or "")
    LOG.record(service.name, f"{rpc} (raw bytes)", reply.code, reply.details)
    service.sent += 1
    service._check_status(Call(rpc, data), reply)
    service.check_alive(Call(rpc, data))
    return reply


#: Bytes no message parses (a varint that never ends, a truncated length-delimited field, a
#: reserved wire type), and random bytes (which sometimes parse).
GARBAGE = [b"\x08" + b"\xff" * 11, b"\x0a\x7f", b"\x0f", b"\xff" * 64]
raw_bytes = st.one_of(st.sampled_from(GARBAGE), st.binary(max_size=512))


@TIMEOUT
@RAW_FUZZ
@given(data=st.data())
def test_raw_garbage_bytes_are_refused_with_a_documented_code(
    victim: Service, data: st.DataObject,
) -> None:
    rpc, streams_out = data.draw(st.sampled_from(VICTIM_RPCS), label="rpc")
    if rpc == "Release":  # a plain classifier victim refuses releases: no training
        streams_out = True
    payload = data.draw(raw_bytes, label="bytes")
    reply = send_raw(victim, rpc, [payload], "/fedleak.v1.Victim", streams_out=streams_out)
    if payload in GARBAGE:
        assert reply.code == Code.INVALID_ARGUMENT and "not a valid" in reply.details, reply


@TIMEOUT
@RAW_FUZZ
@given(data=st.data())
def test_raw_garbage_chunks_are_refused_by_the_defense_service(
    defense: Service, data: st.DataObject,
) -> None:
    good = [c.SerializeToString() for c in _good_defend().request]
    chunks = data.draw(st.lists(raw_bytes, min_size=1, max_size=3), label="garbage")
    at = data.draw(st.integers(0, len(good)), label="at")
    stream = [*good[:at], *chunks, *good[at:]]
    reply = send_raw(defense, "Defend", stream, "/fedleak.v1.DefenseService", streams_in=True)
    if any(c in GARBAGE for c in chunks):
        assert reply.code == Code.INVALID_ARGUMENT, reply


def _stall(service: Service, methods: list[str], count: int,
           release: threading.Event) -> list[grpc.Future]:
    """``count`` calls cycling over ``methods`` that send headers and never a message."""

    def never() -> Iterator[bytes]:
        release.wait(DEADLINE)
        yield from ()

    return [service.channel.stream_unary(methods[i % len(methods)], **IDENTITY)
            .future(never(), timeout=DEADLINE) for i in range(count)]


def _answers_within_a_second(service: Service, health: Call) -> None:
    method = getattr(service.stub, health.rpc)
    try:
        method(health.request, timeout=60, metadata=list(health.metadata) or None)
    except grpc.RpcError as err:
        raise LOG.fail(service.name, health.rpc, "no answer within 1 s while calls stall",
                       health.request, err.code(), err.details() or "") from None
    LOG.checks[f"{service.name}.{health.rpc} while stalled"] += 1


def _answers_while_stalled(service: Service, methods: list[str], count: int) -> None:
    """Stall ``count`` calls of ``methods`` (9 or more: more than the victim's 8 worker
    threads); the service's health call must answer within a second three times meanwhile,
    and the service serve normally after."""
    release = threading.Event()
    calls = _stall(service, methods, count, release)
    try:
        for _ in range(3):
            _answers_within_a_second(service, service.health)
    finally:
        release.set()
        for call in calls:
            call.cancel()
    service.check_alive()


@TIMEOUT
@RAW_FUZZ
@given(data=st.data())
def test_stalled_calls_leave_the_victim_answering(victim: Service, data: st.DataObject) -> None:
    names = data.draw(st.lists(st.sampled_from([r for r, _ in VICTIM_RPCS]), min_size=1,
                               max_size=4), label="stalled rpcs")
    _answers_while_stalled(victim, [f"/fedleak.v1.Victim/{n}" for n in names],
                           data.draw(st.integers(9, 64), label="stalled calls"))


@TIMEOUT
@RAW_FUZZ
@given(data=st.data())
def test_stalled_streams_leave_the_defense_service_answering(
    defense: Service, data: st.DataObject,
) -> None:
    _answers_while_stalled(defense, ["/fedleak.v1.DefenseService/Defend"],
                           data.draw(st.integers(9, 64), label="stalled calls"))


@TIMEOUT
@RAW_FUZZ
@given(data=st.data())
def test_secagg_round_floods_stay_within_the_memory_budget(
    secagg_victim: Service, data: st.DataObject,
) -> None:
    """Rounds begun and never finished: each is answered, the oldest are forgotten (their
    steps refused with RESOURCE_EXHAUSTED naming --secagg-memory-mb), and an honest round
    still completes afterwards (the next test's known-good BeginSecAgg and check_alive)."""
    service = secagg_victim
    flood = data.draw(st.integers(SECAGG_ROUNDS_KEPT + 1, SECAGG_ROUNDS_KEPT + 8),
                      label="rounds")
    begun = []
    for _ in range(flood):
        reply = service.send(Call("BeginSecAgg", pb.BeginSecAggRequest(
            parameters=service.params, buffers=service.buffers)))
        assert reply.code == Code.OK, reply.details
        begun.append(reply.message.round_id)
    step = pb.SecAggStepRequest(round_id=begun[0], user_id=0, phase=pb.ADVERTISE_KEYS)
    reply = service.send(Call("SecAggStep", step,
                              also={Code.RESOURCE_EXHAUSTED: "--secagg-memory-mb"}))
    assert reply.code == Code.RESOURCE_EXHAUSTED, reply  # more rounds than the budget holds
