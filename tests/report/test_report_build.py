"""`sagegen report`: report.html is self-contained and complete, the side-by-side MP4 and contact sheet
are right, for video and image runs."""

import base64
import io
import json
import re
from html import escape as html_escape
from pathlib import Path

import numpy as np
import pytest
import typer
from PIL import Image
from typer.testing import CliRunner

from sagegen.eval.runner import EvalOptions, evaluate
from sagegen.testing.run_dirs import make_synthetic_run
from sagegen.report.builder import ReportOptions, build_report
from sagegen.report.frames import amplified_diff, side_by_side
from sagegen.report.video import probe_frames


@pytest.fixture(scope="module")
def video_run(tmp_path_factory):
    run = make_synthetic_run(tmp_path_factory.mktemp("runs") / "v", prompts=["a red <ball> & \"cube\"", "a boat"],
                             frames=6, height=40, width=58, sigma=3.0)  # odd width: MP4 must be padded even
    evaluate(run, EvalOptions(metrics=["psnr", "ssim"]), log=lambda s: None)
    written = build_report(run, log=lambda s: None)
    return run, written


def test_amplified_diff_known_answer():
    a = np.full((2, 2, 3), 100, np.uint8)
    b = a.copy()
    b[0, 0] = 103
    b[1, 1] = 0
    d = amplified_diff(b, a, gain=10)
    assert d[0, 0].tolist() == [30, 30, 30] and d[1, 1].tolist() == [255, 255, 255] and d[0, 1].tolist() == [0, 0, 0]


def test_html_is_self_contained_and_complete(video_run):
    run, written = video_run
    html = written["html"].read_text()
    # nothing loaded from outside the file: every src is a data URI; no http(s) resources
    assert not re.search(r'src="(?!data:)', html)
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "") and "https://" not in html
    assert (html.count('class="player"') == 2 and html.count("<canvas class=\"sg-view") == 6
            and html.count("sg-view sg-diff") == 2)
    assert "a red &lt;ball&gt; &amp; &quot;cube&quot;" in html  # prompts escaped
    assert html.count('class="sg-cursor"') == 2  # per-frame PSNR plots
    assert "speedup" in html and "1.67×" in html  # 1.5 s / 0.9 s denoise in the synthetic timings
    m = json.loads((run / "metrics.json").read_text())
    assert f'{m["metrics"]["psnr"]["aggregate"]["sage"]["mean"]:.2f}' in html
    data = json.loads(re.search(r'<script type="application/json" id="sg-data">(.*?)</script>', html, re.S).group(1))
    p0 = data["players"][0]
    assert p0["n"] == 6 and p0["fps"] == 8 and len(p0["views"]) == 3 and all(len(v) == 6 for v in p0["views"])
    # the diff view shows |sage - baseline| x gain of the lossless frames
    uri = p0["views"][2][0]
    img = np.asarray(Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))).convert("RGB")).astype(float)
    from sagegen.runs.reader import load_frames, load_run

    s0 = load_run(run).samples[0]
    want = amplified_diff(load_frames(s0.frame_paths("sage"))[0], load_frames(s0.frame_paths("sdpa"))[0], 8.0)
    assert abs(img.mean() - want.mean()) < 3.0  # JPEG-encoded, so close, not exact
    for key in ("steps", "frames", "height", "width"):
        assert f"<td>{key}</td>" in html


def test_side_by_side_mp4_and_contact_sheet(video_run):
    run, written = video_run
    mp4 = written["side_by_side:p000-s0"]
    n, w, h = probe_frames(mp4)
    assert n == 6 and w % 2 == 0 and h % 2 == 0
    assert w >= 2 * 58 and h >= 40
    frame = side_by_side([np.zeros((40, 58, 3), np.uint8)] * 2, ["baseline", "sagegen"])
    assert (h, w) == (frame.shape[0] + frame.shape[0] % 2, frame.shape[1] + frame.shape[1] % 2)
    sheet = np.asarray(Image.open(written["contact_sheet"]))
    assert sheet.shape[0] > 2 * 3 * 40 and sheet.std() > 10


