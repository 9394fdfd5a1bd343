"""Run directories: the contract between `sagegen run`/`compare` (generation), `eval` and `report`.

Layout (documented in docs/run-directory.md)::

    RUN_DIR/
      manifest.json                                   # what was run, how, and the per-sample timings
      samples/<variant>/<sample_id>/frames/00000.png  # lossless RGB frames (image models: one frame)
      samples/<variant>/<sample_id>/video.mp4         # video models, for viewing only (lossy)
      samples/<variant>/<sample_id>/image.png         # image models, for viewing
      samples/<variant>/<sample_id>/sample.json       # written last, atomically: its presence = finished
      metrics.json                                    # written by `sagegen eval`
      report/                                         # written by `sagegen report`

Every file is written atomically (a temporary file in the same folder, then `os.replace`), so a reader
never sees half a file and an interrupted run loses nothing that had finished. The manifest's
``timings`` are rebuilt from the ``sample.json`` files under a file lock (`update_manifest`), so several
processes (torchrun / accelerate) can write into one run directory and the last update leaves it whole.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import shutil
from pathlib import Path
from typing import Callable, Iterator

from sagegen.runs import integrity as runcheck
from sagegen.runs.files import (DamagedFile, WriteError, atomic_write_bytes, atomic_write_file, atomic_write_json,  # noqa: F401 (re-exported: the run directory's file helpers)
                                atomic_write_text, is_intact, read_json, read_record, write_error)

SCHEMA = 1
MANIFEST = "manifest.json"
METRICS = "metrics.json"
SAMPLE_JSON = "sample.json"
REPORT_DIR = "report"
SAMPLES_DIR = "samples"
FRAMES_DIR = "frames"
VIDEO_FILE = "video.mp4"
IMAGE_FILE = "image.png"
RUNS_ENV = "SAGEGEN_RUNS"
DEFAULT_RUNS_ROOT = "runs"


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds")


@contextlib.contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """An exclusive advisory lock (fcntl) on `path`, for read-modify-write of shared files."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a+")
    except OSError as e:  # a read-only or full disk: name the file and what to do
        raise write_error(path, e) from e
    with f:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - non-POSIX: no locking, writes are still atomic
            yield
            return
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


