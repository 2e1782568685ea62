"""``remote``: an update defense that runs in another process, behind ``fedleak.v1.DefenseService``.

    fedleak victim serve --defense remote:address=127.0.0.1:50061

The victim streams its finished update Δ = [Δ_l] to the service and sends the server what comes
back, Δ' = D(Δ; s), where D is whatever mechanism the service implements and s a seed the victim
draws from its own secret generator for each call (so ``--defense-seed`` makes runs
reproducible and the server never learns the randomness). At start the victim asks the service
for its ``Info`` (name, public parameters) and publishes it in ``Describe`` beside the address:
the mechanism stays public (Kerckhoffs) even though its code lives elsewhere. A service may
also claim to be a Gaussian mechanism (``DefenseInfo.claim``: clip to S, add N(0, s²)); the
victim publishes the claim (``claim.*``), accounts for it and lets an audit test it
(docs/audit.md) — a claim is what the service says, not what it does.

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

import grpc
import torch

from fedleak.defenses.defense_registry import DefenseConfigError
from fedleak.defenses.stages import GaussianClaim, UpdateDefense
from fedleak.harness.remote_defense.wire import (
    DEFAULT_CHUNK_BYTES,
    UpdateStreamError,
    assemble_update,
    update_chunks,
)
from fedleak.harness.wire.reachability import diagnose, split_address
from fedleak.harness.wire.request_errors import FailedPrecondition
from fedleak.v1 import defense_pb2 as dpb
from fedleak.v1 import defense_pb2_grpc as dpb_grpc

REMOTE_STAGES = ("update",)
REMOTE_PARAM_PREFIX = "remote."
CLAIM_PARAM_PREFIX = "claim."


@dataclass
class RemoteDefenseConfig:
    address: str = field(default="", metadata={"help": "HOST:PORT of a fedleak.v1."
                                                       "DefenseService (required)"})
    stage: str = field(default="update", metadata={"help": "where it acts; only update"})
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


class RemoteDefense(UpdateDefense):
    """Δ' = D(Δ; s) computed by the ``DefenseService`` at ``address`` (see the module doc)."""

    Config = RemoteDefenseConfig

    def __init__(self, config: RemoteDefenseConfig | None = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        super().__init__(config)
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
        if info.stage and info.stage != self.config.stage:
            raise DefenseConfigError(f"the defense service at {address} ({info.name}) acts at "
                                     f"stage {info.stage!r}, not {self.config.stage!r}")
        if info.HasField("claim"):
            try:
                self._claim_of(info)
            except ValueError as err:
                raise DefenseConfigError(f"the defense service at {address} ({info.name}) "
                                         f"publishes an impossible claim: {err}") from None
        return info

    @staticmethod
    def _claim_of(info: dpb.DefenseInfo) -> GaussianClaim | None:
        if not info.HasField("claim"):
            return None
        clip = info.claim.clip_norm
        if not (clip >= 0 and info.claim.noise_std >= 0):
            raise ValueError("clip_norm and noise_std must be >= 0")
        return GaussianClaim(clip_norm=clip or None, noise_std=info.claim.noise_std)

    def gaussian_claim(self) -> GaussianClaim | None:
        """What the service says it does (``DefenseInfo.claim``): the victim accounts for it
        and an audit tests it; None when the service claims nothing."""
        return self._claim_of(self.info)

    def public_params(self) -> dict[str, str]:
        """Address and settings, the remote's name and version, and its params as ``remote.*``."""
        params = super().public_params()
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

    def apply(self, update: list[torch.Tensor], generator: torch.Generator) -> list[torch.Tensor]:
        names = list(self.parameter_names) if len(self.parameter_names) == len(update) \
            else [str(i) for i in range(len(update))]  # unbound: tensors by position
        seed = int(torch.randint(0, 2**63 - 1, (1,), generator=generator))
        chunks = update_chunks(update, names, seed, self.chunk_bytes)
        try:
            replies = self._stub.Defend(chunks, timeout=self.config.timeout)
            defended = assemble_update(replies, f"reply of the {self.label}")
        except grpc.RpcError as err:
            raise FailedPrecondition(self._rpc_failure(err)) from None
        except UpdateStreamError as err:
            raise FailedPrecondition(f"{err}; fix the defense service") from None
        return self._checked(update, names, defended.names, defended.tensors)

    def _rpc_failure(self, err: grpc.RpcError) -> str:
        code = err.code()
        if code == grpc.StatusCode.UNAVAILABLE:
            return (f"the {self.label} is unreachable ({err.details()}); restart it at that "
                    "address or start the victim without it")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return (f"the {self.label} did not answer within {self.config.timeout:g} s; raise "
                    "remote:timeout or check the service")
        return f"the {self.label} refused the update: {code.name}: {err.details()}"

    def _checked(self, sent: list[torch.Tensor], names: list[str], got_names: list[str],
                 got: list[torch.Tensor]) -> list[torch.Tensor]:
        if got_names != names:
            raise FailedPrecondition(
                f"the {self.label} returned tensors {_short(got_names)}, expected "
                f"{_short(names)}: it must answer with the same tensors in the same order")
        for name, before, after in zip(names, sent, got, strict=True):
            if after.shape != before.shape or after.dtype != before.dtype:
                raise FailedPrecondition(
                    f"the {self.label} returned {name!r} as {list(after.shape)} {after.dtype}, "
                    f"expected {list(before.shape)} {before.dtype}")
            if after.is_floating_point() and not torch.isfinite(after).all():
                raise FailedPrecondition(f"the {self.label} returned NaN or infinite values "
                                         f"in {name!r}")
        return [g.to(s.device) for g, s in zip(got, sent, strict=True)]

    def close(self) -> None:
        self._channel.close()


def _short(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return f"[{shown}{', …' if len(names) > limit else ''}] ({len(names)})"
