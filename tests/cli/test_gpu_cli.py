"""The CLI on a CUDA GPU: `sagegen run` with FP8 linears on an image model takes CUDA graphs by default (a
note says so) and its images match the same run kept eager with --no-cuda-graphs."""

from __future__ import annotations

import json

import numpy as np
from PIL import Image
from typer.testing import CliRunner

from tests.conftest import gpu
from sagegen.cli.app import app
from sagegen.runs.directory import RunDir

pytestmark = gpu


def _run(out, *flags):
    r = CliRunner().invoke(app, ["run", "tiny-sd3", "--prompt", "a red fox in the snow", "--seed", "0-1", "--steps",
                                 "4", "--linear", "fp8", "--device", "cuda", *flags, "--out", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    rd = RunDir(out)
    images = [np.asarray(Image.open(rd.image_path("sage", sid)), dtype=np.int16) for sid in rd.sample_ids("sage")]
    return r.output, manifest, images


def test_fp8_image_run_replays_cuda_graphs_by_default_and_matches_eager(tmp_path):
    output, manifest, graphed = _run(tmp_path / "auto")
    assert "note: CUDA graphs are on" in output
    assert manifest["runtime"]["cuda_graphs"] is True
    calls = manifest["setup"]["sage"]["rank0"]["cuda_graphs"]["calls"]
    assert calls.get("captured") == 1 and calls.get("replayed", 0) >= 4, calls
    output, manifest, eager = _run(tmp_path / "eager", "--no-cuda-graphs")
    assert manifest["runtime"]["cuda_graphs"] is False and "CUDA graphs are on" not in output
    assert len(graphed) == len(eager) == 2
    # replays answer each call as eager would (a stale input would give another seed's image: the two seeds'
    # images differ by far more than the bound)
    assert np.abs(eager[0] - eager[1]).mean() > 5 * 1.5  # ~20 on the CPU
    for a, b in zip(graphed, eager):
        assert a.shape == b.shape and np.abs(a - b).mean() <= 1.5, np.abs(a - b).mean()
