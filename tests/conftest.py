"""Test setup: without CUDA, the Triton kernels run in Triton's interpreter on CPU tensors.

TRITON_INTERPRET must be set before any `@triton.jit` function is defined, so before sagegen's kernels load.
"""

import importlib.util
import os
from pathlib import Path

import pytest
import torch

# Fixtures of the command-line tests (`fake_model`: a fake pipeline, no model loads; `isolated`: no HF cache, runs
# under tmp), used as `pytestmark = pytest.mark.usefixtures("isolated")` and a `fake_model` argument.
pytest_plugins = ["tests.support.cli_fakes"]

# No test reaches the network: the guard is on here and in every Python the tests start (offline/sitecustomize.py
# on PYTHONPATH), and the Hugging Face libraries are told to stay offline.
_OFFLINE = Path(__file__).resolve().parent / "offline"
os.environ.update(SAGEGEN_TESTS_OFFLINE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                  HF_HUB_DISABLE_TELEMETRY="1", PYTHONPATH=os.pathsep.join(
                      p for p in (str(_OFFLINE), os.environ.get("PYTHONPATH")) if p))
_guard_spec = importlib.util.spec_from_file_location("sagegen_network_guard", _OFFLINE / "sitecustomize.py")
_network_guard = importlib.util.module_from_spec(_guard_spec)
_guard_spec.loader.exec_module(_network_guard)  # installs it (SAGEGEN_TESTS_OFFLINE is set)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist the workers share the cores: PyTorch's CPU ops take each worker's share of them, instead of
# every worker starting a thread per core.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _workers))


def _interpreter_rounds_fma_once() -> bool:
    """tl.fma on the interpreter, at values where one rounding (x * y + z exact: 2^-11 + 2^-24) and two
    (the product rounded to 1 + 2^-11 first: 2^-11) differ."""
    import triton
    import triton.language as tl

    @triton.jit
    def fma_kernel(X, Y):
        x = tl.load(X + tl.arange(0, 2))
        tl.store(Y + tl.arange(0, 2), tl.fma(x, x, x * 0.0 - 1.0))

    x, y = torch.full((2,), 1.0 + 2.0**-12), torch.empty(2)
    fma_kernel[(1,)](x, y)
    return y[0].item() == 2.0**-11 + 2.0**-24


def _fuse_interpreter_fma() -> None:
    """Triton 3.8's interpreter computes tl.fma(x, y, z) as x * y + z in fp32, rounding twice; the GPU (and
    Triton 3.9's interpreter) rounds once. The attention kernel recovers the reference it really subtracted
    with an FMA (triton_attn._exp2_shift), so on such an interpreter its LSE drifts from the emulation by up
    to ~0.1 at large scores, which no GPU does. There the tests round once: fp32 products are exact in fp64,
    so an fp64 multiply-add and one cast to fp32 (a second rounding only at exact fp64 ties)."""
    if os.environ.get("TRITON_INTERPRET") != "1" or _interpreter_rounds_fma_once():
        return
    import numpy as np
    from triton.runtime import interpreter

    def create_fma(self, x, y, z):
        xd, yd, zd = np.broadcast_arrays(x.data, y.data, z.data)
        if zd.dtype != np.float32:
            return interpreter.TensorHandle(xd * yd + zd, z.dtype.scalar)
        wide = xd.astype(np.float64) * yd.astype(np.float64) + zd.astype(np.float64)
        return interpreter.TensorHandle(wide.astype(np.float32), z.dtype.scalar)

    interpreter.InterpreterBuilder.create_fma = create_fma
    assert _interpreter_rounds_fma_once()


_fuse_interpreter_fma()
HAS_CUDA = torch.cuda.is_available()
# The `gpu` marker selects the GPU suite (`pytest -m gpu`, on the device: docs/testing.md); without CUDA every test
# carrying it is skipped at collection (below).
gpu = pytest.mark.gpu


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)
# CPU tests whose Triton kernels (fused prologues, attention) run on CPU tensors: only in Triton's interpreter, which
# this file turns on where there is no GPU; on a GPU machine such tests skip (their GPU twins run there)
interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="runs Triton kernels on CPU tensors: needs TRITON_INTERPRET=1")


@pytest.fixture
def seed():
    """Fresh random inputs every run: the seed is drawn, and printed on failure. ``SAGEGEN_TEST_SEED=<n>``
    replays a failure's seed."""
    s = int(os.environ.get("SAGEGEN_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    torch.manual_seed(s)
    print(f"seed={s}")
    return s
