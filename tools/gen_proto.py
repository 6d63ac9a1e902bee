"""Regenerate the Python code and typed stubs for protos/ into common/proto/.

The `-I common/proto=protos` mapping makes protoc believe the .proto files live inside the
`common.proto` package, so the generated modules import each other as `common.proto.league.v1...`
and the whole thing is imported as an ordinary package.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import grpc_tools
from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"
PACKAGE_PREFIX = "common/proto"


def proto_files() -> list[pathlib.Path]:
    return sorted(PROTO_DIR.rglob("*.proto"))


def generate(out_dir: pathlib.Path) -> None:
    """Write `<out_dir>/common/proto/...` modules for every .proto file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PACKAGE_PREFIX}={PROTO_DIR}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p) for p in proto_files()],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    # Every directory of the generated tree is a regular package.
    for d in (out_dir / PACKAGE_PREFIX).rglob("*"):
        if d.is_dir():
            (d / "__init__.py").touch()
    (out_dir / PACKAGE_PREFIX / "__init__.py").touch()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=pathlib.Path, default=ROOT, help="root to write common/proto/ under")
    args = parser.parse_args()
    generate(args.out)
    print(f"generated {len(proto_files())} proto file(s) into {args.out / PACKAGE_PREFIX}", file=sys.stderr)


if __name__ == "__main__":
    main()
