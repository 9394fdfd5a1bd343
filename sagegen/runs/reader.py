"""Read a run directory (the layout ``sagegen compare`` writes) for evaluation and reporting.

Layout: ``manifest.json``; ``samples/<variant>/<sample_id>/frames/00000.png ...`` (lossless RGB);
``samples/<variant>/<sample_id>/sample.json`` is written last, so its presence marks a finished sample.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sagegen.runs import integrity as runcheck
from sagegen.runs import directory as _rundir
from sagegen.runs.manifest import expected_fingerprints
from sagegen.runs.directory import atomic_write_bytes, atomic_write_json, atomic_write_text  # noqa: F401 (re-export)

BASELINE = "sdpa"


class RunDirError(ValueError):
    """The run directory is missing, unfinished, or not in the expected layout."""


@dataclass
class Sample:
    id: str
    prompt: str
    seed: int | None
    dirs: dict[str, Path] = field(default_factory=dict)  # variant -> samples/<variant>/<id>

    def frame_paths(self, variant: str) -> list[Path]:
        return runcheck.frame_files(self.dirs[variant] / "frames")


@dataclass
class Run:
    path: Path
    manifest: dict[str, Any]
    baseline: str
    candidates: list[str]
    samples: list[Sample]
    # {(variant, sample id): why}: samples with a sample.json that are not this run's or not whole (left out)
    left_out: dict[tuple[str, str], str] = field(default_factory=dict)

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


def runs_root() -> Path:
    return _rundir.runs_root()


def resolve_run_dir(run_dir: str | os.PathLike | None) -> Path:
    """``run_dir`` if given, else the most recent run under ``$SAGEGEN_RUNS`` (default ``runs/``)."""
    if run_dir is not None:
        p = Path(run_dir)
        if not (p / "manifest.json").is_file():
            raise RunDirError(f"RUN_DIR {p} has no manifest.json (not a sagegen run directory)")
        return p
    try:
        return Path(_rundir.latest_run())
    except FileNotFoundError as e:
        raise RunDirError(str(e)) from e


def load_run(run_dir: str | os.PathLike, log=None) -> Run:
    """The run's manifest and the samples finished in every variant (unfinished ones are left out, with a
    note to ``log``)."""
    path = Path(run_dir)
    rd = _rundir.RunDir(path)
    try:
        manifest = rd.manifest
    except FileNotFoundError as e:
        raise RunDirError(f"{path}: manifest.json not found (not a sagegen run directory)") from e
    except ValueError as e:  # DamagedFile: not JSON, or JSON but not an object
        raise RunDirError(str(e)) from e
    variants = list(manifest.get("variants") or [])
    if len(variants) < 2:
        raise RunDirError(
            f"{path}: the run has variants {variants}; eval/report compare a baseline with a candidate "
            "(make the run with `sagegen compare`)"
        )
    baseline = manifest.get("baseline") or (BASELINE if BASELINE in variants else variants[0])
    candidates = [v for v in variants if v != baseline]
    # identity (the fingerprint the manifest implies), integrity (every frame whole, and byte for byte what was
    # written) and containment (nothing outside the run), for every planned sample: sagegen.runs.integrity
    expected = expected_fingerprints(manifest)
    samples: list[Sample] = []
    unfinished = []
    left_out: dict[tuple[str, str], str] = {}
    for entry in manifest.get("samples") or []:
        sid = str(entry["id"])
        whole = True
        for v in variants:
            sample_dir = rd.sample_dir(v, sid)
            if not os.path.lexists(sample_dir / "sample.json") and runcheck.inside(rd.path, sample_dir):
                whole = False  # not generated yet
                continue
            why = rd.problem(v, sid, expected=expected.get((v, sid)), deep=True)
            if why:
                left_out[(v, sid)] = why
                whole = False
        if whole:
            s = Sample(id=sid, prompt=str(entry.get("prompt", "")), seed=entry.get("seed"))
            s.dirs = {v: rd.sample_dir(v, sid) for v in variants}
            samples.append(s)
        elif not any((v, sid) in left_out for v in variants):
            unfinished.append(sid)
    if left_out and log:
        shown = "; ".join(f"{v}/{sid}: {why}" for (v, sid), why in list(left_out.items())[:5])
        log(f"note: {len(left_out)} sample(s) left out as not whole or not this run's ({shown}"
            + (" ..." if len(left_out) > 5 else "") + "); running the same `sagegen run`/`compare` command again "
            "redoes damaged ones")
    if unfinished and log:
        log(f"note: {len(unfinished)} sample(s) not finished in every variant are left out: {', '.join(unfinished[:5])}"
            + (" ..." if len(unfinished) > 5 else ""))
    if not samples:
        raise RunDirError(f"{path}: no sample is finished in every variant ({', '.join(variants)})")
    return Run(path=path, manifest=manifest, baseline=baseline, candidates=candidates, samples=samples,
               left_out=left_out)


def load_frame(path: Path) -> np.ndarray:
    """One frame as HxWx3 uint8 RGB."""
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.uint8).copy()


def load_frames(paths: list[Path]) -> np.ndarray:
    """Frames as TxHxWx3 uint8."""
    return np.stack([load_frame(p) for p in paths])
