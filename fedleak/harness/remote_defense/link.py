"""``remote``: a defense that runs in another process, behind ``fedleak.v1.DefenseService``.

    fedleak victim serve --defense remote:address=127.0.0.1:50061
    fedleak victim serve --defense remote:address=127.0.0.1:50062,stage=per-example

The victim streams its finished update Δ = [Δ_l] to the service and sends the server what comes
back, Δ' = D(Δ; s), where D is whatever mechanism the service implements and s a seed the victim
draws from its own secret generator for each call (so ``--defense-seed`` makes runs
reproducible and the server never learns the randomness). At start the victim asks the service
for its ``Info`` (name, public parameters) and publishes it in ``Describe`` beside the address:
the mechanism stays public (Kerckhoffs) even though its code lives elsewhere. A service may
also declare its mechanism (``DefenseInfo.claim``: stage, clip and geometry, noise, sampling,
shares; :mod:`~fedleak.harness.remote_defense.declaration`); the victim publishes the
declaration, accounts for it and lets an audit test it (docs/audit.md) exactly as it does a
built-in's — a claim is what the service says, not what it does.

With ``stage=per-example`` the service is a per-example defense (a DP-SGD of the user's own):
every local step the victim streams the step's per-example gradients, one tensor
``[B, *θ_l.shape]`` per parameter, with the expected batch size, and uses the gradient that comes
back (:class:`RemotePerExampleDefense`).

Everything the service returns is checked before it can leave the victim: the same tensors in
the same order, names, dtypes and shapes as sent, finite values. A dead, slow or misbehaving
service fails the round with ``FAILED_PRECONDITION`` and a message naming the service and what
was wrong; the victim keeps serving. This module is registered through the ``fedleak.defenses``
entry point (``pyproject.toml``), like a third-party plug-in: ``fedleak.defenses`` stays free
of gRPC.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import torch

from fedleak.defenses.defense_registry import DefenseConfigError
from fedleak.defenses.mechanism import PER_EXAMPLE, DeclarationError, Mechanism
from fedleak.defenses.stages import GaussianClaim, PerExampleDefense, UpdateDefense
from fedleak.harness.remote_defense.declaration import mechanism_from_pb
from fedleak.harness.remote_defense.wire import (
    DEFAULT_CHUNK_BYTES,
    ExpectedTensor,
    UpdateStreamError,
    assemble_update,
    update_chunks,
)
from fedleak.harness.wire.reachability import diagnose, split_address
from fedleak.harness.wire.request_errors import FailedPrecondition
from fedleak.v1 import defense_pb2 as dpb
from fedleak.v1 import defense_pb2_grpc as dpb_grpc

REMOTE_STAGES = ("update", "per-example")
REMOTE_PARAM_PREFIX = "remote."
CLAIM_PARAM_PREFIX = "claim."


@dataclass
class RemoteDefenseConfig:
    address: str = field(default="", metadata={"help": "HOST:PORT of a fedleak.v1."
                                                       "DefenseService (required)"})
    stage: str = field(default="update", metadata={
        "help": "where it acts: update, or per-example (each local step's per-example "
                "gradients)"})
    timeout: float = field(default=60.0, metadata={"help": "seconds for one Defend call"})
    connect_timeout: float = field(default=10.0, metadata={"help": "seconds to wait for the "
                                                                   "service at start"})
    tls_ca: str = field(default="", metadata={
        "help": "PEM certificate (or CA) that signed the service's --tls-cert: speak TLS"})

    def __post_init__(self) -> None:
        try:
            split_address(self.address, "defense service")
        except ValueError:
            raise ValueError(f"address must be HOST:PORT of a running defense service (e.g. "
                             f"`fedleak defense serve`), got {self.address!r}") from None
        if self.tls_ca and not Path(self.tls_ca).is_file():
            raise ValueError(f"tls-ca {self.tls_ca!r} is not a file: give the PEM certificate")
        if self.stage not in REMOTE_STAGES:
            raise ValueError(f"stage {self.stage!r} cannot run out of process; a remote "
                             f"defense acts at stage {' or '.join(REMOTE_STAGES)}")
        if not self.timeout > 0 or not self.connect_timeout > 0:
            raise ValueError("timeout and connect-timeout must be positive seconds")


class RemoteLink:
    """The connection to a ``DefenseService``: its channel, its ``Info``, its declaration."""

    config: RemoteDefenseConfig
    chunk_bytes: int
    info: dpb.DefenseInfo

    def _connect(self, chunk_bytes: int) -> None:
        self.chunk_bytes = chunk_bytes
        self._ca = Path(self.config.tls_ca).read_bytes() if self.config.tls_ca else None
        if self._ca is not None:
            credentials = grpc.ssl_channel_credentials(root_certificates=self._ca)
            self._channel = grpc.secure_channel(self.config.address, credentials)
        else:
            self._channel = grpc.insecure_channel(self.config.address)
        self._stub = dpb_grpc.DefenseServiceStub(self._channel)
        self.info = self._fetch_info()

    @property
    def label(self) -> str:
        """How errors name this link: the remote's own name and its address."""
        return f"remote defense {self.info.name!r} at {self.config.address}"

    def _fetch_info(self) -> dpb.DefenseInfo:
        address, wait = self.config.address, self.config.connect_timeout
        try:
            grpc.channel_ready_future(self._channel).result(timeout=wait)
            info = self._stub.Info(dpb.DefenseInfoRequest(), timeout=wait)
        except grpc.FutureTimeoutError:
            self._channel.close()
            why = diagnose(address, self._ca, peer="defense service")
            raise DefenseConfigError(f"no defense service answered at {address} within "
                                     f"{wait:g} s: {why} "
                                     f"(start it with e.g. `fedleak defense serve --port PORT "
                                     f"--defense clip:max-norm=1`, or fix remote:address)") \
                from None
        except grpc.RpcError as err:
            self._channel.close()
            raise DefenseConfigError(f"the defense service at {address} failed Info: "
                                     f"{err.code().name}: {err.details()}") from None
        if not info.name:
            raise DefenseConfigError(f"the defense service at {address} reports no name in "
                                     "Info; it must name its mechanism")
        stage = info.stage or "update"
        if stage != self.config.stage:
            raise DefenseConfigError(f"the defense service at {address} ({info.name}) acts at "
                                     f"stage {stage!r}, not {self.config.stage!r}: link it "
                                     f"with remote:address={address},stage={stage}")
        if info.HasField("claim"):
            try:
                declared = mechanism_from_pb(info.claim)
            except (DeclarationError, ValueError) as err:
                raise DefenseConfigError(f"the defense service at {address} ({info.name}) "
                                         f"publishes an impossible claim: {err}") from None
            if declared.stage != stage:
                raise DefenseConfigError(f"the defense service at {address} ({info.name}) "
                                         f"acts at stage {stage!r} but declares a "
                                         f"{declared.stage!r} mechanism")
        return info

    def mechanism(self) -> Mechanism | None:
        """What the service declares (``DefenseInfo.claim``): the victim accounts for it and
        an audit tests it; None when the service declares nothing."""
        return mechanism_from_pb(self.info.claim) if self.info.HasField("claim") else None

    def gaussian_claim(self) -> GaussianClaim | None:
        """The declaration's clip and noise (the shorthand of fields 1–2)."""
        if not self.info.HasField("claim"):
            return None
        claim = self.info.claim
        return GaussianClaim(clip_norm=claim.clip_norm or None, noise_std=claim.noise_std)

    def _link_params(self, params: dict[str, str]) -> dict[str, str]:
        params["remote-name"] = self.info.name
        if self.info.version:
            params["remote-version"] = self.info.version
        for key, value in sorted(self.info.params.items()):
            params[REMOTE_PARAM_PREFIX + key] = value
        claim = self.gaussian_claim()
        if claim is not None:
            params[CLAIM_PARAM_PREFIX + "clip-norm"] = f"{claim.clip_norm or 0:g}"
            params[CLAIM_PARAM_PREFIX + "noise-std"] = f"{claim.noise_std:g}"
        return params

    def _rpc_failure(self, err: grpc.RpcError) -> str:
        code = err.code()
        if code == grpc.StatusCode.UNAVAILABLE:
            return (f"the {self.label} is unreachable ({err.details()}); restart it at that "
                    "address or start the victim without it")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return (f"the {self.label} did not answer within {self.config.timeout:g} s; raise "
                    "remote:timeout or check the service")
        return f"the {self.label} refused the update: {code.name}: {err.details()}"

    def _defend(self, tensors: list[torch.Tensor], names: list[str], seed: int,
                expected_batch_size: int = 0, reply: list[ExpectedTensor] | None = None) \
            -> tuple[list[str], list[torch.Tensor]]:
        """Stream ``tensors`` out and the reply back, checked chunk by chunk against
        ``reply`` (default: the names, dtypes and shapes sent): a reply that declares more is
        refused at its first byte too many, and the stream is cancelled."""
        chunks = update_chunks(tensors, names, seed, self.chunk_bytes, expected_batch_size)
        if reply is None:
            reply = [ExpectedTensor.like(t, n) for t, n in zip(tensors, names, strict=True)]
        replies = None
        try:
            replies = self._stub.Defend(chunks, timeout=self.config.timeout)
            defended = assemble_update(replies, f"reply of the {self.label}", reply)
        except grpc.RpcError as err:
            raise FailedPrecondition(self._rpc_failure(err)) from None
        except UpdateStreamError as err:
            if replies is not None:
                replies.cancel()  # the rest of a lying reply is never read
            raise FailedPrecondition(f"{err}; fix the defense service") from None
        return defended.names, defended.tensors

    def _checked_reply(self, expected: list[torch.Tensor], names: list[str],
                       got_names: list[str], got: list[torch.Tensor]) -> list[torch.Tensor]:
        """The reply: the same tensors, names, dtypes and shapes as ``expected``, finite."""
        if got_names != names:
            raise FailedPrecondition(
                f"the {self.label} returned tensors {_short(got_names)}, expected "
                f"{_short(names)}: it must answer with the same tensors in the same order")
        for name, before, after in zip(names, expected, got, strict=True):
            if after.shape != before.shape or after.dtype != before.dtype:
                raise FailedPrecondition(
                    f"the {self.label} returned {name!r} as {list(after.shape)} {after.dtype}, "
                    f"expected {list(before.shape)} {before.dtype}")
            if after.is_floating_point() and not torch.isfinite(after).all():
                raise FailedPrecondition(f"the {self.label} returned NaN or infinite values "
                                         f"in {name!r}")
        return [g.to(s.device) for g, s in zip(got, expected, strict=True)]

    def close(self) -> None:
        self._channel.close()