def test_long_clips_are_subsampled_and_report_without_metrics(tmp_path):
    run = make_synthetic_run(tmp_path / "long", prompts=["p"], frames=12, height=32, width=32)
    written = build_report(run, ReportOptions(max_frames=5, mp4=False, contact=False), log=lambda s: None)
    html = written["html"].read_text()
    data = json.loads(re.search(r'id="sg-data">(.*?)</script>', html, re.S).group(1))
    assert data["players"][0]["n"] == 4 and data["players"][0]["fps"] == pytest.approx(8 / 3)
    assert "No metrics.json yet" in html and "psnr" in html  # PSNR computed by the report itself
    assert set(written) == {"html"}


def test_image_run_report(tmp_path):
    run = make_synthetic_run(tmp_path / "img", kind="image", prompts=["x", "y"], height=48, width=64)
    written = build_report(run, log=lambda s: None)
    html = written["html"].read_text()
    assert 'class="player"' not in html and html.count("<img src=\"data:image/png;base64,") == 6
    sbs = np.asarray(Image.open(written["side_by_side:p000-s0"]))
    assert sbs.shape[1] >= 128


def test_cli_report_defaults_to_latest(tmp_path, monkeypatch):
    from sagegen.cli import eval_cmd, report_cmd

    run = make_synthetic_run(tmp_path / "runs" / "r", prompts=["p"], frames=3, height=32, width=32)
    monkeypatch.setenv("SAGEGEN_RUNS", str(tmp_path / "runs"))
    app = typer.Typer()
    eval_cmd.register(app)
    report_cmd.register(app)
    res = CliRunner().invoke(app, ["report", "--no-mp4"], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    assert str(run / "report" / "report.html") in res.output.replace("\n", "")
    res = CliRunner().invoke(app, ["report", str(run), "--gain", "0"])
    assert res.exit_code == 2 and "--gain" in res.output


def test_contact_sheet_is_wide_enough_for_its_title():
    from sagegen.report.contact import contact_sheet

    frames = np.random.default_rng(0).integers(0, 255, (1, 32, 32, 3), dtype=np.uint8)
    title = "sagegen: tiny-flux — baseline (sdpa) vs sagegen, |diff| amplified"
    narrow = contact_sheet([("a cat", frames, frames)], thumb=32)
    titled = contact_sheet([("a cat", frames, frames)], thumb=32, title=title)
    assert titled.shape[1] > narrow.shape[1] and titled.shape[1] >= 8 * len(title) // 2


def test_cpu_runs_say_their_timings_are_not_speed(tmp_path):
    from sagegen.runs.directory import RunDir, atomic_write_json

    run_path = make_synthetic_run(tmp_path / "r", prompts=["a boat"], frames=3, height=32, width=32, sigma=3.0)
    options = ReportOptions(mp4=False, contact=False)
    manifest = dict(RunDir(run_path).manifest, gpu=None)
    atomic_write_json(Path(run_path) / "manifest.json", manifest)
    html = Path(build_report(run_path, options, log=lambda s: None)["html"]).read_text()
    assert "not speed measurements" in html
    atomic_write_json(Path(run_path) / "manifest.json", dict(manifest, gpu={"name": "NVIDIA H200", "count": 1}))
    html = Path(build_report(run_path, options, log=lambda s: None)["html"]).read_text()
    assert "not speed measurements" not in html


def test_report_suggests_an_eval_command_that_works(tmp_path, monkeypatch):
    """report's "run `sagegen eval ...` first" note, typed as shown, computes metrics (issue 22, bug 2); also for
    a run path with a space and brackets, which rich must not read as markup."""
    import shlex

    from sagegen.cli import eval_cmd, report_cmd

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hf"))
    for var in ("SAGEGEN_INCEPTION_WEIGHTS", "SAGEGEN_LPIPS_WEIGHTS", "SAGEGEN_CLIP_MODEL"):
        monkeypatch.delenv(var, raising=False)
    run = make_synthetic_run(tmp_path / "[x] r", prompts=["a", "b"], frames=3, height=32, width=32)
    app = typer.Typer()
    eval_cmd.register(app)
    report_cmd.register(app)
    res = CliRunner().invoke(app, ["report", str(run), "--no-mp4", "--no-contact-sheet"], env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    hint = re.search(r"run `sagegen (eval [^`]*)`", res.output.replace("\n", "")).group(1)
    assert hint == f"eval {shlex.quote(str(run))}"
    assert f"Reporting {run}" in res.output.replace("\n", "")
    html = (run / "report" / "report.html").read_text()
    assert f"sagegen eval {html_escape(shlex.quote(str(run)))}" in html
    res = CliRunner().invoke(app, shlex.split(hint), env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert (run / "metrics.json").is_file()
