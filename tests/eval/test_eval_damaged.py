"""Damaged run-directory files (issue 22, bug 9): one rule for a damaged sample.json everywhere (unfinished:
generation redoes it, eval and report leave it out and say so, the manifest does not list it), and a
manifest that is JSON but not an object is a clear error, not AttributeError."""

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from sagegen.runs.reader import RunDirError, load_run
from sagegen.eval.runner import EvalOptions, evaluate
from sagegen.testing.run_dirs import make_synthetic_run
from sagegen.runs.directory import DamagedFile, RunDir

pytestmark = pytest.mark.usefixtures("isolated")  # tests/support/cli_fakes.py


@pytest.fixture
def run(tmp_path):
    return make_synthetic_run(tmp_path / "r", prompts=["a", "b", "c"], frames=3, height=32, width=32)


def _damage(run, variant="sage", sid="p001-s0", text='{"id": "p001-s0", "timings": {"total'):
    (run / "samples" / variant / sid / "sample.json").write_text(text)


@pytest.mark.parametrize("text", ['{"id": "p001-s0", "timings": {"total', "", '["not", "an object"]', "\xff"])
def test_a_damaged_sample_is_unfinished_for_every_reader(run, text):
    _damage(run, text=text)
    rd = RunDir(run)
    assert not rd.finished("sage", "p001-s0") and rd.finished("sdpa", "p001-s0")
    assert rd.sample_ids("sage") == ["p000-s0", "p002-s0"] and rd.damaged_ids("sage") == ["p001-s0"]
    assert "p001-s0" not in rd.refresh_manifest()["timings"]["sage"]  # the manifest agrees
    notes = []
    assert [s.id for s in load_run(run, log=notes.append).samples] == ["p000-s0", "p002-s0"]  # eval agrees
    assert any("sage/p001-s0: sample.json is damaged" in n and "redoes" in n for n in notes), notes
    doc = evaluate(run, EvalOptions(metrics=["psnr"]), log=lambda s: None)
    assert doc["metrics"]["psnr"]["samples"] == ["p000-s0", "p002-s0"]


def test_generation_redoes_a_damaged_sample(run):
    _damage(run)
    rd = RunDir(run)
    frames = np.full((3, 32, 32, 3), 7, np.uint8)
    stale = run / "samples" / "sage" / "p001-s0" / "frames" / "00002.png"
    assert stale.exists()
    rd.write_sample("sage", {"id": "p001-s0", "prompt": "b", "seed": 0, "timings": {"total_s": 1.0}}, frames[:2],
                    kind="video", fps=8)
    assert rd.finished("sage", "p001-s0") and rd.sample("sage", "p001-s0")["n_frames"] == 2
    assert not stale.exists()  # the damaged attempt was cleared, not mixed with the new one


@pytest.mark.parametrize("content", ["[1, 2]", '"text"', "null", "{broken"])
def test_manifest_that_is_not_an_object_is_a_clear_error(run, content):
    (run / "manifest.json").write_text(content)
    with pytest.raises(DamagedFile, match=r"manifest.json is damaged.*start the run over in a new folder"):
        RunDir(run).manifest
    with pytest.raises(RunDirError, match="manifest.json is damaged"):
        load_run(run)
    from sagegen.cli import eval_cmd

    app = typer.Typer()
    eval_cmd.register(app)
    app.command("noop")(lambda: None)
    res = CliRunner().invoke(app, ["eval", str(run), "-m", "psnr"])
    assert res.exit_code == 2 and "damaged" in res.output and "AttributeError" not in res.output


def test_run_redoes_a_damaged_sample_and_refuses_a_damaged_manifest(fake_model, tmp_path):
    """The same rule end to end through `sagegen run` (fake pipeline, no model)."""
    from sagegen.cli.app import app as sagegen_app

    out = tmp_path / "D"
    args = ["run", "tiny-flux", "-p", "x", "-p", "y", "--steps", "1", "--warmup", "0", "-q", "--out", str(out)]
    assert CliRunner().invoke(sagegen_app, args).exit_code == 0
    rd = RunDir(out)
    sid = rd.sample_ids("sage")[1]
    _damage(out, "sage", sid, text="{")
    calls = len(fake_model.calls)
    res = CliRunner().invoke(sagegen_app, args)
    assert res.exit_code == 0, res.output
    assert len(fake_model.calls) == calls + 1 and rd.finished("sage", sid)  # only the damaged one redone
    assert sid in rd.manifest["timings"]["sage"]
    (out / "manifest.json").write_text("[]")
    res = CliRunner().invoke(sagegen_app, args)
    assert res.exit_code == 2 and "manifest.json is damaged" in res.output and "AttributeError" not in res.output
