"""The committed gRPC stubs must match protos/: regenerate with `make protos`."""

from __future__ import annotations

from fedleak.harness.wire.protogen import stale_files


def test_generated_stubs_match_the_proto_files() -> None:
    assert stale_files() == [], "stubs are stale: run `make protos` and commit the result"


def test_a_stale_stub_is_reported(tmp_path, monkeypatch) -> None:
    """The check compares bytes: a committed stub that differs from fresh protoc output fails."""
    import shutil

    from fedleak.harness.wire import protogen

    shutil.copytree(protogen.ROOT / "fedleak" / "v1", tmp_path / "fedleak" / "v1")
    stub = tmp_path / "fedleak" / "v1" / "victim_pb2_grpc.py"
    text = stub.read_text()
    stub.write_text(text.replace("GRPC_GENERATED_VERSION = ", "GRPC_GENERATED_VERSION =  "))
    monkeypatch.setattr(protogen, "ROOT", tmp_path)
    assert protogen.stale_files() == ["fedleak/v1/victim_pb2_grpc.py"]
