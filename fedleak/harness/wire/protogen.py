"""Regenerate the committed gRPC stubs from ``protos/`` (``make protos`` or
``python -m fedleak.harness.wire.protogen``); ``--check`` exits non-zero when they are stale.

Stubs are generated with grpcio-tools (pinned together with grpcio in constraints.txt) into
``fedleak/v1/``, the package the proto files declare.
"""

from __future__ import annotations

import filecmp
import sys
import tempfile
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[3]
PROTO_ROOT = ROOT / "protos"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files() -> list[Path]:
    """Every ``.proto`` file under ``protos/``."""
    return sorted(PROTO_ROOT.rglob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) over every proto file into ``out_dir``."""
    from grpc_tools import protoc  # dev dependency: only needed to regenerate

    files = proto_files()
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *map(str, files),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {', '.join(map(str, files))}")
    return sorted(
        p for p in (out_dir / "fedleak").rglob("*") if p.name.endswith(GENERATED_SUFFIXES)
    )


def stale_files() -> list[str]:
    """Generated files that differ from (or are missing in) the committed tree."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = []
        for path in fresh:
            rel = path.relative_to(tmp)
            committed = ROOT / "fedleak" / rel.relative_to("fedleak")
            if not committed.exists() or not filecmp.cmp(path, committed, shallow=False):
                stale.append(str(rel))
        return stale


@click.command()
@click.option("--check", is_flag=True, help="Only report stale stubs; exit 1 if any.")
def main(check: bool) -> None:
    """Regenerate the gRPC stubs in fedleak/v1 from protos/."""
    if check:
        stale = stale_files()
        if stale:
            click.echo(f"stale stubs: {', '.join(stale)}; run `make protos`", err=True)
            sys.exit(1)
        click.echo("stubs match protos/")
        return
    written = generate(ROOT)
    for path in written:
        click.echo(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
