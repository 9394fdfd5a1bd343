"""`sagegen eval RUN --against OTHER`: paired metrics across two runs of the same prompts (a cached run against an
uncached one), the checks that the runs are comparable, and metrics.json keeping both kinds of entry."""

import json

import pytest
import typer
from typer.testing import CliRunner

from sagegen.eval.against import check_comparable, evaluate_against, pair_name
from sagegen.eval.runner import EvalOptions, evaluate
from sagegen.eval.weights import BadOption
from sagegen.runs.reader import load_run
from sagegen.testing.metric_standins import write_tiny_lpips
from sagegen.testing.run_dirs import make_synthetic_run

PROMPTS = ["a red ball", "a blue boat", "a green tree"]


def _app():
    from sagegen.cli import eval_cmd

    a = typer.Typer()
    eval_cmd.register(a)
    a.command("noop", hidden=True)(lambda: None)  # keep eval a subcommand
    return a


@pytest.fixture
def pair(tmp_path):
    """Two runs of the same prompts and seeds: the "cached" one's candidate strays further (sigma 6 vs 2); both
    baselines are the same frames, as two uncached stock runs would be."""
    cached = make_synthetic_run(tmp_path / "cached", prompts=PROMPTS, frames=4, height=40, width=56, sigma=6.0)
    plain = make_synthetic_run(tmp_path / "plain", prompts=PROMPTS, frames=4, height=40, width=56, sigma=2.0)
    return cached, plain


def test_every_pair_of_variants_is_compared_and_matches_the_in_run_numbers(pair, tmp_path):
    cached, plain = pair
    lpips = str(write_tiny_lpips(tmp_path / "lpips.pth"))
    evaluate(cached, EvalOptions(metrics=["psnr", "ssim"]), log=lambda s: None)
    within = json.loads((cached / "metrics.json").read_text())["metrics"]

    from sagegen.eval import fidelity, weights
    entry = evaluate_against(cached, plain, ["psnr", "ssim", "lpips"],
                             lambda: fidelity.load_lpips(weights.resolve_lpips(lpips)), log=lambda s: None)
    psnr = entry["metrics"]["psnr"]["aggregate"]
    assert set(psnr) == {pair_name(a, b) for a in ("sdpa", "sage") for b in ("sdpa", "sage")}
    # the baselines are the same frames: PSNR at its cap, SSIM 1, LPIPS 0
    assert psnr["sdpa~sdpa"]["mean"] == pytest.approx(100.0)
    assert entry["metrics"]["ssim"]["aggregate"]["sdpa~sdpa"]["mean"] == pytest.approx(1.0)
    assert entry["metrics"]["lpips"]["aggregate"]["sdpa~sdpa"]["mean"] == pytest.approx(0.0, abs=1e-6)
    # the cached candidate against the other run's baseline is the cached run's own sage-vs-sdpa number
    assert psnr["sage~sdpa"]["mean"] == pytest.approx(within["psnr"]["aggregate"]["sage"]["mean"], rel=1e-9)
    # more noise here than there: the cached candidate is further from stock than the uncached one
    assert psnr["sage~sdpa"]["mean"] < psnr["sdpa~sage"]["mean"]
    assert psnr["sage~sdpa"]["n"] == 3 and psnr["sage~sdpa"]["ci"] is not None
    doc = json.loads((cached / "metrics.json").read_text())
    assert doc["against"]["plain"]["run_dir"] == str(plain.resolve())
    assert doc["metrics"]["psnr"] == within["psnr"]  # the in-run metrics are kept
    evaluate(cached, EvalOptions(metrics=["psnr"]), log=lambda s: None)  # and a later eval keeps "against"
    assert "plain" in json.loads((cached / "metrics.json").read_text())["against"]


def test_runs_that_differ_in_more_than_the_setting_are_refused(tmp_path):
    a = make_synthetic_run(tmp_path / "a", prompts=PROMPTS, frames=4, height=40, width=56)
    taller = make_synthetic_run(tmp_path / "b", prompts=PROMPTS, frames=4, height=48, width=56)
    other_prompts = make_synthetic_run(tmp_path / "c", prompts=["x", "y", "z"], frames=4, height=40, width=56)
    with pytest.raises(BadOption, match="--against: height differs"):
        check_comparable(load_run(a), load_run(taller))
    with pytest.raises(BadOption, match="--against: sample p000-s0 has prompt/seed 'a red ball'/0 here and 'x'/0"):
        check_comparable(load_run(a), load_run(other_prompts))
    with pytest.raises(BadOption, match="is the run being evaluated"):
        check_comparable(load_run(a), load_run(a))


def test_cli_against_prints_the_pairs_and_usage_errors_exit_2(pair, tmp_path):
    cached, plain = pair
    res = CliRunner().invoke(_app(), ["eval", str(cached), "--against", str(plain), "-m", "psnr,ssim"],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "sage~sdpa" in res.output and "against.plain" in " ".join(res.output.split())
    r = CliRunner().invoke(_app(), ["eval", str(cached), "--against", str(plain), "-m", "clipsim"])
    assert r.exit_code == 2 and "--metric" in r.output and "psnr, ssim, lpips" in " ".join(r.output.split())
    r = CliRunner().invoke(_app(), ["eval", str(cached), "--against", str(tmp_path / "nowhere")])
    assert r.exit_code == 2 and "--against" in r.output and "manifest.json" in r.output
    taller = make_synthetic_run(tmp_path / "taller", prompts=PROMPTS, frames=4, height=48, width=56)
    r = CliRunner().invoke(_app(), ["eval", str(cached), "--against", str(taller), "-m", "psnr"])
    assert r.exit_code == 2 and "--against" in r.output and "height differs" in r.output
    assert "against" not in json.loads((cached / "metrics.json").read_text()) or \
        "taller" not in json.loads((cached / "metrics.json").read_text())["against"]


def test_the_report_shows_the_against_table(pair):
    from sagegen.report.builder import build_report

    cached, plain = pair
    res = CliRunner().invoke(_app(), ["eval", str(cached), "--against", str(plain), "-m", "psnr"])
    assert res.exit_code == 0, res.output
    html = build_report(cached, log=lambda s: None)["html"].read_text()
    assert "Against plain" in html and "sage~sdpa" in html
