"""sagegen on the diffusers versions it supports: each with the locked stack of its era, installed beside the
suite's own by `make test-diffusers` (tests/support/diffusers_versions.py --install-only), checked by
tests/support/diffusers_compat.py in a subprocess. The checks never install: a version not installed is skipped, with
the command that installs it."""

from __future__ import annotations

import pytest
import torch

from tests.support import diffusers_compat
from tests.support import diffusers_versions
# What each version must give (measured 2026-12-03 on the locked stacks): the backend's status, the checks that
# must pass, the model classes that version lacks, and the models whose test inputs (written for 0.42) its forward
# rejects.
EXPECTED = {
    "0.35.2": ("unavailable", 9, {"ltx-2", "hunyuanvideo-1.5", "flux.2"}, {"qwen-image"}),
    "0.36.0": ("ok", 12, {"ltx-2"}, {"qwen-image"}),
    "0.37.1": ("ok", 14, set(), set()),
    "0.38.0": ("ok", 14, set(), set()),
    "0.39.0": ("ok", 14, set(), set()),
    "0.40.0": ("ok", 14, set(), set()),
    "0.41.0": ("ok", 14, set(), set()),
    "0.42.1": ("ok", 14, set(), set()),
}


def test_every_locked_version_has_its_expectation():
    assert tuple(EXPECTED) == diffusers_versions.DEFAULT_VERSIONS


@pytest.mark.diffusers_matrix
@pytest.mark.timeout(900)
@pytest.mark.parametrize("version", list(EXPECTED))
def test_older_diffusers(version):
    if diffusers_versions.installed(version) is None:
        pytest.skip(f"diffusers {version} is not installed beside .venv (make test-diffusers installs it)")
    res = diffusers_versions.check(version)
    assert "error" not in res, res.get("error")
    # hermetic: the run saw its own era's stack, exactly as locked
    locked = diffusers_versions.lock.read_pins(diffusers_versions.lock_path(version))
    for package in ("diffusers", "transformers", "huggingface-hub"):
        assert res["environment"][package] == locked[package], (package, res["environment"], locked[package])
    s = res["summary"]
    backend, ok, absent, not_checked = EXPECTED[version]
    assert s["failed"] == [], [r for r in res["rows"] if r["status"] == "failed"]
    assert s["backend"] == backend and s["ok"] == ok
    assert {c.split(":")[1] for c in s["absent"]} == absent
    assert {c.split(":")[1] for c in s["not_checked"]} == not_checked
    if backend == "unavailable":
        assert "attention backend in diffusers" in res["rows"][0]["why"]


def test_the_check_fails_an_unrouted_or_unexact_model():
    """The compatibility check must be able to fail: a 'patch' that changes nothing, or an unpatch that leaves
    the model changed, is a failure."""
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    row = diffusers_compat._patched_vs_stock("model:none", lin, lambda: lin(x), 0.03)
    assert row["status"] == "failed"  # nothing routed, output equal to stock
    row = diffusers_compat._patched_vs_stock("model:broken", lin, lambda: (_ for _ in ()).throw(KeyError("x")), 0.03)
    assert row["status"] == "not checked" and "stock forward" in row["why"]


def test_bad_versions_are_a_usage_error(capsys):
    assert diffusers_versions.main(["0.41"]) == 2
    assert "versions must look like 0.41.0" in capsys.readouterr().err
