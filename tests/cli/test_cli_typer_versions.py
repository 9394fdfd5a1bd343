"""The CLI under the oldest typer that pyproject.toml allows, and under typer 0.27 (which named an option
declared without flags after its metavar: `--DEVICE`). Each exact version is installed beside .venv when the
Makefile builds it (`python tests/cli/test_cli_typer_versions.py --install`: `pip install --no-deps --target
.beside/typer-<V>`; the tests never reach the index) and must build the same commands with the same flags as
the installed typer, and show `sagegen run --help`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BESIDE = ROOT / ".beside"
VERSIONS = ("0.27.2",)  # besides pyproject's minimum, read below

DUMP = """
import json, typer.main
from sagegen.cli.app import app
cmd = typer.main.get_command(app)
print(json.dumps({name: sorted(o for p in c.params for o in (*p.opts, *p.secondary_opts))
                  for name, c in cmd.commands.items()}))
"""


def _minimum() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    return re.search(r'"typer>=([0-9.]+)"', text).group(1)


def _flags(pythonpath: str | None) -> tuple[dict, str]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, str(ROOT), env.get("PYTHONPATH")) if p)
    dump = subprocess.run([sys.executable, "-c", DUMP], capture_output=True, text=True, env=env, cwd=ROOT)
    assert dump.returncode == 0, dump.stderr[-3000:]
    helptext = subprocess.run([sys.executable, "-m", "sagegen", "run", "--help"], capture_output=True, text=True,
                              env=dict(env, COLUMNS="200"), cwd=ROOT)
    assert helptext.returncode == 0, helptext.stderr[-3000:]
    return json.loads(dump.stdout), helptext.stdout


@pytest.fixture(scope="module")
def installed_flags():
    return _flags(None)[0]


def install(version: str) -> Path:
    """.beside/typer-<version>; built in a temporary folder, moved into place complete."""
    target = BESIDE / f"typer-{version}"
    if (target / "typer" / "__init__.py").exists():
        return target
    BESIDE.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=BESIDE) as tmp:
        staging = Path(tmp) / "site"
        # some releases (0.12-0.13) are an empty `typer` over `typer-slim`, which holds the code
        for package in ("typer", "typer-slim"):
            pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-cache-dir",
                                  "--disable-pip-version-check", "--target", str(staging), f"{package}=={version}"],
                                 capture_output=True, text=True, timeout=300)
            if pip.returncode != 0:
                raise SystemExit(f"error: {package}=={version} could not be installed: {pip.stderr.strip()[-300:]}")
            if (staging / "typer" / "__init__.py").exists():
                break
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    return target


@pytest.mark.parametrize("version", [_minimum(), *VERSIONS])
def test_cli_builds_the_same_flags_under_other_typer_versions(version, installed_flags):
    target = BESIDE / f"typer-{version}"
    if not (target / "typer" / "__init__.py").exists():
        pytest.skip(f"typer {version} is not installed beside .venv (`make venv` installs it)")
    flags, helptext = _flags(str(target))
    assert flags == installed_flags
    assert "--device" in helptext and "--DEVICE" not in helptext


if __name__ == "__main__":
    if sys.argv[1:] != ["--install"]:
        sys.exit("usage: python tests/cli/test_cli_typer_versions.py --install")
    for v in (_minimum(), *VERSIONS):
        print(f"typer {v}: {install(v).relative_to(ROOT)}")
