"""The time-to-video benchmark (`sagegen.jobs.e2ebench`) on a tiny pipeline on the CPU: every variant's phases
timed apart, the cached variants' realised schedule, torchao reported as skipped where it does not import."""

import json

import pytest

from sagegen.cli import e2e_bench as e2ebench

pytestmark = pytest.mark.usefixtures("isolated")


def test_e2e_report_times_each_phase_per_variant(tmp_path):
    out = tmp_path / "e2e.json"
    report = e2ebench.main(["tiny-wan2.1", "--steps", "4", "--warmup-steps", "1", "--compile", "none",
                            "--backend", "reference", "--cache", "taylorseer=interval:2,warmup:1",
                            "--variants", "stock,sagegen,torchao", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    results = report["results"]
    assert set(results) == {"stock", "sagegen", "torchao", "stock_cache", "sagegen_cache", "torchao_cache"}
    for name in ("stock", "sagegen", "stock_cache", "sagegen_cache"):
        r = results[name]
        assert r["finite"] and all(r[k] >= 0 for k in ("encode_s", "denoise_s", "decode_s", "save_s"))
        assert r["total_s"] == pytest.approx(r["encode_s"] + r["denoise_s"] + r["decode_s"] + r["save_s"], abs=1e-5)
        assert r["warmup_s"] > 0 and r["speedup_vs_stock"] > 0
    for name in ("stock_cache", "sagegen_cache"):
        sched = results[name]["cache"]["schedule"]
        assert sched["calls"] == 8 and 0 < sched["attention_work"] < 1  # the timed run alone (4 steps x 2 calls)
    assert results["stock_cache"]["cache"]["schedule"]["attention"] == results["sagegen_cache"]["cache"][
        "schedule"]["attention"]
    try:
        import torchao  # noqa: F401
    except ImportError:
        assert "torchao does not import" in results["torchao"]["skipped"]
    assert report["device"] and report["versions"]["torch"]


def test_unknown_variant_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as e:
        e2ebench.main(["tiny-wan2.1", "--variants", "stock,fast", "--out", str(tmp_path / "x.json")])
    assert e.value.code == 2


def test_sagegen_bench_e2e_runs_the_time_to_video_benchmark(tmp_path):
    from typer.testing import CliRunner

    from sagegen.cli.app import app

    out = tmp_path / "e2e.json"
    r = CliRunner().invoke(app, ["bench", "tiny-wan2.1", "--e2e", "--steps", "2", "--warmup-steps", "1", "--compile",
                                 "none", "--backend", "reference", "--variants", "stock", "--cache",
                                 "taylorseer=interval:2,warmup:1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert set(json.loads(out.read_text())["results"]) == {"stock", "stock_cache"}


@pytest.mark.parametrize("argv, match", [
    (["bench", "tiny-wan2.1", "--cache", "taylorseer=2"], "add --e2e"),
    (["bench", "tiny-wan2.1", "--e2e", "--cache", "nosuch=1", "--out", "x.json"], "--cache"),
    (["bench", "tiny-wan2.1", "--e2e", "--variants", "fast", "--out", "x.json"], "--variants"),
])
def test_sagegen_bench_cache_and_e2e_usage_errors_exit_2(argv, match):
    from typer.testing import CliRunner

    from sagegen.cli.app import app

    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 2, r.output
    assert match in r.output
