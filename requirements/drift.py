"""What the newest resolution installed against what the lock pins (`make test-latest`).

Prints a table of every package whose version moved, appeared or went, and writes it as JSON beside the
environment (<venv>/drift.json), so that drift is read on purpose, not met by surprise in CI.

    python requirements/drift.py --lock requirements/dev.lock --python .venv-latest/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lock import normalise, read_pins  # noqa: E402

SELF = "sagegen"


def installed(python: str) -> dict[str, str]:
    r = subprocess.run([python, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True, check=True)
    return {normalise(p["name"]): p["version"] for p in json.loads(r.stdout) if normalise(p["name"]) != SELF}


def drift(locked: dict[str, str], latest: dict[str, str]) -> list[dict]:
    rows = []
    for name in sorted(set(locked) | set(latest)):
        was, now = locked.get(name), latest.get(name)
        if was != now:
            rows.append({"package": name, "lock": was, "latest": now,
                         "change": "new" if was is None else "gone" if now is None else "moved"})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lock", required=True, type=Path)
    ap.add_argument("--python", required=True, help="the newest environment's interpreter")
    args = ap.parse_args(argv)
    rows = drift(read_pins(args.lock), installed(args.python))
    width = max([len(r["package"]) for r in rows] + [7])
    print(f"drift against {args.lock}: {len(rows)} package(s) differ")
    for r in rows:
        print(f"  {r['package']:<{width}}  {r['lock'] or '-':>14} -> {r['latest'] or '-':<14} {r['change']}")
    venv = Path(args.python).resolve().parents[1]
    out = venv / "drift.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"lock": str(args.lock), "rows": rows}, indent=1))
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
