"""Run tests/support/diffusers_compat.py against several diffusers versions, each beside the project's environment.

Each older version's stack is locked in requirements/diffusers/<V>.lock (diffusers with the transformers,
huggingface-hub, tokenizers, ... of its era; `make lock` writes them). The pins that differ from
requirements/dev.lock are installed with --no-deps into .diffusers/V (a folder put first on PYTHONPATH; built in
a temporary folder and moved into place only when complete, rebuilt when its lock changes), so one version's
dependencies cannot reach another's. `--install-only` builds the folders (the only step that reads the package
index); checking never installs. Prints a table and exits 1 if any version failed, 2 on a usage error or a
failed install.

    python tests/support/diffusers_versions.py [0.36.0 0.40.0] [--install-only] [--out results.json]
    (make test-diffusers)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".diffusers"
LOCKS = ROOT / "requirements" / "diffusers"
_spec = importlib.util.spec_from_file_location("sagegen_lock", ROOT / "requirements" / "lock.py")
lock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lock)
# 0.35 is the first with an attention dispatcher (the backend needs 0.36's registry); the newest is dev.lock's.
DEFAULT_VERSIONS = lock.DIFFUSERS_VERSIONS
NEWEST = DEFAULT_VERSIONS[-1]


def _pip(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, **kwargs)


def lock_path(version: str) -> Path:
    """The lock of diffusers==version's stack (dev.lock for the newest)."""
    return lock.DEV_LOCK if version == NEWEST else LOCKS / f"{version}.lock"


def beside_pins(version: str) -> list[str]:
    """The pins diffusers==version's locked stack has that requirements/dev.lock does not (empty for dev.lock's
    own diffusers)."""
    if version == NEWEST:
        return []
    path = lock_path(version)
    if not path.exists():
        raise RuntimeError(f"no lock for diffusers {version} ({path.relative_to(ROOT)}); the locked versions are "
                           f"{', '.join(DEFAULT_VERSIONS)} (`make lock` writes them)")
    dev = lock.read_pins(lock.DEV_LOCK)
    return sorted(f"{name}=={v}" for name, v in lock.read_pins(path).items() if dev.get(name) != v)


def installed(version: str) -> Path | None:
    """.diffusers/<version> when it holds exactly what its lock asks for, else None."""
    target = CACHE / version
    done = target / ".complete"
    if done.exists() and done.read_text().split() == beside_pins(version):
        return target
    return None


def install(version: str) -> Path:
    """.diffusers/<version>, holding the locked pins diffusers==version needs beyond requirements/dev.lock."""
    if (target := installed(version)) is not None:
        return target
    target = CACHE / version
    pins = beside_pins(version)
    CACHE.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        staging = Path(tmp) / "site"
        staging.mkdir()
        r = _pip("install", "-q", "--no-deps", "--no-cache-dir", "--target", str(staging), *pins) if pins else None
        if r is not None and r.returncode:
            raise RuntimeError(f"pip could not install {' '.join(pins)}: {r.stderr.strip()[-600:]}")
        (staging / ".complete").write_text("\n".join(pins) + "\n")
        shutil.rmtree(target, ignore_errors=True)  # an earlier partial or outdated folder
        os.replace(staging, target)
    return target


def check(version: str) -> dict:
    """Run the compatibility check under diffusers==version (installed beforehand: checking never installs)."""
    site = installed(version)
    if site is None:
        raise RuntimeError(f"diffusers {version} is not installed beside .venv: `python "
                           f"tests/support/diffusers_versions.py --install-only {version}` (make test-diffusers)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1")}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        r = subprocess.run([sys.executable, str(ROOT / "tests" / "support" / "diffusers_compat.py"), "--out", str(out)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
        if not out.exists():
            return {"version": version, "error": (r.stderr or r.stdout).strip()[-1500:]}
        result = json.loads(out.read_text())
    ran = result["environment"]["diffusers"]
    if ran != version:
        return {"version": version, "error": f"ran diffusers {ran}, not {version}: is another copy first on "
                                             f"PYTHONPATH?"}
    return {"version": version, **result}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("versions", nargs="*", default=list(DEFAULT_VERSIONS), help="diffusers versions (X.Y.Z)")
    ap.add_argument("--out", help="write every version's rows here as JSON")
    ap.add_argument("--install-only", action="store_true", help="build the .diffusers/<V> folders, check nothing")
    args = ap.parse_args(argv)
    bad = [v for v in args.versions if not re.fullmatch(r"\d+\.\d+\.\d+", v)]
    if bad:
        print(f"error: versions must look like 0.41.0; got {bad}", file=sys.stderr)
        return 2
    unlocked = [v for v in args.versions if v not in DEFAULT_VERSIONS]
    if unlocked:
        print(f"error: no locked stack for diffusers {unlocked}; the locked versions are "
              f"{', '.join(DEFAULT_VERSIONS)} (add one to requirements/lock.py, then `make lock`)", file=sys.stderr)
        return 2
    if args.install_only:
        for version in args.versions:
            try:
                install(version)
            except RuntimeError as e:
                print(f"error: diffusers {version}: {e}", file=sys.stderr)
                return 2
            print(f"{version}: installed ({len(beside_pins(version))} pins beside .venv)", flush=True)
        return 0
    results, failed = [], False
    for version in args.versions:
        try:
            res = check(version)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"error: diffusers {version}: {e}", file=sys.stderr)
            return 2
        results.append(res)
        if "error" in res:
            failed = True
            print(f"{version}: ERROR {res['error']}", flush=True)
            continue
        s = res["summary"]
        failed |= bool(s["failed"])
        print(f"{version}: backend {s['backend']}, {s['ok']} ok, failed {s['failed'] or '-'}, "
              f"absent {[c.split(':')[1] for c in s['absent']] or '-'}, "
              f"not checked {[c.split(':')[1] for c in s['not_checked']] or '-'}", flush=True)
    if args.out:
        tmp = args.out + ".tmp"
        Path(tmp).write_text(json.dumps(results, indent=1))
        os.replace(tmp, args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
