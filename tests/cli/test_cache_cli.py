"""`--cache` on the CLI: usage errors (exit 2, before loading), and `compare --cache` on a tiny model writing the
realised schedule of both variants into the manifest and the HTML report."""

import re

import pytest
from typer.testing import CliRunner

from sagegen.cli.app import app
from sagegen.runs.directory import RunDir

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("isolated")


@pytest.mark.parametrize("args,match", [
    (["run", "tiny-wan2.1", "-p", "x", "--cache", "lru=2"], "write one of fbcache=THRESHOLD"),
    (["compare", "tiny-wan2.1", "-p", "x", "--cache", "fbcache=-1"], "must be > 0"),
    (["run", "tiny-wan2.1", "-p", "x", "--cache", "magcache=/nonexistent/m.json"], "no such file"),
    (["run", "tiny-wan2.1", "-p", "x", "--cache", "taylorseer=interval:0"], "must be >= 1"),
])
def test_cache_usage_errors_exit_2(args, match, fake_model):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert "--cache" in r.output and re.search(match, r.output), r.output
    assert fake_model.loads == []


def test_magcache_file_for_other_steps_exits_2(tmp_path, fake_model):
    import json

    ratios = tmp_path / "mag.json"
    ratios.write_text(json.dumps([1.0, 0.98, 0.97]))
    r = runner.invoke(app, ["run", "tiny-wan2.1", "-p", "x", "--steps", "4", "--cache", f"magcache={ratios}"])
    assert r.exit_code == 2 and "holds 3 ratios" in r.output, r.output
    assert fake_model.loads == []


def test_compare_cache_records_the_schedule_in_manifest_and_report(tmp_path):
    out = tmp_path / "run"
    r = runner.invoke(app, ["compare", "tiny-wan2.1", "-p", "a red fox", "--steps", "5", "--warmup", "0",
                            "--backend", "reference", "--cache", "taylorseer=interval:2,warmup:1", "--quiet",
                            "--out", str(out)])
    assert r.exit_code == 0, r.output
    manifest = RunDir(out).manifest
    assert manifest["settings"]["cache"] == {"kind": "taylorseer", "interval": 2, "order": 1, "warmup": 1}
    schedules = {}
    for variant in ("sdpa", "sage"):
        cache = manifest["setup"][variant]["rank0"]["cache"]
        sched = cache["schedule"]
        assert sched["calls"] == 10  # 5 steps, guidance in two calls
        assert sched["blocks"] == [sched["blocks_per_call"]] * 10
        assert 0 < sched["attention_work"] < 1, sched  # some calls predicted their attention
        schedules[variant] = sched["attention"]
    assert schedules["sdpa"] == schedules["sage"]  # a fixed schedule: the same calls computed either way
    r = runner.invoke(app, ["report", str(out)])
    assert r.exit_code == 0, r.output
    html = (out / "report" / "report.html").read_text()
    assert "Step cache" in html and "attention modules computed" in html


def test_calibrate_magcache_then_run_with_it(tmp_path):
    """`calibrate --cache magcache` writes one ratio per step (the first 1.0) from sagegen-patched uncached
    generations; `compare --cache magcache=FILE` takes the file at the same steps."""
    import json

    path = tmp_path / "mag.json"
    r = runner.invoke(app, ["calibrate", "tiny-wan2.1", "-p", "a red fox", "--seed", "0-1", "--steps", "4",
                            "--backend", "reference", "--cache", "magcache", "--out", str(path)])
    assert r.exit_code == 0, r.output
    data = json.loads(path.read_text())
    assert data["steps"] == 4 and len(data["mag_ratios"]) == 4 and data["mag_ratios"][0] == 1.0
    assert data["runs"] == 2 and set(data["streams"]) == {"0", "1"}  # Wan: conditional and unconditional calls
    assert all(r > 0 for r in data["mag_ratios"])
    out = tmp_path / "run"
    r = runner.invoke(app, ["run", "tiny-wan2.1", "-p", "a red fox", "--steps", "4", "--warmup", "0",
                            "--backend", "reference", "--cache", f"magcache={path}", "--quiet", "--out", str(out)])
    assert r.exit_code == 0, r.output
    sched = RunDir(out).manifest["setup"]["sage"]["rank0"]["cache"]["schedule"]
    assert sched["calls"] == 8 and sched["blocks"][0] == sched["blocks_per_call"]
