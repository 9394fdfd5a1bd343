"""`--cuda-graphs` on run / compare: usage errors (exit 2, before any model loads), and a tiny compare on the CPU
with the recording capture stand-in of test_patch_graphs: both variants run under the graph wrapper and the
manifest says what it did."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli_fakes import isolated  # noqa: F401 (fixture)

from sagegen.cli import jobs
from sagegen.cli.app import app
from sagegen.patch import graphs

runner = CliRunner()


@pytest.mark.parametrize("extra, match", [
    ([], "needs a CUDA device"),
    (["--compile"], "does not combine with --compile"),
    (["--sparse", "topk=0.5"], "does not combine with --sparse"),
])
def test_cuda_graphs_usage_errors(extra, match):
    r = runner.invoke(app, ["run", "tiny-sd3", "--prompt", "a", "--device", "cpu", "--cuda-graphs", *extra])
    assert r.exit_code == 2, r.output
    assert match in r.output and "--cuda-graphs" in r.output


def test_compare_with_cuda_graphs_replays_both_variants(tmp_path, monkeypatch):
    from test_patch_graphs import recording_capture

    monkeypatch.setattr(graphs, "on_gpu", lambda t: True)
    monkeypatch.setattr(graphs, "capture", recording_capture)
    monkeypatch.setattr(jobs, "_check_device", lambda device: True)  # the device stays the CPU
    out = tmp_path / "cmp"
    r = runner.invoke(app, ["compare", "tiny-sd3", "--prompt", "a", "--seed", "0-1", "--steps", "2",
                            "--device", "cpu", "--cuda-graphs", "--out", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["runtime"]["cuda_graphs"] is True
    for variant in ("sdpa", "sage"):
        info = manifest["setup"][variant]["rank0"]["cuda_graphs"]
        assert info["graphs"] == 1 and info["calls"]["captured"] == 1 and info["calls"]["replayed"] >= 4, info
