"""A run directory cannot lie (issue 54, defects 1, 3, 4, 5): every finished sample carries what it was made
with (identity), is whole (integrity) and lies inside the run (containment); generation, eval and report check
all three (sagegen.runs.integrity)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import typer
from typer.testing import CliRunner

from sagegen.cli.app import app
from sagegen.eval.runner import EvalOptions, evaluate
from sagegen.runs.reader import load_run
from sagegen.testing.run_dirs import make_synthetic_run
from sagegen.report.builder import build_report
from sagegen.runs.directory import RunDir

pytestmark = pytest.mark.usefixtures("isolated")  # tests/support/cli_fakes.py

runner = CliRunner()
ENV = {"COLUMNS": "200"}


def _compare(out, model="tiny-cogvideox", *extra):
    return runner.invoke(app, ["compare", model, "-p", "a", "-p", "b", "--steps", "2", "--warmup", "0", "-q",
                               "--out", str(out), *extra], env=ENV)


def _one_line(output: str) -> str:
    return " ".join(output.split())


# ------------------------------------------------------------------------------------------------- identity
@pytest.mark.parametrize("model,extra", [("tiny-wan2.1", []), ("tiny-cogvideox", ["--steps", "3"]),
                                         ("tiny-cogvideox", ["--height", "48"])])
def test_a_run_without_its_manifest_is_not_adopted_by_another_run(fake_model, tmp_path, model, extra):
    out = tmp_path / "A"
    assert _compare(out).exit_code == 0
    (out / "manifest.json").unlink()
    r = _compare(out, model, *extra)
    assert r.exit_code == 2, r.output
    line = _one_line(r.output)
    assert "holds samples but no manifest.json" in line and "--out" in line, line
    assert "already finished" not in line
    assert fake_model.loads == ["tiny-cogvideox"]  # refused before loading


def test_a_run_without_its_manifest_is_rebuilt_by_the_same_command(fake_model, tmp_path):
    out = tmp_path / "A"
    assert _compare(out).exit_code == 0
    before = {p: p.read_bytes() for p in out.rglob("frames/*.png")}
    (out / "manifest.json").unlink()
    r = _compare(out)
    assert r.exit_code == 0 and "already finished" in r.output, r.output
    assert json.loads((out / "manifest.json").read_text())["model"]["name"] == "tiny-cogvideox"
    assert {p: p.read_bytes() for p in out.rglob("frames/*.png")} == before  # nothing redone, nothing lost


def test_samples_written_before_fingerprints_are_not_adopted_without_a_manifest(fake_model, tmp_path):
    out = tmp_path / "A"
    assert _compare(out).exit_code == 0
    for sj in out.glob("samples/*/*/sample.json"):
        rec = json.loads(sj.read_text())
        del rec["fingerprint"]
        sj.write_text(json.dumps(rec))
    assert _compare(out).exit_code == 0  # with its manifest, the old samples are this run's
    (out / "manifest.json").unlink()
    r = _compare(out)
    assert r.exit_code == 2 and "no fingerprint" in _one_line(r.output), r.output


def test_a_sample_folder_copied_over_another_is_refused_by_generation_and_left_out_by_eval(tmp_path):
    run = make_synthetic_run(tmp_path / "R", prompts=["a", "b", "c"], frames=3, height=16, width=16)
    sage = run / "samples" / "sage"
    shutil.rmtree(sage / "p001-s0")
    shutil.copytree(sage / "p002-s0", sage / "p001-s0")  # its sample.json names p002-s0
    notes = []
    loaded = load_run(run, log=notes.append)
    assert [s.id for s in loaded.samples] == ["p000-s0", "p002-s0"]
    assert "copied or renamed" in loaded.left_out[("sage", "p001-s0")]
    m = evaluate(run, EvalOptions(metrics=["psnr"]), log=lambda s: None)["metrics"]["psnr"]
    assert m["samples"] == ["p000-s0", "p002-s0"] and "p001-s0" in m["warning"]
    html = build_report(run, log=lambda s: None)["html"].read_text()
    assert "sage/p001-s0 left out" in html


def test_a_sample_made_with_other_settings_is_left_out(tmp_path):
    run = make_synthetic_run(tmp_path / "R", prompts=["a", "b"], frames=3, height=16, width=16)
    other = make_synthetic_run(tmp_path / "O", prompts=["a", "b"], frames=3, height=16, width=16, sigma=9.0)
    shutil.rmtree(run / "samples" / "sage" / "p001-s0")
    shutil.copytree(other / "samples" / "sage" / "p001-s0", run / "samples" / "sage" / "p001-s0")
    loaded = load_run(run, log=lambda s: None)
    assert "other settings" in loaded.left_out[("sage", "p001-s0")]
    assert [s.id for s in loaded.samples] == ["p000-s0"]


def test_generation_refuses_a_sample_made_with_other_settings(fake_model, tmp_path):
    a, b = tmp_path / "A", tmp_path / "B"
    assert _compare(a).exit_code == 0
    assert _compare(b, "tiny-cogvideox", "--steps", "3").exit_code == 0
    shutil.rmtree(a / "samples" / "sage" / "p000-s0")
    shutil.copytree(b / "samples" / "sage" / "p000-s0", a / "samples" / "sage" / "p000-s0")
    r = _compare(a)
    assert r.exit_code == 2 and "samples/sage/p000-s0 was generated with other settings" in _one_line(r.output)


# ------------------------------------------------------------------------------------------------ integrity
@pytest.mark.parametrize("damage", ["garbage", "truncated", "missing", "renumbered"])
def test_a_damaged_frame_is_that_samples_error_and_resume_redoes_it(fake_model, tmp_path, damage):
    out = tmp_path / "A"
    assert _compare(out).exit_code == 0
    frame = out / "samples" / "sage" / "p001-s0" / "frames" / "00001.png"
    if damage == "garbage":
        frame.write_bytes(os.urandom(300))
    elif damage == "truncated":
        frame.write_bytes(frame.read_bytes()[:-20])
    elif damage == "missing":
        frame.unlink()
    else:
        frame.rename(frame.with_name("00042.png"))
    rd = RunDir(out)
    why = rd.damaged("sage")["p001-s0"]
    assert {"garbage": "not a PNG file", "truncated": "truncated", "missing": "missing",
            "renumbered": "without gaps"}[damage] in why, why
    loaded = load_run(out, log=lambda s: None)
    assert [s.id for s in loaded.samples] == ["p000-s0"]
    m = evaluate(out, EvalOptions(metrics=["psnr"]), log=lambda s: None)["metrics"]["psnr"]
    assert m["status"] == "ok" and m["samples"] == ["p000-s0"] and "p001-s0" in m["warning"]
    assert damage == "renumbered" or "00001.png" in why
    assert build_report(out, log=lambda s: None)["html"].exists()
    r = _compare(out)  # resume: the damaged sample is redone, the whole ones are kept
    assert r.exit_code == 0 and "redoing sage/p001-s0" in _one_line(r.output), r.output
    assert rd.finished("sage", "p001-s0") and rd.damaged("sage") == {}


def test_a_frame_changed_after_it_was_written_is_found_by_eval(tmp_path):
    """A frame that is still a whole PNG but not the one written (edited, or corrupted inside): the deep check
    (SHA-256 recorded at write time) leaves the sample out."""
    run = make_synthetic_run(tmp_path / "R", prompts=["a", "b"], frames=3, height=16, width=16)
    shutil.copy(run / "samples" / "sage" / "p000-s0" / "frames" / "00000.png",
                run / "samples" / "sage" / "p001-s0" / "frames" / "00000.png")
    assert RunDir(run).finished("sage", "p001-s0")  # the quick check (resume) cannot see it
    loaded = load_run(run, log=lambda s: None)
    assert "changed since it was written" in loaded.left_out[("sage", "p001-s0")]


def test_frames_of_a_different_size_are_still_a_per_sample_error(tmp_path):
    run = make_synthetic_run(tmp_path / "R", prompts=["a", "b"], frames=3, height=16, width=16)
    rd = RunDir(run)
    rec = rd.sample("sage", "p001-s0")
    import numpy as np

    rd.write_sample("sage", {k: rec[k] for k in ("id", "prompt", "seed", "fingerprint", "timings")},
                    np.zeros((3, 8, 8, 3), np.uint8), kind="video", fps=8)
    html = build_report(run, log=lambda s: None)["html"].read_text()
    assert "p001-s0: sage frames (3, 8, 8, 3) differ from baseline (3, 16, 16, 3)" in html


# ---------------------------------------------------------------------------------------------- containment
def test_generation_refuses_a_sample_folder_linked_outside_the_run(fake_model, tmp_path):
    out, elsewhere = tmp_path / "A", tmp_path / "elsewhere"
    assert _compare(out).exit_code == 0
    target = out / "samples" / "sage" / "p001-s0"
    shutil.move(target, elsewhere)
    target.symlink_to(elsewhere, target_is_directory=True)
    (elsewhere / "sample.json").unlink()  # unfinished: generation would write into it
    before = sorted(p.name for p in elsewhere.rglob("*"))
    r = _compare(out)
    assert r.exit_code == 2 and "leads outside the run directory" in _one_line(r.output), r.output
    assert sorted(p.name for p in elsewhere.rglob("*")) == before  # nothing written or deleted there


def test_eval_and_report_do_not_follow_a_sample_linked_outside_the_run(tmp_path):
    run = make_synthetic_run(tmp_path / "R", prompts=["a", "b", "c"], frames=3, height=16, width=16)
    target = run / "samples" / "sage" / "p001-s0"
    shutil.move(target, tmp_path / "elsewhere")
    target.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    loaded = load_run(run, log=lambda s: None)
    assert "outside the run directory" in loaded.left_out[("sage", "p001-s0")]
    frame = run / "samples" / "sage" / "p000-s0" / "frames" / "00002.png"
    frame.unlink()
    frame.symlink_to(tmp_path / "elsewhere" / "frames" / "00002.png")
    assert "outside the run directory" in load_run(run, log=lambda s: None).left_out[("sage", "p000-s0")]


def test_report_refuses_a_report_folder_linked_outside_the_run(tmp_path):
    from sagegen.cli import report_cmd

    run = make_synthetic_run(tmp_path / "R", prompts=["a"], frames=2, height=16, width=16)
    (tmp_path / "out").mkdir()
    (run / "report").symlink_to(tmp_path / "out", target_is_directory=True)
    cli = typer.Typer()
    report_cmd.register(cli)
    cli.command("noop")(lambda: None)
    r = CliRunner().invoke(cli, ["report", str(run)], env=ENV)
    assert r.exit_code == 2 and "leads outside the run directory" in _one_line(r.output), r.output
    assert list((tmp_path / "out").iterdir()) == []
