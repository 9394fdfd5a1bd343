"""The markers select what they say: `-m gpu` is exactly the GPU suite (tests/test_gpu*.py), and on a machine
without CUDA each of those is skipped, never run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def _collect(*args: str) -> set[str]:
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "-p", "no:xdist", *args], cwd=TESTS.parent, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {line for line in r.stdout.splitlines() if "::" in line}


@pytest.mark.slow
def test_the_gpu_marker_selects_exactly_the_gpu_files():
    gpu_files = sorted(str(p.relative_to(TESTS.parent)) for p in TESTS.rglob("test_gpu*.py"))
    in_files = _collect(*gpu_files)
    selected = _collect("-m", "gpu", *gpu_files, "tests/test_markers.py", "tests/test_lock.py")
    assert len(in_files) > 100
    assert selected == in_files, (sorted(in_files - selected)[:10], sorted(selected - in_files)[:10])


def test_gpu_tests_skip_without_cuda(request, pytestconfig):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs them")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-rs",
                        "tests/patch/test_gpu_graphs.py"], cwd=TESTS.parent, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "needs a CUDA GPU" in r.stdout and " passed" not in r.stdout, r.stdout[-2000:]
