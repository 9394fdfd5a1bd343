"""What makes a finished sample in a run directory trustworthy: identity, integrity, containment.

- **Identity.** Each sample.json carries ``fingerprint``: a hash of what changes its pixels (the model, the
  settings, the prompt and seed, and for sagegen's variant the attention setup). Generation, eval and report
  compare it with what the manifest says the sample must be, so a folder copied from another run, or a run
  directory whose manifest was lost, cannot pass as this run's.
- **Integrity.** A sample counts as finished only when its sample.json is a JSON object naming its own folder,
  and its frames are all there (``n_frames`` of them, numbered without gaps) and look like whole PNG files
  (signature at the start, IEND chunk at the end: what a truncated or garbage file lacks). The deep check also
  compares each frame's SHA-256 with the one recorded when it was written.
- **Containment.** Reads and writes stay inside the resolved run directory: a sample folder (or any file of it)
  that is a link leading outside is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from sagegen.runs.files import DamagedFile, read_record

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_END = b"IEND\xaeB`\x82"  # the IEND chunk's type and CRC: the last 8 bytes of every whole PNG
_ATTENTION_KEYS = ("sage", "policy", "backend", "linear")


def sample_identity(manifest: dict, variant: str, sample: dict) -> dict:
    """What a sample of `variant` generated under `manifest` must have been made with (JSON types only)."""
    model = manifest.get("model") or {}
    attention = manifest.get("attention") or {}
    return {
        "model": {k: model.get(k) for k in ("name", "model_path", "random_weights")},
        "settings": manifest.get("settings"),
        "sample": {k: sample.get(k) for k in ("id", "prompt", "seed")},
        "variant": variant,
        # the stock variant runs no sagegen attention: its pixels do not depend on sagegen's config
        "attention": None if variant == "sdpa" else {k: attention.get(k) for k in _ATTENTION_KEYS},
    }


def fingerprint(identity: dict) -> str:
    """A short, stable hash of `identity` (canonical JSON)."""
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:32]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def inside(root: Path, path: Path) -> bool:
    """Whether `path`, with every link resolved, lies inside `root` (also resolved)."""
    try:
        Path(os.path.realpath(path)).relative_to(os.path.realpath(root))
    except ValueError:
        return False
    return True


def png_problem(path: Path) -> str | None:
    """Why `path` is not a whole PNG file (None when its first and last bytes are a PNG's)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            f.seek(max(0, size - 8))
            tail = f.read(8)
    except OSError as e:
        return f"{path.name} cannot be read ({e.strerror or e})"
    if head != PNG_SIGNATURE:
        return f"{path.name} is not a PNG file"
    if tail != PNG_END:
        return f"{path.name} is truncated (no PNG end chunk)"
    return None


def frame_files(frames_dir: Path) -> list[Path]:
    return sorted(frames_dir.glob("[0-9]*.png"))


class OutsideRunDir(ValueError):
    """A file sagegen would write leads outside the run directory (a link): refused, never followed."""


def identity_problem(record: dict, folder: str, expected: str | None, *, strict: bool = False) -> str | None:
    """Why `record` (a sample.json) is not the sample its folder and this run say it is, or None.

    `expected`: the fingerprint it must carry (None: only the id is checked); samples written before
    fingerprints existed pass unless `strict`."""
    if record.get("id") != folder:
        return f"its sample.json is sample {record.get('id')!r}'s, not {folder!r} (a folder copied or renamed)"
    if expected is None or record.get("fingerprint") == expected:
        return None
    if record.get("fingerprint") is None:
        return "it carries no fingerprint (written by an older sagegen), so nothing proves what made it" \
            if strict else None
    return "was generated with other settings than this run's (its fingerprint differs from the manifest's)"


def integrity_problem(run_root: Path, sample_dir: Path, record: dict, *, deep: bool = False) -> str | None:
    """Why the files of the sample in `sample_dir` are not whole, or None. `deep`: also compare every frame's
    SHA-256 with the recorded one (reads every byte: eval and report do, resuming does not)."""
    frames = frame_files(sample_dir / "frames")
    n = record.get("n_frames")
    if isinstance(n, int) and len(frames) < n:
        missing = sorted({f"{i:05d}.png" for i in range(n)} - {p.name for p in frames})
        return f"{n - len(frames)} of its {n} frames are missing ({', '.join(missing[:3])}" + \
            (" ..." if len(missing) > 3 else "") + ")"
    if isinstance(n, int) and len(frames) > n:
        return f"it has {len(frames)} frames where sample.json records {n}"
    if not frames:
        return "it has no frames"
    if [p.name for p in frames] != [f"{i:05d}.png" for i in range(len(frames))]:
        return "its frames are not numbered 00000.png, 00001.png, ... without gaps"
    for p in frames:
        if not inside(run_root, p):
            return f"frames/{p.name} leads outside the run directory"
        why = png_problem(p)
        if why:
            return f"frames/{why}"
    recorded = record.get("frames_sha256")
    if deep and isinstance(recorded, list) and len(recorded) == len(frames):
        for p, want in zip(frames, recorded):
            if file_sha256(p) != want:
                return f"frames/{p.name} changed since it was written (its SHA-256 differs from sample.json's)"
    return None


def read_sample_record(sample_dir: Path) -> tuple[dict | None, str | None]:
    """(sample.json's record, None), or (None, why it cannot be read)."""
    try:
        return read_record(sample_dir / "sample.json"), None
    except FileNotFoundError:
        return None, "not finished (no sample.json)"
    except (OSError, DamagedFile) as e:
        return None, f"sample.json is damaged ({str(e).split('damaged', 1)[-1].strip(' ()') or e})"


def sample_problem(run_root: Path, sample_dir: Path, *, expected: str | None = None, strict: bool = False,
                   deep: bool = False) -> str | None:
    """Why the sample in `sample_dir` is not a trustworthy finished sample of this run (containment, then
    sample.json, identity and integrity), or None when it is."""
    if not inside(run_root, sample_dir):
        return f"{sample_dir.name} leads outside the run directory ({os.path.realpath(sample_dir)})"
    record, why = read_sample_record(sample_dir)
    if record is None:
        return why
    return identity_problem(record, sample_dir.name, expected, strict=strict) or \
        integrity_problem(run_root, sample_dir, record, deep=deep)