class RemoteDefense(RemoteLink, UpdateDefense):
    """Δ' = D(Δ; s) computed by the ``DefenseService`` at ``address`` (see the module doc);
    with ``stage=per-example`` a :class:`RemotePerExampleDefense` instead."""

    Config = RemoteDefenseConfig

    def __new__(cls, config: RemoteDefenseConfig | None = None,
                chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Any:
        if cls is RemoteDefense and config is not None and config.stage == PER_EXAMPLE:
            link = object.__new__(RemotePerExampleDefense)
            RemotePerExampleDefense.__init__(link, config, chunk_bytes)
            return link
        return object.__new__(cls)

    def __init__(self, config: RemoteDefenseConfig | None = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        UpdateDefense.__init__(self, config)
        self._connect(chunk_bytes)

    def public_params(self) -> dict[str, str]:
        """Address and settings, the remote's name and version, and its params as ``remote.*``."""
        return self._link_params(super().public_params())

    def apply(self, update: list[torch.Tensor], generator: torch.Generator) -> list[torch.Tensor]:
        names = list(self.parameter_names) if len(self.parameter_names) == len(update) \
            else [str(i) for i in range(len(update))]  # unbound: tensors by position
        seed = int(torch.randint(0, 2**63 - 1, (1,), generator=generator))
        got_names, got = self._defend(update, names, seed)
        return self._checked_reply(update, names, got_names, got)


class RemotePerExampleDefense(RemoteLink, PerExampleDefense):
    """Each local step's per-example gradients through the per-example ``DefenseService`` at
    ``address``; the step uses the gradient it answers (module docstring)."""

    Config = RemoteDefenseConfig
    name = "remote"

    def __init__(self, config: RemoteDefenseConfig | None = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        PerExampleDefense.__init__(self, config)
        self._connect(chunk_bytes)

    def public_params(self) -> dict[str, str]:
        return self._link_params(super().public_params())

    def privatise(self, per_example: list[torch.Tensor], expected_batch_size: int,
                  generator: torch.Generator) -> list[torch.Tensor]:
        names = [str(i) for i in range(len(per_example))]
        seed = int(torch.randint(0, 2**63 - 1, (1,), generator=generator))
        shapes = [torch.empty(g.shape[1:], dtype=g.dtype) for g in per_example]
        got_names, got = self._defend(per_example, names, seed, max(expected_batch_size, 1),
                                      [ExpectedTensor.like(s, n) for s, n in
                                       zip(shapes, names, strict=True)])
        return self._checked_reply(shapes, names, got_names, got)


def _short(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return f"[{shown}{', …' if len(names) > limit else ''}] ({len(names)})"
