"""Full and read-only disks (issue 22, bug 6): ffmpeg failing half-way, writes raising ENOSPC/EROFS/EACCES.
Nothing is moved into place unless fully written, and every error names the file and what to do."""

import errno
import os
import stat

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from sagegen.runs import encode
from sagegen.runs import directory as rundir
from sagegen.runs.encode import EncodeError
from sagegen.testing.run_dirs import make_synthetic_run

FRAMES = np.random.default_rng(0).integers(0, 256, (6, 32, 48, 3), dtype=np.uint8)


def _fake_ffmpeg(tmp_path, body: str) -> str:
    """A stand-in ffmpeg: reads a little of its input, writes a stub output file (its last argument), then
    does what `body` says."""
    exe = tmp_path / "ffmpeg"
    exe.write_text("#!/bin/sh\nfor a; do out=$a; done\nhead -c 4000 >/dev/null\nprintf 'truncated' > \"$out\"\n"
                   + body + "\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_ffmpeg_dying_of_a_full_disk_leaves_nothing_in_place(tmp_path, monkeypatch):
    fake = _fake_ffmpeg(tmp_path, "echo 'Error writing trailer: No space left on device' >&2\nexit 1")
    monkeypatch.setattr(encode, "ffmpeg_exe", lambda: fake)
    dest = tmp_path / "out" / "video.mp4"
    big = np.zeros((40, 64, 96, 3), np.uint8)  # more than the fake reads: the pipe breaks (BrokenPipeError)
    with pytest.raises(EncodeError) as ei:
        rundir.write_mp4(dest, big, fps=8)
    msg = str(ei.value)
    assert str(dest) in msg and "No space left on device" in msg and "free some space" in msg
    assert _leftovers(dest.parent) == []  # neither video.mp4 nor a temporary file


def test_ffmpeg_claiming_success_on_a_truncated_file_is_caught(tmp_path, monkeypatch):
    monkeypatch.setattr(encode, "ffmpeg_exe", lambda: _fake_ffmpeg(tmp_path, "cat >/dev/null\nexit 0"))
    monkeypatch.setattr(encode, "count_frames", lambda path: 0)  # the stub file decodes to nothing
    dest = tmp_path / "out" / "video.mp4"
    with pytest.raises(EncodeError, match=r"holds 0 of 6 frames"):
        rundir.write_mp4(dest, FRAMES, fps=8)
    assert _leftovers(dest.parent) == []


def test_real_ffmpeg_writes_every_frame_and_pads_odd_sizes(tmp_path):
    dest = rundir.write_mp4(tmp_path / "v.mp4", FRAMES[:, :31, :47], fps=8)
    assert encode.count_frames(dest) == 6


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_write_errors_name_the_file_and_the_fix(tmp_path, monkeypatch, code):
    real_open = open

    def failing_open(file, mode="r", *a, **k):
        if "w" in mode and os.path.basename(str(file)).startswith(".sample."):
            raise OSError(code, os.strerror(code))
        return real_open(file, mode, *a, **k)

    monkeypatch.setattr("builtins.open", failing_open)
    dest = tmp_path / "s" / "sample.json"
    with pytest.raises(rundir.WriteError) as ei:
        rundir.atomic_write_json(dest, {"a": 1})
    assert ei.value.errno == code and str(dest) in str(ei.value)
    # what to do, but no option: eval and report write here too and have no --out (the CLI adds each command's)
    assert any(fix in str(ei.value) for fix in ("free some space", "read-only", "permissions"))
    assert "--" not in str(ei.value)
    assert _leftovers(dest.parent) == []


def test_report_on_a_full_disk_is_a_one_line_error_not_broken_pipe(tmp_path, monkeypatch):
    from sagegen.cli import report_cmd

    run = make_synthetic_run(tmp_path / "r", prompts=["a"], frames=30, height=64, width=96)
    fake = _fake_ffmpeg(tmp_path, "echo 'av_interleaved_write_frame(): No space left on device' >&2\nexit 1")
    monkeypatch.setattr(encode, "ffmpeg_exe", lambda: fake)
    app = typer.Typer()
    report_cmd.register(app)
    app.command("noop")(lambda: None)
    res = CliRunner().invoke(app, ["report", str(run), "--no-contact-sheet"])
    out = " ".join(res.output.split())
    assert res.exit_code == 1, res.output
    assert "BrokenPipeError" not in out and "No space left on device" in out
    assert str(run / "report" / "side_by_side" / "p000-s0.mp4") in out
    assert _leftovers(run / "report" / "side_by_side") == [] and not (run / "report" / "report.html").exists()


def test_a_read_only_run_directory_names_the_lock_file(tmp_path, monkeypatch):
    def read_only(*a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr("builtins.open", read_only)
    rd = rundir.RunDir(tmp_path / "run")
    with pytest.raises(rundir.WriteError, match=r"\.manifest\.lock: the file system is read-only"):
        rd.update_manifest(lambda m: {"schema": 1})
