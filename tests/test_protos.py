"""The committed gRPC stubs must match protos/: regenerate with `make protos`."""

from __future__ import annotations

from fedleak.harness.wire.protogen import stale_files


def test_generated_stubs_match_the_proto_files() -> None:
    assert stale_files() == [], "stubs are stale: run `make protos` and commit the result"
