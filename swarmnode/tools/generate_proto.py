"""Regenerate (or check) the committed protobuf code from ``swarm.proto``.

Owns: the one command that turns the .proto into ``swarm_pb2.py`` / ``swarm_pb2.pyi``.
Must not: be imported by the node at run time (it needs ``grpcio-tools``, a dev
dependency).

The canonical definition is ``protocol/swarm.proto``; ``swarmnode/wire/swarm.proto``
is a byte-identical copy shipped as package data. Generation runs ``protoc`` on
the copy under the include root that makes its descriptor name
``swarmnode/wire/swarm.proto`` (a name no other package registers in the
process-wide descriptor pool).

    python -m swarmnode.tools.generate_proto            # copy protocol/swarm.proto, regenerate
    python -m swarmnode.tools.generate_proto --check    # exit 1 if anything committed differs
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

WIRE_DIR = Path(__file__).resolve().parents[1] / "wire"
REPO_ROOT = WIRE_DIR.parent.parent
CANONICAL_PROTO = REPO_ROOT / "protocol" / "swarm.proto"
PACKAGE_PROTO = WIRE_DIR / "swarm.proto"
GENERATED = ("swarm_pb2.py", "swarm_pb2.pyi")


def generate_into(proto: Path, out_dir: Path) -> dict[str, bytes]:
    """Run protoc on ``proto`` in a scratch tree under ``out_dir``; return {file name: bytes}."""
    include = out_dir / "include"
    target = include / "swarmnode" / "wire"
    target.mkdir(parents=True)
    shutil.copyfile(proto, target / "swarm.proto")
    generated = out_dir / "generated"
    generated.mkdir()
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{include}",
        f"--python_out={generated}",
        f"--pyi_out={generated}",
        "swarmnode/wire/swarm.proto",
    ]
    result = subprocess.run(command, cwd=include, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"protoc failed ({result.returncode}): {result.stderr.strip()}")
    return {name: (generated / "swarmnode" / "wire" / name).read_bytes() for name in GENERATED}


def differences() -> list[str]:
    """What is out of date: the package copy of the .proto, or a generated file."""
    problems = []
    if CANONICAL_PROTO.exists() and CANONICAL_PROTO.read_bytes() != PACKAGE_PROTO.read_bytes():
        problems.append(f"{PACKAGE_PROTO} differs from {CANONICAL_PROTO}")
    with tempfile.TemporaryDirectory(prefix="swarmnode-protoc-") as tmp:
        fresh = generate_into(PACKAGE_PROTO, Path(tmp))
    for name, content in fresh.items():
        committed = WIRE_DIR / name
        if not committed.exists() or committed.read_bytes() != content:
            problems.append(f"{committed} does not match protoc output for {PACKAGE_PROTO}")
    return problems


def regenerate() -> None:
    if CANONICAL_PROTO.exists():
        shutil.copyfile(CANONICAL_PROTO, PACKAGE_PROTO)
    with tempfile.TemporaryDirectory(prefix="swarmnode-protoc-") as tmp:
        fresh = generate_into(PACKAGE_PROTO, Path(tmp))
    for name, content in fresh.items():
        (WIRE_DIR / name).write_bytes(content)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m swarmnode.tools.generate_proto", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--check", action="store_true", help="only report differences; exit 1 if any")
    args = parser.parse_args(argv)
    if args.check:
        problems = differences()
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    regenerate()
    print(f"regenerated {', '.join(GENERATED)} in {WIRE_DIR}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
