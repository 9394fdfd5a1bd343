"""report.html details: faithful embedded frames, real frame numbers when frames are subsampled, readable
labels on small side-by-sides, metric rows that say what they are, null values, and a mismatched sample."""

import base64
import io
import json
import re

import numpy as np
import pytest
from PIL import Image, JpegImagePlugin

from sagegen.runs.reader import load_frames, load_run
from sagegen.eval.runner import EvalOptions, evaluate
from sagegen.testing.run_dirs import make_synthetic_run
from sagegen.report.builder import ReportOptions, build_report
from sagegen.report.frames import amplified_diff, encode, fit, label_bar, side_by_side

NO_FILES = ReportOptions(mp4=False, contact=False)


def _players(html: str) -> list[dict]:
    return json.loads(re.search(r'id="sg-data">(.*?)</script>', html, re.S).group(1))["players"]


def _decode(uri: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))


def test_embedded_frames_are_faithful(tmp_path):
    run = make_synthetic_run(tmp_path / "v", prompts=["a boat"], frames=3, height=96, width=128, sigma=2.0)
    html = build_report(run, NO_FILES, log=lambda s: None)["html"].read_text()
    views = _players(html)[0]["views"]
    s0 = load_run(run).samples[0]
    lossless = {v: load_frames(s0.frame_paths(v)) for v in ("sdpa", "sage")}
    for k, v in enumerate(("sdpa", "sage")):
        for t, uri in enumerate(views[k]):
            im = _decode(uri)
            if im.format == "JPEG":
                assert JpegImagePlugin.get_sampling(im) == 0  # 4:4:4, no halved chroma
            err = np.abs(np.asarray(im.convert("RGB"), float) - fit(lossless[v][t], 384)).mean()
            assert err < 2.0, (v, t, im.format, err)  # noise is JPEG's worst case; q85 4:2:0 made ~12 on the demo
    for t, uri in enumerate(views[2]):  # the difference view is exact
        im = _decode(uri)
        assert im.format == "PNG"
        want = amplified_diff(lossless["sage"][t], lossless["sdpa"][t], 8.0)
        assert np.array_equal(np.asarray(im.convert("RGB")), want)


def test_jpeg_encoding_keeps_full_chroma():
    img = np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    assert JpegImagePlugin.get_sampling(Image.open(io.BytesIO(encode(img, "JPEG", 80)))) == 0


def test_subsampled_players_show_real_frame_numbers(tmp_path):
    run = make_synthetic_run(tmp_path / "long", prompts=["p"], frames=12, height=32, width=32)
    html = build_report(run, ReportOptions(max_frames=5, mp4=False, contact=False),
                        log=lambda s: None)["html"].read_text()
    p = _players(html)[0]
    assert p["n"] == 4 and p["step"] == 3 and p["total"] == 12
    assert "(every 3rd frame)" in html and "3th" not in html
    assert 'data-step="3"' in html
    assert "frame (1–12)" in html and "<title>frame 12:" in html  # the plot has every real frame
    assert '<span class="fc">frame 1 / 12</span>' in html


def test_ordinals():
    from sagegen.report.html import ordinal

    assert [ordinal(k) for k in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "101st", "111th"]


def _text_pixels(bar: np.ndarray) -> int:
    return int((bar.max(axis=2) > 128).sum())


def test_labels_fit_on_small_side_by_side_frames():
    small = np.full((32, 32, 3), 90, np.uint8)
    labels = ["baseline", "sagegen"]
    im = side_by_side([small, small], labels, bar=22)
    k = (im.shape[0] - 22) // 32
    assert k > 1 and im.shape[0] == 22 + 32 * k  # enlarged by an integer factor...
    tile = im[22:, : 32 * k]
    assert np.array_equal(tile, np.full_like(tile, 90))  # ...nearest neighbour: the pixels stay exact
    x = 0
    for text in labels:  # each tile's bar holds its whole label: as many text pixels as on a wide bar
        bar = im[:22, x : x + 32 * k]
        assert _text_pixels(bar) == _text_pixels(label_bar(400, text, 22)) > 0
        x += 32 * k + 4
    wide = np.zeros((40, 300, 3), np.uint8)
    assert side_by_side([wide, wide], labels).shape == (62, 604, 3)  # wide frames are left alone


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    from sagegen.testing.metric_standins import write_tiny_inception

    d = tmp_path_factory.mktemp("rep")
    run = make_synthetic_run(d / "r", prompts=["a", "b", "c"], frames=3, height=32, width=32)
    evaluate(run, EvalOptions(metrics=["psnr", "fid", "kid"],
                              inception_weights=str(write_tiny_inception(d / "inc.pt"))), log=lambda s: None)
    return run


def test_metric_rows_say_what_they_are(evaluated):
    html = build_report(evaluated, NO_FILES, log=lambda s: None)["html"].read_text()
    assert "<h3>Metrics</h3>" in html and "mean over samples, 95% bootstrap CI)" not in html
    assert "mean over 3 sample(s), 95% Student-t CI" in html
    assert "one value for the whole set: 9 images each (sdpa, sage)" in html and "{&#x27;sdpa" not in html
    assert "comparable to published FIDs: no" in html
    kid = re.search(r"<td>kid ↓</td>(.*?)</tr>", html).group(1)
    assert "±" not in kid  # equal sets of 9: one subset, no std


def test_null_values_show_as_dashes(evaluated, tmp_path):
    run = tmp_path / "r"
    import shutil

    shutil.copytree(evaluated, run)
    path = run / "metrics.json"
    doc = json.loads(path.read_text())
    doc["metrics"]["fid"]["vs_baseline"]["sage"]["value"] = None  # what a NaN is stored as
    doc["metrics"]["kid"]["vs_baseline"]["sage"]["std"] = None
    doc["metrics"]["psnr"]["per_sample"]["sage"]["p000-s0"]["value"] = None
    doc["metrics"]["psnr"]["aggregate"]["sage"] = {"mean": None, "ci": None, "n": 0, "level": 0.95}
    path.write_text(json.dumps(doc))
    html = build_report(run, NO_FILES, log=lambda s: None)["html"].read_text()
    fid = re.search(r"<td>fid ↓</td>(.*?)</tr>", html).group(1)
    assert "— vs baseline" in fid


def test_mismatched_sample_is_reported_not_fatal(tmp_path):
    run = make_synthetic_run(tmp_path / "mis", prompts=["a", "b"], frames=4, height=32, width=32)
    (run / "samples" / "sage" / "p001-s0" / "frames" / "00003.png").unlink()
    evaluate(run, EvalOptions(metrics=["psnr"]), log=lambda s: None)
    written = build_report(run, log=lambda s: None)
    html = written["html"].read_text()
    assert [p["id"] for p in _players(html)] == ["p000-s0"]
    assert "sage/p001-s0 left out: 1 of its 4 frames are missing" in html
    assert "side_by_side:p000-s0" in written and "side_by_side:p001-s0" not in written
