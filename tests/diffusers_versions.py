"""Run tests/diffusers_compat.py against several diffusers versions, each beside the project's environment.

For each version, pip works out what installing ``diffusers==V`` into the current environment would change
(``pip install --dry-run --report``: diffusers itself, and e.g. an older huggingface_hub), installs just that
into ``.diffusers/V`` (a folder put first on PYTHONPATH; built in a temporary folder and moved into place only
when complete), and runs the compatibility check there. Prints a table and exits 1 if any version failed,
2 on a usage error or a failed install.

    python tests/diffusers_versions.py 0.36.0 0.40.0 [--out results.json]     (make test-diffusers)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".diffusers"
# The versions `make test-diffusers` checks: 0.35 is the first with an attention dispatcher (the backend needs
# 0.36's registry); 0.42.1 is what the rest of the suite runs.
DEFAULT_VERSIONS = ("0.35.2", "0.36.0", "0.37.1", "0.38.0", "0.39.0", "0.40.0", "0.41.0", "0.42.1")


def _pip(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, **kwargs)


def install(version: str) -> Path:
    """.diffusers/<version>, holding what diffusers==version needs beyond the current environment."""
    target = CACHE / version
    if (target / ".complete").exists():
        return target
    CACHE.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        report = Path(tmp) / "report.json"
        r = _pip("install", "-q", "--dry-run", "--report", str(report), f"diffusers=={version}")
        if r.returncode:
            raise RuntimeError(f"pip could not resolve diffusers=={version}: {r.stderr.strip()[-600:]}")
        planned = json.loads(report.read_text())["install"]
        pins = [f"{i['metadata']['name']}=={i['metadata']['version']}" for i in planned]
        staging = Path(tmp) / "site"
        staging.mkdir()
        r = _pip("install", "-q", "--no-deps", "--no-cache-dir", "--target", str(staging), *pins) if pins else None
        if r is not None and r.returncode:
            raise RuntimeError(f"pip could not install {' '.join(pins)}: {r.stderr.strip()[-600:]}")
        (staging / ".complete").write_text("\n".join(pins) + "\n")
        shutil.rmtree(target, ignore_errors=True)  # an earlier partial folder (no .complete)
        os.replace(staging, target)
    return target


def check(version: str) -> dict:
    site = install(version)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1")}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        r = subprocess.run([sys.executable, str(ROOT / "tests" / "diffusers_compat.py"), "--out", str(out)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
        if not out.exists():
            return {"version": version, "error": (r.stderr or r.stdout).strip()[-1500:]}
        result = json.loads(out.read_text())
    installed = result["environment"]["diffusers"]
    if installed != version:
        return {"version": version, "error": f"ran diffusers {installed}, not {version}: is another copy first on "
                                             f"PYTHONPATH?"}
    return {"version": version, **result}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("versions", nargs="*", default=list(DEFAULT_VERSIONS), help="diffusers versions (X.Y.Z)")
    ap.add_argument("--out", help="write every version's rows here as JSON")
    args = ap.parse_args(argv)
    bad = [v for v in args.versions if not re.fullmatch(r"\d+\.\d+\.\d+", v)]
    if bad:
        print(f"error: versions must look like 0.41.0; got {bad}", file=sys.stderr)
        return 2
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
