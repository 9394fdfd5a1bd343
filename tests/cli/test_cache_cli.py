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