# ------------------------------------------------------------------------------------------- run dirs
class RunDir:
    """Read (and, for the generator, write) one run directory.

    Reading, for evaluation and reports::

        rd = RunDir(latest_run())
        rd.manifest["model"]["kind"]            # "video" | "image"
        for s in rd.samples("sage"):            # finished samples, as their sample.json records
            frames = rd.frames("sage", s["id"])  # [Path, ...] lossless PNG frames, in order
        rd.paired_ids("sdpa", "sage")           # sample ids finished in both variants
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # paths
    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS

    @property
    def report_dir(self) -> Path:
        return self.path / REPORT_DIR

    def variant_dir(self, variant: str) -> Path:
        return self.path / SAMPLES_DIR / variant

    def sample_dir(self, variant: str, sample_id: str) -> Path:
        return self.variant_dir(variant) / sample_id

    def frames_dir(self, variant: str, sample_id: str) -> Path:
        return self.sample_dir(variant, sample_id) / FRAMES_DIR

    def video_path(self, variant: str, sample_id: str) -> Path:
        return self.sample_dir(variant, sample_id) / VIDEO_FILE

    def image_path(self, variant: str, sample_id: str) -> Path:
        return self.sample_dir(variant, sample_id) / IMAGE_FILE

    def sample_json_path(self, variant: str, sample_id: str) -> Path:
        return self.sample_dir(variant, sample_id) / SAMPLE_JSON

    # reading
    def exists(self) -> bool:
        return self.manifest_path.is_file()

    @property
    def manifest(self) -> dict:
        """The parsed manifest.json (read fresh on every access); DamagedFile when it is not a JSON object."""
        if not self.manifest_path.is_file():
            raise FileNotFoundError(f"{self.path} is not a sagegen run directory (no {MANIFEST})")
        try:
            return read_record(self.manifest_path)
        except DamagedFile as e:
            # no option named: eval and report read this too, and have no --out
            raise DamagedFile(f"{e}; restore it from a copy, or start the run over in a new folder") from None

    @property
    def variants(self) -> list[str]:
        """The variants the manifest names (e.g. ["sdpa", "sage"])."""
        return list(self.manifest.get("variants", []))

    def problem(self, variant: str, sample_id: str, *, expected: str | None = None, strict: bool = False,
                deep: bool = False) -> str | None:
        """Why this sample is not a trustworthy finished sample (None when it is): `sagegen.runs.integrity`."""
        return runcheck.sample_problem(self.path, self.sample_dir(variant, sample_id), expected=expected,
                                       strict=strict, deep=deep)

    def finished(self, variant: str, sample_id: str) -> bool:
        """True when the sample's sample.json (written last) is intact and names this sample, and its frames
        are all there and whole, inside the run directory (`runcheck`). Anything less means unfinished,
        everywhere: generation redoes the sample, eval and report leave it out and say why (`damaged`), the
        manifest's timings do not list it."""
        return self.problem(variant, sample_id) is None

    def damaged(self, variant: str) -> dict[str, str]:
        """{sample id: why} for the samples of `variant` that have a sample.json but are not whole (they count
        as unfinished)."""
        vdir = self.variant_dir(variant)
        if not vdir.is_dir():
            return {}
        out = {}
        for sj in sorted(vdir.glob(f"*/{SAMPLE_JSON}")):
            why = self.problem(variant, sj.parent.name)
            if why:
                out[sj.parent.name] = why
        return out

    def damaged_ids(self, variant: str) -> list[str]:
        """Samples of `variant` whose sample.json exists but which are not whole (they count as unfinished)."""
        return sorted(self.damaged(variant))

    def sample_ids(self, variant: str) -> list[str]:
        """Ids of the finished samples of `variant`, in manifest order (then any others, sorted)."""
        vdir = self.variant_dir(variant)
        if not vdir.is_dir():
            return []
        done = {p.parent.name for p in vdir.glob(f"*/{SAMPLE_JSON}") if self.finished(variant, p.parent.name)}
        order = []
        if self.exists():
            order = [s["id"] for s in self.manifest.get("samples", []) if s["id"] in done]
        return order + sorted(done - set(order))

    def samples(self, variant: str) -> list[dict]:
        """The finished samples of `variant`: their sample.json records (id, prompt, seed, variant,
        timings, n_frames, fps, height, width), in manifest order."""
        return [self.sample(variant, i) for i in self.sample_ids(variant)]

    def sample(self, variant: str, sample_id: str) -> dict:
        """One sample's sample.json record (FileNotFoundError when it has not finished, DamagedFile when
        its sample.json is damaged)."""
        return read_record(self.sample_json_path(variant, sample_id))

    def frames(self, variant: str, sample_id: str) -> list[Path]:
        """The lossless PNG frames of a sample, in frame order."""
        return sorted(self.frames_dir(variant, sample_id).glob("[0-9]*.png"))

    def frames_array(self, variant: str, sample_id: str):
        """The lossless frames of a sample as one uint8 numpy array [F, H, W, 3]."""
        import numpy as np
        from PIL import Image

        paths = self.frames(variant, sample_id)
        if not paths:
            raise FileNotFoundError(f"no frames in {self.frames_dir(variant, sample_id)}")
        return np.stack([np.asarray(Image.open(p).convert("RGB")) for p in paths])

    def paired_ids(self, a: str = "sdpa", b: str = "sage") -> list[str]:
        """Sample ids finished in both variants `a` and `b` (what a baseline-vs-sage metric compares)."""
        done_b = set(self.sample_ids(b))
        return [i for i in self.sample_ids(a) if i in done_b]

    def collect_timings(self) -> dict[str, dict[str, dict]]:
        """{variant: {sample_id: timings}} gathered from the finished samples' sample.json files."""
        out: dict[str, dict[str, dict]] = {}
        root = self.path / SAMPLES_DIR
        if not root.is_dir():
            return out
        for sj in sorted(root.glob(f"*/*/{SAMPLE_JSON}")):
            if not self.finished(sj.parent.parent.name, sj.parent.name):
                continue  # damaged: unfinished, redone by the generator
            with contextlib.suppress(OSError, ValueError):
                rec = read_record(sj)
                out.setdefault(sj.parent.parent.name, {})[sj.parent.name] = rec.get("timings", {})
        return out

    # writing (the generator)
    def update_manifest(self, update: Callable[[dict | None], dict]) -> dict:
        """Read-modify-write the manifest under a lock; ``timings`` are then rebuilt from sample.json.

        `update` gets the current manifest (None when there is none yet) and returns the new one.
        Because every update rebuilds the timings from the files, the last writer of several processes
        leaves a manifest that lists every finished sample.
        """
        with file_lock(self.path / ".manifest.lock"):
            current = self.manifest if self.exists() else None
            new = update(current)
            new["timings"] = self.collect_timings()
            new["updated"] = now_iso()
            atomic_write_json(self.manifest_path, new)
            return new

    def refresh_manifest(self) -> dict:
        """Rebuild the manifest's timings from the finished samples."""
        return self.update_manifest(lambda m: m if m is not None else {"schema": SCHEMA})

    def ensure_inside(self, path: Path) -> Path:
        """`path` when it lies inside the resolved run directory; OutsideRunDir (never followed) otherwise."""
        if not runcheck.inside(self.path, path):  # resolves every link on the way, existing or not
            raise runcheck.OutsideRunDir(
                f"{path} leads outside the run directory {self.path} (a link to {os.path.realpath(path)}); sagegen "
                "reads and writes only inside it: remove the link")
        return path

    def clear_unfinished(self, variant: str, sample_id: str) -> None:
        """Remove what an interrupted attempt (or a damaged sample) left of a sample that is not finished."""
        d = self.ensure_inside(self.sample_dir(variant, sample_id))
        if d.is_dir() and not self.finished(variant, sample_id):
            shutil.rmtree(d, ignore_errors=True)

    def write_sample(self, variant: str, record: dict, frames, *, kind: str, fps: float | None) -> Path:
        """Save a finished sample: lossless PNG frames, then the MP4 (video) or PNG (image), then
        sample.json last. `frames` is a uint8 array [F, H, W, 3]. Adds ``timings.save_s`` (the time spent
        writing) when the record has timings. Returns the sample folder."""
        import time

        t0 = time.perf_counter()
        sid = record["id"]
        self.clear_unfinished(variant, sid)
        write_png_frames(self.frames_dir(variant, sid), frames)
        if kind == "video":
            write_mp4(self.video_path(variant, sid), frames, fps=fps or 8)
        else:
            write_png(self.image_path(variant, sid), frames[0])
        paths = sorted(self.frames_dir(variant, sid).glob("[0-9]*.png"))
        rec = dict(record, variant=variant, n_frames=int(frames.shape[0]), height=int(frames.shape[1]),
                   width=int(frames.shape[2]), fps=fps, frames_sha256=[runcheck.file_sha256(p) for p in paths])
        if isinstance(rec.get("timings"), dict):  # time spent writing the files (not part of total_s)
            rec["timings"] = dict(rec["timings"], save_s=round(time.perf_counter() - t0, 6))
        atomic_write_json(self.sample_json_path(variant, sid), rec)
        return self.sample_dir(variant, sid)


