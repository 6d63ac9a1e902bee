"""The image, reviewed by tests since no Docker engine runs here: base, torch pin and index, non-editable install,
non-root user, entrypoint, and a build context that holds what the COPY lines need.

The install step itself is replayed: the context is filtered by deploy/Dockerfile.dockerignore, the COPY lines
are applied to a scratch /src, and a wheel is built from it, which must carry every module and data file.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tests.netns_harness import DEPLOY_DIR, REPO_ROOT, dockerfile_entrypoint

DOCKERFILE = DEPLOY_DIR / "Dockerfile"
DOCKERIGNORE = DEPLOY_DIR / "Dockerfile.dockerignore"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


@dataclass(frozen=True)
class Instruction:
    stage: int
    keyword: str
    args: str


def instructions() -> list[Instruction]:
    """Dockerfile instructions with continuation lines joined and comments dropped; stage 0 is before any FROM."""
    out: list[Instruction] = []
    stage, pending = 0, ""
    for line in DOCKERFILE.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        if keyword.upper() == "FROM":
            stage += 1
        out.append(Instruction(stage, keyword.upper(), " ".join(args.split())))
    return out


def pyproject() -> dict:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def dockerignore_patterns() -> list[str]:
    lines = (line.strip() for line in DOCKERIGNORE.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _matches(pattern: str, path: str) -> bool:
    if pattern.startswith("**/"):
        parts = path.split("/")
        return any(fnmatch.fnmatchcase("/".join(parts[i:]), pattern[3:]) for i in range(len(parts)))
    return fnmatch.fnmatchcase(path, pattern)


def ignored(path: str) -> bool:
    """Docker's rule: the last pattern matching the path (or a directory above it) decides; `!` re-includes."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for pattern in dockerignore_patterns():
        negate = pattern.startswith("!")
        body = pattern[1:] if negate else pattern
        if any(_matches(body, p) for p in prefixes):
            result = not negate
    return result


def build_copies() -> list[tuple[list[str], str]]:
    """(sources, destination) of every COPY from the context in the build stage."""
    copies = []
    for ins in instructions():
        if ins.stage == 1 and ins.keyword == "COPY" and not ins.args.startswith("--from"):
            *sources, dest = ins.args.split()
            copies.append((sources, dest))
    return copies


def test_slim_python_base_for_every_stage():
    ins = instructions()
    assert Instruction(0, "ARG", "PYTHON_IMAGE=python:3.11-slim") in ins
    stages = [i.args for i in ins if i.keyword == "FROM"]
    assert len(stages) == 2 and all(s.startswith("${PYTHON_IMAGE} AS ") for s in stages)


def test_cpu_torch_by_default_pinned_like_the_package_with_an_index_argument():
    pin = next(d for d in pyproject()["project"]["dependencies"] if d.replace(" ", "").startswith("torch=="))
    version = pin.split("==")[1]
    ins = instructions()
    assert Instruction(1, "ARG", f"TORCH_VERSION={version}") in ins
    assert Instruction(1, "ARG", f"TORCH_INDEX_URL={CPU_INDEX}") in ins
    runs = [i.args for i in ins if i.stage == 1 and i.keyword == "RUN"]
    torch_run = next(i for i, r in enumerate(runs) if '"torch==${TORCH_VERSION}"' in r)
    assert '--index-url "${TORCH_INDEX_URL}"' in runs[torch_run]
    package_run = next(i for i, r in enumerate(runs) if "pip install /src" in r)
    assert torch_run < package_run, "torch first, so the package's pin is already met by the chosen build"


def test_package_installed_non_editable_and_checked():
    run = next(i.args for i in instructions() if i.keyword == "RUN" and "pip install /src" in i.args)
    assert not re.search(r"(^|\s)(-e|--editable)(\s|$)", run)
    assert "league --help" in run
    copy_from = [i for i in instructions() if i.stage == 2 and i.keyword == "COPY"]
    assert [i.args for i in copy_from] == ["--from=build /opt/league /opt/league"]


def test_runs_as_a_fixed_non_root_user_with_league_as_entrypoint():
    runtime = [i for i in instructions() if i.stage == 2]
    users = [i.args for i in runtime if i.keyword == "USER"]
    assert users and re.fullmatch(r"(\d+):(\d+)", users[-1])
    assert int(users[-1].split(":")[0]) != 0
    keywords = [i.keyword for i in runtime]
    assert keywords.index("USER") < keywords.index("ENTRYPOINT")
    assert dockerfile_entrypoint() == ("tini", "--", "league")
    assert pyproject()["project"]["scripts"]["league"] == "league_cli.main:main"
    cmd = next(i.args for i in runtime if i.keyword == "CMD")
    assert json.loads(cmd) == ["--help"]


def test_context_filter_keeps_sources_and_drops_the_heavy_parts():
    for path in (".venv/bin/python", ".git/config", "runs/x/log", "tests/unit/test_cli.py",
                 "common/__pycache__/rpc.cpython-311.pyc", "league_training.egg-info/PKG-INFO"):  # fmt: skip
        assert ignored(path), path
    for path in ("pyproject.toml", "README.md", "common/rpc.py", "league_service/default_config.yaml"):
        assert not ignored(path), path


def test_copy_sources_exist_pass_the_filter_and_cover_every_package():
    copied = {src for sources, _ in build_copies() for src in sources}
    for src in copied:
        assert (REPO_ROOT / src).exists(), src
        assert not ignored(src), f"{src} is filtered out of the build context"
    includes = pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {pattern.rstrip("*") for pattern in includes} <= copied
    assert pyproject()["project"]["readme"] in copied


def _context_copy(dest: Path) -> None:
    """The build context as BuildKit sends it: the repository filtered by the .dockerignore."""
    for top in REPO_ROOT.iterdir():
        # Skip whole ignored top-level trees (.venv, .git) unless a pattern re-includes something inside.
        if ignored(top.name) and not any(p.startswith(f"!{top.name}/") for p in dockerignore_patterns()):
            continue
        for path in [top] if top.is_file() else sorted(top.rglob("*")):
            rel = path.relative_to(REPO_ROOT).as_posix()
            if path.is_file() and not ignored(rel):
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, dest / rel)


def test_install_step_builds_a_complete_wheel_from_the_filtered_context(tmp_path):
    context, src, wheels = tmp_path / "context", tmp_path / "src", tmp_path / "wheels"
    context.mkdir()
    src.mkdir()
    _context_copy(context)
    for sources, dest in build_copies():
        target = src / dest
        for source in sources:
            item = context / source
            if item.is_dir():
                shutil.copytree(item, target)
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(item, target / item.name)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "-q", "-w", str(wheels), str(src)],  # offline: no index, no version check
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (wheel,) = wheels.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in ("common", "league_service", "actor_service", "learner_service", "league_cli"):
        expected = {p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / package).rglob("*.py")
                    if "__pycache__" not in p.parts}  # fmt: skip
        assert expected <= names, sorted(expected - names)[:5]
    assert "league_service/default_config.yaml" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "league = league_cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
