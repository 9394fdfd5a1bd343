"""Regenerate the locked development environment and the diffusers-version stacks (`make lock`).

Writes, with uv's resolver (the version pinned in the Makefile):

- ``requirements/dev.lock``: every package `.[eval,test,lora,cachedit]` and requirements/tools.in need, pinned,
  for the machines development and CI run on (Linux x86_64, CPython 3.11). `make` installs from it; the package's own
  ranges in pyproject.toml stay open for users.
- ``requirements/diffusers/<V>.lock`` for each older diffusers the matrix checks: diffusers==V with the
  Hugging Face stack of its era (transformers, huggingface-hub, tokenizers, ...: the newest each had before the
  next diffusers release), everything else held at dev.lock's pins. tests/support/diffusers_versions.py installs the
  pins that differ from dev.lock into .diffusers/<V>, beside .venv.

Resolution reads the package index as pip on this machine would (its extra index URLs and constraint file,
from `pip config`). Network: yes, this is the one step that reads today's registry on purpose.

    python requirements/lock.py [--uv PATH] [--only dev|diffusers]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEV_LOCK = HERE / "dev.lock"
DIFFUSERS_DIR = HERE / "diffusers"
TARGET = ["--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28"]
# The matrix (tests/support/diffusers_versions.py): the newest is the one dev.lock pins; the others get era stacks.
DIFFUSERS_VERSIONS = ("0.35.2", "0.36.0", "0.37.1", "0.38.0", "0.39.0", "0.40.0", "0.41.0", "0.42.1")
# Released together with diffusers and pinned against each other (transformers 5.25 refuses hub 1.x, diffusers
# < 0.42 refuses hub 2.x): an older diffusers takes these from its era. Everything else stays at dev.lock's pin.
ERA_PACKAGES = ("diffusers", "transformers", "huggingface-hub", "tokenizers", "safetensors", "accelerate",
                "hf-xet", "kernels")


def pip_config(key: str) -> list[str]:
    """The whitespace-separated values of `key` (e.g. "global.constraint") in pip's merged configuration, with the
    PIP_* environment variables (`pip config get` misses keys set in some files: `pip config list` has them all)."""
    r = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    values = []
    for line in r.stdout.splitlines():
        name, _, value = line.partition("=")
        if name.strip() in (key, f":env:.{key.split('.', 1)[1]}"):
            values += [v for v in value.strip().strip("'\"").split() if v not in values]
    return values


def index_args() -> list[str]:
    """pip's view of the index on this machine, for uv: extra indexes, find-links and the constraint file."""
    args = ["--index-strategy", "unsafe-best-match"]  # pip's rule: the best version over all indexes
    for url in pip_config("global.extra-index-url"):
        args += ["--extra-index-url", url]
    for link in pip_config("global.find-links"):
        if os.path.exists(link):
            args += ["--find-links", link]
    for path in pip_config("global.constraint"):
        if os.path.exists(path):
            args += ["-c", path]
    return args


def compile_lock(uv: str, out: Path, inputs: list[str], extra: list[str], command: str) -> None:
    """uv pip compile into out, atomically (a failed resolution leaves the old lock)."""
    tmp = out.with_suffix(".tmp")
    cmd = [uv, "pip", "compile", "--quiet", "--no-progress", *inputs, *TARGET, *index_args(), *extra,
           "--custom-compile-command", command, "-o", str(tmp)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode:
        tmp.unlink(missing_ok=True)
        raise SystemExit(f"error: resolving {out.relative_to(ROOT)} failed:\n{shlex.join(cmd)}\n{r.stderr[-3000:]}")
    os.replace(tmp, out)
    print(f"wrote {out.relative_to(ROOT)} ({len(read_pins(out))} pins)", flush=True)


def read_pins(lock: Path) -> dict[str, str]:
    """name -> version of every `name==version` line (names normalised as PEP 503)."""
    pins = {}
    for line in lock.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line and not line.startswith("-"):
            name, version = line.split("==", 1)
            pins[normalise(name)] = version.split(";")[0].strip()
    return pins


def normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


def release_dates(package: str) -> dict[str, str]:
    """version -> first upload time (ISO 8601, UTC) from PyPI's JSON API."""
    with urllib.request.urlopen(f"https://pypi.org/pypi/{package}/json", timeout=60) as r:
        releases = json.load(r)["releases"]
    return {v: files[0]["upload_time_iso_8601"] for v, files in releases.items() if files}


def lock_dev(uv: str) -> None:
    compile_lock(uv, DEV_LOCK, ["pyproject.toml", "--extra", "eval", "--extra", "test", "--extra", "lora",
                                "--extra", "cachedit", "requirements/tools.in"], [], "make lock")


def lock_diffusers(uv: str) -> None:
    dev = read_pins(DEV_LOCK)
    newest = dev.get("diffusers")
    if newest != DIFFUSERS_VERSIONS[-1]:
        raise SystemExit(f"error: dev.lock pins diffusers {newest}, the matrix ends at {DIFFUSERS_VERSIONS[-1]}: "
                         f"update DIFFUSERS_VERSIONS in requirements/lock.py (and tests/test_diffusers_versions.py)")
    dates = release_dates("diffusers")
    DIFFUSERS_DIR.mkdir(exist_ok=True)
    held = DIFFUSERS_DIR / "held-from-dev.txt"
    held.write_text("# dev.lock's pins but for the era packages (written by requirements/lock.py)\n" + "".join(
        f"{name}=={version}\n" for name, version in sorted(dev.items()) if name not in ERA_PACKAGES))
    for version, following in zip(DIFFUSERS_VERSIONS, DIFFUSERS_VERSIONS[1:]):
        era_end = dates[following]  # the stack a user had just before the next diffusers came out
        extra = ["-c", str(held.relative_to(ROOT))]
        for package in ERA_PACKAGES:
            extra += ["--exclude-newer-package", f"{package}={era_end}"]
        spec = DIFFUSERS_DIR / f"{version}.in"
        spec.write_text(f"diffusers=={version}\n")
        compile_lock(uv, DIFFUSERS_DIR / f"{version}.lock", ["pyproject.toml", str(spec.relative_to(ROOT))], extra,
                     "make lock")
        spec.unlink()
    held.unlink()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uv", default="uv", help="the uv executable (the Makefile passes the pinned one)")
    ap.add_argument("--only", choices=("dev", "diffusers"), help="regenerate one part only")
    args = ap.parse_args(argv)
    if args.only in (None, "dev"):
        lock_dev(args.uv)
    if args.only in (None, "diffusers"):
        lock_diffusers(args.uv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
