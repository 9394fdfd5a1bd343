"""`CachedLaunch` (CPU): the key separates everything Triton specializes on, parameters are ordered as the
kernel declares them, and unsupported setups take Triton's own launch. The GPU half (same kernel as Triton
picks, bit-identical results) is in tests/test_gpu_launch.py."""

from __future__ import annotations

import pytest
import torch
from triton.runtime.jit import JITFunction

from sagegen.kernels import launch
from sagegen.kernels.launch import CachedLaunch, _arg_key


def _kernel(X, Y, N, stride, BLOCK: "tl.constexpr", FLAG: "tl.constexpr"):  # noqa: F821 - never compiled here
    pass


def _jit():
    return JITFunction(_kernel)  # the compiled-path object, whatever TRITON_INTERPRET says


def test_arg_key_separates_what_triton_specializes_on():
    base = torch.empty(64, dtype=torch.bfloat16)
    assert _arg_key(base) == (torch.bfloat16, True)
    assert _arg_key(base[1:]) == (torch.bfloat16, False)           # 2-byte offset: not 16-byte aligned
    assert _arg_key(base[8:]) == (torch.bfloat16, True)
    assert _arg_key(base.float()) != _arg_key(base)
    assert _arg_key(1) != _arg_key(17) != _arg_key(32)             # == 1, neither, multiple of 16
    assert _arg_key(16) == _arg_key(48) and _arg_key(3) == _arg_key(5)
    assert _arg_key(2 ** 31) != _arg_key(2 ** 31 - 16) and _arg_key(2 ** 63) != _arg_key(2 ** 63 - 16)
    assert _arg_key(True) != _arg_key(1) and _arg_key(None) is None and _arg_key(0.5) == 0.5
    with pytest.raises(TypeError, match="unsupported argument type list"):
        _arg_key([1])


def test_key_orders_parameters_and_keys_constexprs_by_value(monkeypatch):
    monkeypatch.setattr(launch.torch.cuda, "current_device", lambda: 0)
    cl = CachedLaunch(_jit())
    assert cl.names == ["X", "Y", "N", "stride", "BLOCK", "FLAG"] and cl.constexpr == [False] * 4 + [True] * 2
    x = torch.empty(64)
    k16, values = cl.key((x, x, 64, 1), dict(BLOCK=16, FLAG=False, num_warps=4))
    assert values == [x, x, 64, 1, 16, False]
    k32, _ = cl.key((x, x, 64, 1), dict(BLOCK=32, FLAG=False, num_warps=4))
    assert k16 != k32                                              # both multiples of 16: told apart by value
    assert cl.key((x, x), dict(N=64, stride=1, BLOCK=16, FLAG=False, num_warps=4))[0] == k16  # by name
    assert cl.key((x, x, 64, 1), dict(BLOCK=16, FLAG=False, num_warps=8))[0] != k16           # options
    assert cl.key((x, x, 80, 1), dict(BLOCK=16, FLAG=False, num_warps=4))[0] == k16           # same class
    assert cl.key((x, x, 65, 1), dict(BLOCK=16, FLAG=False, num_warps=4))[0] != k16
    with pytest.raises(KeyError):
        cl.key((x, x, 64), dict(BLOCK=16, FLAG=False))


def test_unsupported_setups_take_tritons_launch(monkeypatch):
    calls = []

    class Fake:
        params = None

        def __getitem__(self, grid):
            return lambda *a, **k: calls.append((grid, a, k)) or "launched"

    cl = CachedLaunch(Fake())                                      # no params: an interpreted kernel
    assert not cl.enabled and cl((3,), 1, 2, B=4) == "launched" and calls == [((3,), (1, 2), {"B": 4})]
    monkeypatch.setattr(launch.triton, "__version__", "3.10.0")
    assert not launch._version_ok()
    monkeypatch.setattr(launch.triton, "__version__", "3.6.0")
    assert launch._version_ok()
