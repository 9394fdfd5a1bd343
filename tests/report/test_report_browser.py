"""The report in a real browser: headless Chromium (Debian's package) loads report.html from disk with no
console errors; the players are there, play, pause and seek with every view on the same frame; the
screenshot is not blank. Skipped only when no Chromium is installed outside CI (CI installs it)."""

import os

import pytest

from sagegen.eval.runner import EvalOptions, evaluate
from sagegen.testing.run_dirs import make_synthetic_run
from sagegen.report.browser import find_chromium
from sagegen.report.builder import build_report
from sagegen.report.check import check_report

if not find_chromium():
    if os.environ.get("CI"):
        raise RuntimeError("CI must install Debian's chromium for the browser test (see .ci/run)")
    pytest.skip("no Chromium installed (apt-get install chromium)", allow_module_level=True)


@pytest.fixture(scope="module")
def video_report(tmp_path_factory):
    run = make_synthetic_run(tmp_path_factory.mktemp("b") / "v", prompts=["a red ball", "a boat", "a tree"],
                             frames=10, height=48, width=64)
    evaluate(run, EvalOptions(metrics=["psnr", "ssim"]), log=lambda s: None)
    return build_report(run, log=lambda s: None)["html"]


def test_players_play_in_sync_without_console_errors(video_report, tmp_path):
    shot = tmp_path / "shot.png"
    r = check_report(video_report, shot, play_s=1.2)
    assert r["problems"] == []
    assert r["players"] == 3 and r["videos_or_images"] == 9
    assert all(p["frame"] == 0 and p["views"] == [0, 0, 0] for p in r["before"])
    assert r["played"], r["during"]
    assert r["paused_ok"] and r["seek_ok"] and r["in_sync"] and r["gain_ok"]
    st = r["screenshot"]
    assert (st["width"], st["height"]) == (1400, 1000) and st["std"] > 20 and st["colors"] > 500
    assert shot.stat().st_size > 10_000


def test_image_report_loads_cleanly(tmp_path):
    run = make_synthetic_run(tmp_path / "img", kind="image", prompts=["x"], height=48, width=48)
    html = build_report(run, log=lambda s: None)["html"]
    r = check_report(html)
    assert r["problems"] == [] and r["players"] == 0 and r["videos_or_images"] == 3
    assert r["screenshot"]["std"] > 20


def test_checker_catches_a_broken_page(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><head><link rel=icon href='data:,'></head><body>"
                   "<script>window.sagegenPlayers=[];console.error('boom');undefinedFn();</script></body></html>")
    r = check_report(bad)
    assert any("boom" in p for p in r["problems"]) and any("undefinedFn" in p for p in r["problems"])
    assert r["screenshot"]["std"] < 5  # a blank page is detectably blank


def test_subsampled_player_counts_and_points_at_real_frames(tmp_path):
    from sagegen.report.browser import Browser
    from sagegen.report.builder import ReportOptions

    run = make_synthetic_run(tmp_path / "long", prompts=["p"], frames=12, height=32, width=32)
    html = build_report(run, ReportOptions(max_frames=5, mp4=False, contact=False), log=lambda s: None)["html"]
    with Browser() as b:
        b.open(html.resolve().as_uri())
        b.eval("Promise.all(window.sagegenPlayers.map(function(p){return p.ready;}))")
        b.eval("window.sagegenPlayers[0].seek(2)")  # the 3rd frame shown, every 3rd frame: real frame 7
        counter = b.eval("document.querySelector('.fc').textContent")
        x, x0, dx = b.eval("""(function(){var c=document.querySelector('line.sg-cursor');
            return [+c.getAttribute('x1'), +c.dataset.x0, +c.dataset.dx];})()""")
        assert b.console_problems() == []
    assert counter == "frame 7 / 12"
    assert x == pytest.approx(x0 + 6 * dx)
