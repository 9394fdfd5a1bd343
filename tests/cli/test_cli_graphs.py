"""`--cuda-graphs` on run / compare: usage errors (exit 2, before any model loads), and a tiny compare on the CPU
with the recording capture stand-in of test_patch_graphs: both variants run under the graph wrapper and the
manifest says what it did."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner


from sagegen.cli import jobs
from sagegen.cli.app import app
from sagegen.patch import graphs

pytestmark = pytest.mark.usefixtures("isolated")  # tests/support/cli_fakes.py

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


@pytest.fixture
def graphs_on_the_cpu(monkeypatch):
    """CUDA graphs as on a GPU (the recording capture stand-in of test_patch_graphs); the device stays the CPU."""
    from tests.patch.test_patch_graphs import recording_capture

    monkeypatch.setattr(graphs, "on_gpu", lambda t: True)
    monkeypatch.setattr(graphs, "capture", recording_capture)
    monkeypatch.setattr(jobs, "_check_device", lambda device: True)


def test_compare_with_cuda_graphs_replays_both_variants(tmp_path, graphs_on_the_cpu):
    out = tmp_path / "cmp"
    r = runner.invoke(app, ["compare", "tiny-sd3", "--prompt", "a", "--seed", "0-1", "--steps", "2",
                            "--device", "cpu", "--cuda-graphs", "--out", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["runtime"]["cuda_graphs"] is True
    for variant in ("sdpa", "sage"):
        info = manifest["setup"][variant]["rank0"]["cuda_graphs"]
        assert info["graphs"] == 1 and info["calls"]["captured"] == 1 and info["calls"]["replayed"] >= 4, info


@pytest.mark.parametrize("video, linear, extra, expected", [
    (False, "fp8", {}, True),
    (False, None, {}, False),                      # attention only: not host-bound enough to matter
    (True, "fp8", {}, False),                      # videos are GPU-bound
    (False, "fp8", {"on_gpu": False}, False),
    (False, "fp8", {"compile": True}, False),
    (False, "fp8", {"offload": "model"}, False),
    (False, "fp8", {"cp": object()}, False),
    (False, "fp8", {"sparse": object()}, False),
    (False, "fp8", {"cache": "taylorseer=3"}, False),  # graphs would step aside for every cached call
])
def test_graphs_by_default_only_for_eager_fp8_image_runs_on_a_gpu(video, linear, extra, expected):
    class Preset:
        is_video = video

    kw = dict(linear=linear, compile=False, offload="none", cp=None, sparse=None, on_gpu=True) | extra
    assert jobs.graphs_by_default(Preset(), **kw) is expected


@pytest.mark.parametrize("flag, expected", [([], True), (["--no-cuda-graphs"], False)])
def test_run_with_fp8_linears_on_an_image_model_takes_cuda_graphs_unless_told_not_to(tmp_path, graphs_on_the_cpu,
                                                                                     flag, expected):
    """Without --cuda-graphs/--no-cuda-graphs, an FP8 image run on a GPU replays its denoiser calls as graphs and
    says so in a note; --no-cuda-graphs keeps it eager (the manifest records which)."""
    out = tmp_path / "run"
    r = runner.invoke(app, ["run", "tiny-sd3", "--prompt", "a", "--steps", "2", "--linear", "fp8", "--device", "cpu",
                            *flag, "--out", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    assert ("note: CUDA graphs are on" in r.output) is expected and "warning: CUDA graphs" not in r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["runtime"]["cuda_graphs"] is expected
    info = manifest["setup"]["sage"]["rank0"].get("cuda_graphs")
    assert (info is not None and info["calls"]["captured"] == 1) is expected, info


def test_a_graph_run_counts_its_attention_calls_as_an_eager_run_does(tmp_path, graphs_on_the_cpu):
    """The manifest's attention calls (the timed samples') under CUDA graphs equal the eager run's: replays
    add what their capture counted (a graph run once listed none)."""
    calls = {}
    for name, flag in (("graphs", "--cuda-graphs"), ("eager", "--no-cuda-graphs")):
        out = tmp_path / name
        r = runner.invoke(app, ["run", "tiny-sd3", "--prompt", "a", "--steps", "3", "--device", "cpu", flag,
                                "--out", str(out), "--quiet"])
        assert r.exit_code == 0, r.output
        setup = json.loads((out / "manifest.json").read_text())["setup"]["sage"]["rank0"]
        calls[name] = setup["attention_calls"]
    assert calls["eager"].get("processor_calls", 0) > 0, calls
    assert calls["graphs"] == calls["eager"]


@pytest.mark.parametrize("flag", [[], ["--cuda-graphs"]])
def test_a_step_cache_keeps_graphs_off_by_default_and_makes_asked_for_graphs_step_aside(tmp_path, graphs_on_the_cpu,
                                                                                       flag):
    """With --cache the FP8 image run does not take graphs by default; asked for, graphs say they step aside and
    the manifest counts every denoiser call as eager:step_cache (a replay would repeat one step's skips)."""
    out = tmp_path / "run"
    r = runner.invoke(app, ["run", "tiny-flux", "--prompt", "a", "--steps", "4", "--linear", "fp8", "--device",
                            "cpu", "--cache", "taylorseer=2", *flag, "--out", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["runtime"]["cuda_graphs"] is bool(flag)
    assert "note: CUDA graphs are on" not in r.output
    assert ("--cuda-graphs with --cache" in r.output) is bool(flag)
    info = manifest["setup"]["sage"]["rank0"].get("cuda_graphs")
    if flag:
        assert set(info["calls"]) == {"eager:step_cache"} and info["calls"]["eager:step_cache"] >= 4, info
    else:
        assert info is None