# ------------------------------------------------------------------------------------------------- media
def write_png(path: str | os.PathLike, frame) -> Path:
    """One uint8 RGB frame [H, W, 3] as a lossless PNG, atomically."""
    import io

    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    image = Image.fromarray(np.ascontiguousarray(frame, dtype=np.uint8)).convert("RGB")
    image.save(buf, format="PNG", compress_level=1)
    return atomic_write_bytes(path, buf.getvalue())


def write_png_frames(folder: str | os.PathLike, frames) -> list[Path]:
    """Frames [F, H, W, 3] uint8 as folder/00000.png, 00001.png, ... (lossless)."""
    return [write_png(Path(folder) / f"{i:05d}.png", f) for i, f in enumerate(frames)]


def write_mp4(path: str | os.PathLike, frames, *, fps: float) -> Path:
    """Frames [F, H, W, 3] uint8 as an H.264 MP4 (yuv420p, for viewing; lossy), atomically: moved into place
    only when ffmpeg succeeded and the file decodes to every frame (``sagegen.runs.encode.EncodeError`` names
    the file otherwise). Odd sizes get a black row/column (yuv420p needs even ones; viewing copy only)."""
    from sagegen.runs.encode import encode_mp4_file

    return atomic_write_file(path, lambda tmp: encode_mp4_file(frames, tmp, fps, crf=18, pad_to_even=True,
                                                               final=path))


# ----------------------------------------------------------------------------------------------- finding
def runs_root(root: str | os.PathLike | None = None) -> Path:
    """The folder that holds run directories: `root`, else $SAGEGEN_RUNS, else ./runs."""
    if root is not None:
        return Path(root)
    return Path(os.environ.get(RUNS_ENV) or DEFAULT_RUNS_ROOT)


def list_runs(root: str | os.PathLike | None = None) -> list[Path]:
    """Run directories (folders with a manifest.json) directly under the runs root, oldest first
    (by the manifest's modification time)."""
    base = runs_root(root)
    if not base.is_dir():
        return []
    runs = [p for p in base.iterdir() if (p / MANIFEST).is_file()]
    return sorted(runs, key=lambda p: ((p / MANIFEST).stat().st_mtime, p.name))


def latest_run(root: str | os.PathLike | None = None) -> Path:
    """The most recently updated run directory under `root` (default $SAGEGEN_RUNS or ./runs).

    Raises FileNotFoundError (with the fix in the message) when there is none.
    """
    runs = list_runs(root)
    if not runs:
        raise FileNotFoundError(f"no run directory under {runs_root(root)}/ (none with a {MANIFEST}); "
                                "create one with `sagegen compare MODEL --prompts smoke` or pass the path")
    return runs[-1]
