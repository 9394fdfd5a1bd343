"""The run-directory contract (sagegen/runs/directory.py): layout, atomic writes, manifest merging, lookup."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from sagegen.runs import directory as rundir
from sagegen.runs.directory import RunDir, atomic_write_bytes, atomic_write_json, latest_run


def _frames(n=3, h=16, w=24, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(n, h, w, 3), dtype=np.uint8)


def test_atomic_write_json_roundtrip_and_no_leftovers(tmp_path):
    p = tmp_path / "a" / "b.json"
    atomic_write_json(p, {"x": 1, "s": "é"})
    assert json.loads(p.read_text(encoding="utf-8")) == {"x": 1, "s": "é"}
    atomic_write_json(p, {"x": 2})
    assert json.loads(p.read_text()) == {"x": 2}
    assert sorted(os.listdir(p.parent)) == ["b.json"]  # temporary files are gone


def test_atomic_write_failure_keeps_old_file(tmp_path, monkeypatch):
    p = tmp_path / "f.bin"
    atomic_write_bytes(p, b"old")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(rundir.os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_bytes(p, b"new")
    assert p.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["f.bin"]


@pytest.mark.parametrize("kind", ["video", "image"])
def test_write_sample_layout_and_lossless_frames(tmp_path, kind):
    rd = RunDir(tmp_path / "run")
    n = 5 if kind == "video" else 1
    frames = _frames(n=n)
    rec = {"id": "p000-s0", "prompt": "a cat", "seed": 0, "timings": {"total_s": 1.5}}
    rd.write_sample("sage", rec, frames, kind=kind, fps=8 if kind == "video" else None)
    d = rd.sample_dir("sage", "p000-s0")
    names = sorted(os.listdir(d))
    assert names == sorted(["frames", "sample.json", "video.mp4" if kind == "video" else "image.png"])
    assert [p.name for p in rd.frames("sage", "p000-s0")] == [f"{i:05d}.png" for i in range(n)]
    np.testing.assert_array_equal(rd.frames_array("sage", "p000-s0"), frames)  # bit-exact
    s = rd.sample("sage", "p000-s0")
    assert (s["n_frames"], s["height"], s["width"], s["variant"]) == (n, 16, 24, "sage")
    assert rd.finished("sage", "p000-s0") and not rd.finished("sdpa", "p000-s0")
    if kind == "video":
        assert rd.video_path("sage", "p000-s0").stat().st_size > 100


def test_unfinished_sample_is_cleared_and_not_listed(tmp_path):
    rd = RunDir(tmp_path)
    stale = rd.frames_dir("sage", "p001-s0")
    stale.mkdir(parents=True)
    (stale / "00007.png").write_bytes(b"junk")  # an interrupted attempt
    assert rd.sample_ids("sage") == []
    rd.write_sample("sage", {"id": "p001-s0", "prompt": "p", "seed": 0, "timings": {}}, _frames(2),
                    kind="video", fps=8)
    assert [p.name for p in rd.frames("sage", "p001-s0")] == ["00000.png", "00001.png"]


def test_manifest_timings_rebuilt_from_samples_and_order(tmp_path):
    rd = RunDir(tmp_path)
    samples = [{"id": "p000-s0"}, {"id": "p001-s0"}, {"id": "p002-s0"}]
    rd.update_manifest(lambda m: {"schema": 1, "samples": samples, "variants": ["sdpa", "sage"]})
    for sid in ("p002-s0", "p000-s0"):
        for v, t in (("sdpa", 2.0), ("sage", 1.0)):
            rd.write_sample(v, {"id": sid, "prompt": "x", "seed": 0, "timings": {"total_s": t}},
                            _frames(1), kind="image", fps=None)
    m = rd.refresh_manifest()
    assert set(m["timings"]) == {"sdpa", "sage"}
    assert m["timings"]["sage"]["p002-s0"]["total_s"] == 1.0
    assert m["timings"]["sage"]["p002-s0"]["save_s"] >= 0  # write_sample adds the time spent writing
    assert rd.sample_ids("sage") == ["p000-s0", "p002-s0"]  # manifest order, finished only
    assert rd.paired_ids("sdpa", "sage") == ["p000-s0", "p002-s0"]
    assert [s["id"] for s in rd.samples("sdpa")] == ["p000-s0", "p002-s0"]
    assert json.loads(rd.manifest_path.read_text())["timings"]["sdpa"]["p000-s0"]["total_s"] == 2.0


def test_manifest_missing_raises_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a sagegen run directory"):
        RunDir(tmp_path).manifest


_WRITER = r"""
import sys
import numpy as np
from sagegen.runs.directory import RunDir
rd, rank = RunDir(sys.argv[1]), int(sys.argv[2])
for i in range(rank, 12, 2):
    rd.write_sample("sage", {"id": f"p{i:03d}-s0", "prompt": "x", "seed": 0, "timings": {"total_s": i}},
                    np.zeros((1, 8, 8, 3), np.uint8), kind="image", fps=None)
    rd.update_manifest(lambda m: dict(m or {"schema": 1}, variants=["sage"]))
"""


def test_concurrent_writers_leave_a_whole_manifest(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), str(r)]) for r in (0, 1)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    m = RunDir(tmp_path).manifest
    assert sorted(m["timings"]["sage"]) == [f"p{i:03d}-s0" for i in range(12)]


def test_latest_run_by_manifest_time_and_env(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="sagegen compare"):
        latest_run(tmp_path)
    for i, name in enumerate(["b-old", "a-new"]):
        atomic_write_json(tmp_path / name / "manifest.json", {"schema": 1})
        t = time.time() - 100 + 50 * i
        os.utime(tmp_path / name / "manifest.json", (t, t))
    (tmp_path / "not-a-run").mkdir()
    assert latest_run(tmp_path) == tmp_path / "a-new"
    monkeypatch.setenv("SAGEGEN_RUNS", str(tmp_path))
    assert latest_run() == tmp_path / "a-new"
    monkeypatch.delenv("SAGEGEN_RUNS")
    monkeypatch.chdir(tmp_path)
    assert rundir.runs_root() == rundir.Path("runs")


def test_atomic_writes_get_normal_permissions(tmp_path):
    """Reports and manifests must be readable by others (a web server), not mkstemp's 0600."""
    import os
    import stat

    from sagegen.runs.directory import atomic_write_file, atomic_write_json

    mask = os.umask(0o022)
    try:
        a = atomic_write_json(tmp_path / "m.json", {"x": 1})
        b = atomic_write_file(tmp_path / "v.bin", lambda p: p.write_bytes(b"1"))
    finally:
        os.umask(mask)
    for p in (a, b):
        assert stat.S_IMODE(p.stat().st_mode) == 0o644
