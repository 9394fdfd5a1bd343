"""Writing ``RUN/metrics.json``: merged with what earlier ``sagegen eval`` calls wrote, atomically.

Each metric's entry carries the settings it was computed with (``evaluated``, ``samples``, ``interval``, ...),
because one file collects metrics from several calls; the top-level fields describe only the run directory
as of the latest call. The schema is documented in docs/run-directory.md.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from typing import Any, Callable, Iterable

from sagegen.eval import METRICS
from sagegen.runs.reader import Run, atomic_write_json

SCHEMA = 1
RETIRED_TOP_LEVEL = ("bootstrap",)  # was top-level, now per metric: a stale copy would describe the wrong call


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds")


def _read(path) -> dict:
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) and doc.get("schema") == SCHEMA else {}


def write_metrics(run: Run, results: dict[str, dict], keep_if_ok: Iterable[str] = (),
                  log: Callable[[str], None] = print, call: dict | None = None) -> dict:
    """Merge ``results`` (metric -> entry) into the run's metrics.json and return the document.

    A metric named in ``keep_if_ok`` (skipped because its weights are missing now) does not replace an
    ``ok`` entry from an earlier call: losing a computed score to a missing file would be data loss."""
    path = run.path / "metrics.json"
    doc = _read(path)
    for key in RETIRED_TOP_LEVEL:
        doc.pop(key, None)
    doc.update({
        "schema": SCHEMA,
        "updated": now_iso(),
        "run_dir": str(run.path.resolve()),
        "kind": run.kind,
        "baseline": run.baseline,
        "candidates": run.candidates,
        "samples": [{"id": s.id, "prompt": s.prompt, "seed": s.seed, "frames": len(s.frame_paths(run.baseline))}
                    for s in run.samples],
    })
    if call is not None:  # what the latest call asked for and what it computed (its exit code follows this)
        doc["last_eval"] = call
    metrics = doc.setdefault("metrics", {})
    keep = set(keep_if_ok)
    for m, entry in results.items():
        old = metrics.get(m)
        if m in keep and isinstance(old, dict) and old.get("status") == "ok":
            when = old.get("evaluated") or "an earlier eval"
            log(f"{m}: kept the earlier result (evaluated {when}); not recomputed now: {entry.get('reason', '')}")
            continue
        metrics[m] = finite(entry)
    doc["metrics"] = {m: metrics[m] for m in METRICS if m in metrics}
    atomic_write_json(path, doc)
    return doc


def write_against(run: Run, name: str, entry: dict) -> dict:
    """Put ``entry`` (`sagegen.eval.against`) under ``against[name]`` of the run's metrics.json, keeping the
    rest of the file as it was."""
    path = run.path / "metrics.json"
    doc = _read(path)
    doc.setdefault("schema", SCHEMA)
    doc["updated"] = now_iso()
    doc.setdefault("run_dir", str(run.path.resolve()))
    doc.setdefault("against", {})[name] = finite(entry)
    atomic_write_json(path, doc)
    return doc


def finite(x: Any) -> Any:
    """NaN/inf -> None (JSON has no NaN); readers show None as "—"."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x
