"""Read a run directory (the layout ``sagegen compare`` writes) for evaluation and reporting.

Layout: ``manifest.json``; ``samples/<variant>/<sample_id>/frames/00000.png ...`` (lossless RGB);
``samples/<variant>/<sample_id>/sample.json`` is written last, so its presence marks a finished sample.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BASELINE = "sdpa"
RUNS_ENV = "SAGEGEN_RUNS"
DEFAULT_ROOT = "runs"


class RunDirError(ValueError):
    """The run directory is missing, unfinished, or not in the expected layout."""


@dataclass
class Sample:
    id: str
    prompt: str
    seed: int | None
    dirs: dict[str, Path] = field(default_factory=dict)  # variant -> samples/<variant>/<id>

    def frame_paths(self, variant: str) -> list[Path]:
        return sorted((self.dirs[variant] / "frames").glob("*.png"))


@dataclass
class Run:
    path: Path
    manifest: dict[str, Any]
    baseline: str
    candidates: list[str]
    samples: list[Sample]

    @property
    def kind(self) -> str:
        return str((self.manifest.get("model") or {}).get("kind", "video"))

    @property
    def fps(self) -> float:
        fps = (self.manifest.get("model") or {}).get("fps") or 8
        return float(fps)

    @property
    def variants(self) -> list[str]:
        return [self.baseline, *self.candidates]


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n")


def runs_root() -> Path:
    return Path(os.environ.get(RUNS_ENV) or DEFAULT_ROOT)


def _latest_run_fallback(root: Path) -> Path | None:
    if not root.is_dir():
        return None
    cands = [p for p in root.iterdir() if p.is_dir() and (p / "manifest.json").is_file()]
    if not cands:
        return None

    def key(p: Path) -> tuple[str, float]:
        try:
            created = json.loads((p / "manifest.json").read_text()).get("created", "")
        except (OSError, ValueError):
            created = ""
        return (str(created), p.stat().st_mtime)

    return max(cands, key=key)


def resolve_run_dir(run_dir: str | os.PathLike | None) -> Path:
    """``run_dir`` if given, else the most recent run under ``$SAGEGEN_RUNS`` (default ``runs/``)."""
    if run_dir is not None:
        p = Path(run_dir)
        if not (p / "manifest.json").is_file():
            raise RunDirError(f"RUN_DIR {p} has no manifest.json (not a sagegen run directory)")
        return p
    root = runs_root()
    found: Path | None = None
    try:  # the CLI engineer's helper, when present
        from sagegen.rundir import latest_run  # type: ignore

        found = latest_run(root)
    except ImportError:
        found = _latest_run_fallback(root)
    if found is None:
        raise RunDirError(
            f"no run directory found under {root} (set ${RUNS_ENV} or pass RUN_DIR; "
            "create one with `sagegen compare`)"
        )
    return Path(found)


def load_run(run_dir: str | os.PathLike, require_finished: bool = True) -> Run:
    path = Path(run_dir)
    try:
        manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise RunDirError(f"{path}: manifest.json not found") from e
    except ValueError as e:
        raise RunDirError(f"{path}/manifest.json is not valid JSON: {e}") from e
    variants = list(manifest.get("variants") or [])
    if len(variants) < 2:
        raise RunDirError(f"{path}: manifest lists variants {variants}; need a baseline and a candidate")
    baseline = manifest.get("baseline") or (BASELINE if BASELINE in variants else variants[0])
    candidates = [v for v in variants if v != baseline]
    samples: list[Sample] = []
    for entry in manifest.get("samples") or []:
        sid = str(entry["id"])
        s = Sample(id=sid, prompt=str(entry.get("prompt", "")), seed=entry.get("seed"))
        for v in variants:
            d = path / "samples" / v / sid
            if (d / "sample.json").is_file() and any((d / "frames").glob("*.png")):
                s.dirs[v] = d
        if all(v in s.dirs for v in variants):
            samples.append(s)
        elif require_finished:
            missing = [v for v in variants if v not in s.dirs]
            raise RunDirError(f"{path}: sample {sid} is unfinished for variant(s) {missing} (no sample.json)")
    if not samples:
        raise RunDirError(f"{path}: no finished samples")
    return Run(path=path, manifest=manifest, baseline=baseline, candidates=candidates, samples=samples)


def load_frame(path: Path) -> np.ndarray:
    """One frame as HxWx3 uint8 RGB."""
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.uint8).copy()


def load_frames(paths: list[Path]) -> np.ndarray:
    """Frames as TxHxWx3 uint8."""
    return np.stack([load_frame(p) for p in paths])
