"""Issue 22, bug 9 (CLI): --frames records what is generated; --attention sdpa names the options it ignores."""

import json

import pytest
from typer.testing import CliRunner

from sagegen.cli.app import app

pytestmark = pytest.mark.usefixtures("isolated")  # tests/support/cli_fakes.py

runner = CliRunner()


def test_frames_are_fitted_recorded_and_announced(fake_model, tmp_path):
    out = tmp_path / "run"
    r = runner.invoke(app, ["run", "tiny-cogvideox", "-p", "x", "--frames", "10", "--steps", "1", "--warmup", "0",
                            "-q", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "--frames 10: tiny-cogvideox's VAE makes 4k+1 frames, so 9 frames are generated" in r.output
    m = json.loads((out / "manifest.json").read_text())
    sample = json.loads((out / "samples" / "sage" / "p000-s0" / "sample.json").read_text())
    assert m["settings"]["frames"] == 9 == sample["n_frames"]
    assert fake_model.calls[-1]["num_frames"] == 9


def test_fitting_frames_reaches_the_same_output_count(fake_model, tmp_path):
    """A count of the VAE's form is passed through untouched, with no note."""
    r = runner.invoke(app, ["run", "tiny-cogvideox", "-p", "x", "--frames", "13", "--steps", "1", "--warmup", "0",
                            "-q", "--out", str(tmp_path / "run")])
    assert r.exit_code == 0 and "VAE makes" not in r.output
    assert fake_model.calls[-1]["num_frames"] == 13


def test_sdpa_names_the_sage_only_options_it_ignores(fake_model, tmp_path):
    r = runner.invoke(app, ["run", "tiny-flux", "-p", "x", "--attention", "sdpa", "--kernel", "smooth_v=false",
                            "--fp-blocks", "0", "--steps", "1", "--warmup", "0", "-q", "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.output.splitlines() if "no effect with --attention sdpa" in ln)
    assert "--kernel" in line and "--fp-blocks" in line and "--backend" not in line
    r = runner.invoke(app, ["run", "tiny-flux", "-p", "x", "--attention", "sdpa", "--steps", "1", "--warmup", "0",
                            "-q", "--out", str(tmp_path / "b")])
    assert r.exit_code == 0 and "no effect" not in r.output
    r = runner.invoke(app, ["run", "tiny-flux", "-p", "x", "--attention", "sdpa", "--kernel", "bogus=1",
                            "--out", str(tmp_path / "c")])
    assert r.exit_code == 2 and "--kernel" in r.output  # still checked
