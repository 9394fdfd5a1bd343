"""The run's record of FP8 linears: the sage variant patches with ``linear=job.linear`` and records which
layers ran FP8 in its setup; the manifest names the mode; the run-directory digest changes only with it."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sagegen.jobs.ranks import DistInfo
from sagegen.jobs.generate import Job, attention, make_samples
from sagegen.linear import FP8Linear
from sagegen.runs.manifest import build_manifest
from sagegen.models import arch as archs
from sagegen.models.presets import resolve


def _job(**kw):
    preset = resolve("tiny-sd3")
    return Job(preset=preset, settings={"steps": 2}, samples=make_samples(["a"], [0]), variants=["sage"],
               device="cpu", **kw)


def test_sage_variant_with_fp8_linears_records_them_and_unpatches():
    model = archs.build_transformer("sd3.5-medium", dtype=torch.bfloat16, device="cpu", seed=0,
                                    config_overrides=dict(archs.smoke_overrides("sd3.5-medium"), num_layers=3))
    pipe = SimpleNamespace(transformer=model)
    setup: dict = {}
    with attention(pipe, "sage", _job(linear="fp8"), setup):
        swapped = [n for n, m in model.named_modules() if isinstance(m, FP8Linear)]
        assert swapped and all(n.startswith("transformer_blocks.1.") for n in swapped)  # first/last kept
    assert setup["linear"]["fp8_layer_count"] == len(swapped)
    assert sorted(setup["linear"]["fp8_layers"]) == sorted(swapped)
    assert not any(isinstance(m, FP8Linear) for m in model.modules())


def test_manifest_and_digest_name_the_linear_mode():
    dist = DistInfo()
    plain, fp8 = _job(), _job(linear="fp8")
    assert plain.digest() != fp8.digest()
    assert _job(linear=None).digest() == plain.digest()
    assert build_manifest(fp8, dist, torch.device("cpu"))["attention"]["linear"] == "fp8"
    assert build_manifest(plain, dist, torch.device("cpu"))["attention"]["linear"] is None
