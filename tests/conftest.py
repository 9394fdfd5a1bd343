"""Test setup: without CUDA, the Triton kernels run in Triton's interpreter on CPU tensors.

TRITON_INTERPRET must be set before any `@triton.jit` function is defined, so before sagegen's kernels load.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


@pytest.fixture
def seed():
    """Fresh random inputs every run: the seed is drawn, and printed on failure."""
    s = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(s)
    print(f"seed={s}")
    return s
