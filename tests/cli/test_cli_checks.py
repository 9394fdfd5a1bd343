"""Issue 22, bugs 7 and 8: plan size, --out and --fp-blocks are checked before any model loads (exit 2)."""

import os
import time

import pytest
from typer.testing import CliRunner

from sagegen.cli.app import app
from sagegen.models.block_counts import block_count
from sagegen.models.presets import PRESETS, tiny_presets

pytestmark = pytest.mark.usefixtures("isolated")  # tests/support/cli_fakes.py

runner = CliRunner()
BASE = ["run", "tiny-flux", "-p", "x", "--steps", "1", "--warmup", "0", "-q"]


def _error(result) -> str:
    lines = [ln for ln in result.output.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def test_huge_seed_range_is_refused_at_once(fake_model):
    t0 = time.perf_counter()
    r = runner.invoke(app, [*BASE, "--seed", "0-100000000"])
    assert time.perf_counter() - t0 < 5
    assert r.exit_code == 2 and "--seed" in _error(r) and "10,000" in _error(r) and "SAGEGEN_MAX_SAMPLES" in r.output
    assert fake_model.loads == []


def test_plan_limit_counts_prompts_times_seeds(fake_model, monkeypatch, tmp_path):
    monkeypatch.setenv("SAGEGEN_MAX_SAMPLES", "3")
    r = runner.invoke(app, [*BASE, "-p", "y", "--seed", "0-1", "--out", str(tmp_path / "a")])
    assert r.exit_code == 2 and "2 prompt(s) x 2 seed(s) = 4 samples" in _error(r)
    r = runner.invoke(app, [*BASE, "--seed", "0-2", "--out", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output


def test_out_is_a_file(fake_model, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    r = runner.invoke(app, [*BASE, "--out", str(f)])
    assert r.exit_code == 2 and "--out" in _error(r) and "is a file" in _error(r)
    r = runner.invoke(app, [*BASE, "--out", str(f / "sub" / "run")])
    assert r.exit_code == 2 and "--out" in _error(r) and f"{f} is a file" in _error(r)
    assert fake_model.loads == [] and f.read_text() == "x"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_out_in_a_read_only_folder(fake_model, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        r = runner.invoke(app, [*BASE, "--out", str(ro / "run")])
        assert r.exit_code == 2 and "--out" in _error(r) and "not writable" in _error(r)
        r = runner.invoke(app, [*BASE, "--out", str(ro)])
        assert r.exit_code == 2 and "not writable" in _error(r)
    finally:
        ro.chmod(0o755)
    assert fake_model.loads == [] and list(ro.iterdir()) == []


def test_out_that_cannot_be_created_is_a_usage_error(fake_model, tmp_path):
    """Even where `os.access` says yes (root; /proc), a folder that cannot be made is refused by name; a folder
    that can be made is not left behind by the check."""
    r = runner.invoke(app, [*BASE, "--out", "/proc/sagegen-no-such-dir/run"])
    assert r.exit_code == 2 and "--out" in _error(r) and "cannot be created" in _error(r), r.output
    assert fake_model.loads == []
    r = runner.invoke(app, [*BASE, "--fp-blocks", "99", "--out", str(tmp_path / "new" / "run")])
    assert r.exit_code == 2 and not (tmp_path / "new").exists()  # checked, then refused later: nothing made


def test_out_holding_other_files_is_refused_unless_it_is_a_run_directory(fake_model, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("README.md", "a.txt", "b.txt", "c.txt"):
        (mine / name).write_text("x")
    r = runner.invoke(app, [*BASE, "--out", str(mine)])
    assert r.exit_code == 2 and "--out" in _error(r) and "not a sagegen run directory" in _error(r)
    assert "README.md, a.txt, b.txt and 1 more" in _error(r)
    assert fake_model.loads == [] and sorted(p.name for p in mine.iterdir()) == ["README.md", "a.txt", "b.txt",
                                                                              "c.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert runner.invoke(app, [*BASE, "--out", str(empty)]).exit_code == 0  # an empty folder, then its run again
    assert runner.invoke(app, [*BASE, "--out", str(empty)]).exit_code == 0


def test_fp_blocks_out_of_range_before_loading(fake_model, tmp_path):
    out = tmp_path / "run"
    r = runner.invoke(app, [*BASE, "--fp-blocks", "99", "--out", str(out)])
    assert r.exit_code == 2 and "--fp-blocks" in _error(r) and "tiny-flux has 2 blocks" in _error(r)
    assert fake_model.loads == [] and not out.exists()
    r = runner.invoke(app, [*BASE.__getitem__(slice(0, 1)), "flux.1-dev", "-p", "x", "--random-weights",
                            "--fp-blocks", "0,57", "--out", str(out), "--device", "cpu"])
    assert r.exit_code == 2 and "flux.1-dev has 57 blocks" in _error(r)
    assert runner.invoke(app, [*BASE, "--fp-blocks", "-2", "--out", str(out)]).exit_code == 0


def test_failed_first_attempt_leaves_no_manifest_only_folder(fake_model, monkeypatch, tmp_path):
    """A policy that fails only when the model is patched (a module name that matches nothing)."""
    from sagegen.jobs import generate

    def failing_patch(pipe, config, **kw):
        raise ValueError("PrecisionPolicy.blocks: 'decoder.*' matches no attention module")

    monkeypatch.setattr(generate, "_patcher", lambda: (failing_patch, lambda p: None))
    out = tmp_path / "run"
    r = runner.invoke(app, [*BASE, "--fp-blocks", "decoder.*", "--out", str(out)])
    assert r.exit_code == 2 and _error(r).startswith("Error: --fp-blocks:")
    assert not out.exists()


@pytest.mark.parametrize("preset", [p.name for p in tiny_presets()])
def test_block_count_matches_the_built_transformer(preset):
    """The count from the config (no model built) equals the policy's main blocks of the real module."""
    from sagegen.models import tiny_video
    from sagegen.models.tiny import build_tiny_transformer
    from sagegen.patch.patcher import attention_modules
    from sagegen.patch.precision_policy import main_blocks

    p = PRESETS[preset]
    kind = p.name.removeprefix("tiny-")
    model = (tiny_video.build_tiny_denoiser(kind) if kind in tiny_video.TINY_VIDEO_KINDS
             else build_tiny_transformer(p.family))
    names = list(attention_modules(model))
    assert block_count(p) == len(main_blocks(model, names))


def test_block_counts_of_full_size_presets():
    expected = {"cogvideox-2b": 30, "cogvideox-5b": 42, "hunyuanvideo": 60, "mochi-1": 48, "flux.1-dev": 57,
                "sd3.5-large": 38, "sd3.5-medium": 24}
    assert {k: block_count(PRESETS[k]) for k in expected} == expected


def test_out_not_writable_as_seen_by_access(fake_model, monkeypatch, tmp_path):
    """The same check where the tests run as root (who may write anywhere): os.access says no."""
    from sagegen.cli import checks

    ro = tmp_path / "ro"
    ro.mkdir()
    monkeypatch.setattr(checks.os, "access", lambda path, mode: os.fspath(path) != os.fspath(ro))
    r = runner.invoke(app, [*BASE, "--out", str(ro / "a" / "run")])
    assert r.exit_code == 2 and f"cannot be created: {ro} is not writable" in _error(r)
    assert fake_model.loads == [] and list(ro.iterdir()) == []


def test_a_missing_video_encoder_is_said_before_loading(fake_model, monkeypatch, tmp_path):
    """Video presets need imageio-ffmpeg's ffmpeg to save their MP4s: without it the run stops before loading
    (exit 2), instead of after generating a sample whose frames a failed save would discard. Image presets
    need no ffmpeg."""
    import sagegen.runs.encode

    def missing():
        raise ModuleNotFoundError("No module named 'imageio_ffmpeg'", name="imageio_ffmpeg")

    monkeypatch.setattr(sagegen.runs.encode, "ffmpeg_exe", missing)
    r = runner.invoke(app, ["run", "tiny-cogvideox", "-p", "x", "--steps", "1", "--warmup", "0", "-q",
                            "--out", str(tmp_path / "v")])
    assert r.exit_code == 2, r.output
    assert "imageio-ffmpeg" in _error(r) and "pip install imageio-ffmpeg" in _error(r)
    assert fake_model.loads == [] and not (tmp_path / "v").exists()
    r = runner.invoke(app, [*BASE, "--out", str(tmp_path / "i")])
    assert r.exit_code == 0, r.output
