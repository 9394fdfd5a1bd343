"""Constants and the mask description shared by both implementations (the numerics' contract).

Neither implementation imports the other; both import this.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
FP8_MAX = 448.0  # largest finite float8 e4m3fn
# GELU rows' amax floor for FP8 (sagegen.linear.numerics): above max |GELU_tanh(x)| over x < 0, 0.17004 at
# x ~ -0.752, and exact in every float dtype
GELU_AMAX_FLOOR = 0.171875
INT8_MAX = 127.0
EPS = 1e-8  # a zero row/block/channel still gets a finite scale
LOG2_FP8_MAX = math.log2(FP8_MAX)
# An FP8 attention output's scale is (V's bound) x this / 448 (kernels/fp8_out.py): P·V runs on e4m3 P, each
# value at most 2^-4 above the exact one, so a row's output can exceed V's range by that much.
FP8_OUT_MARGIN = 1.0625
# P is quantized relative to its own key block's row max (the block's largest value lands exactly on 448),
# as long as that max is within REF_WINDOW (log2 units) of the running max; acc and l follow that reference.
REF_WINDOW = 8.0
# The fast path computes P as exp2(x * row_scale - shift) in one FMA, with x = 12582912 + score (the int32
# score read as fp32 through a magic offset) and one shift per row, ~12582912 * row_scale: in fp32 that holds
# the reference only to its ulp, ~1.5 * row_scale log2 units (row_scale = q_scale * k_scale * sm_scale *
# log2 e per integer step of the score: ~1e-4 for unit-variance inputs). The kernels carry the reference the
# shift really subtracts into acc, l and the lse, so the result stays consistent; a block's largest P lands
# within 2^(1.5 ulp) of 448 instead of on it. Past |q|max * |k|max ~ 1e4 that ulp nears a binade and P's max
# can saturate the FP8 cast (error 0.05 -> ~0.3 at 1e5 in the tests' sweep); ~1e2 is typical of Q/K-normed
# diffusion models.
# Smoothing means (K's, and V's with smooth_v) are taken over at most SAMPLE_TOKENS keys, evenly spaced:
# key (t * N) // SAMPLE_TOKENS for t < SAMPLE_TOKENS (every key when N <= SAMPLE_TOKENS), live keys only
# under a key-padding mask. Subtracting any per-channel vector is exact (softmax ignores a per-row constant;
# V's is added back), so the vector only has to be near the mean; sampling spares the quantization pass a
# whole read of K. V's FP8 scale still covers every key.
SAMPLE_TOKENS = 1024
# fp16 P·V (``pv_precision="fp16"``): V, after any smoothing, is cast to fp16 for the tensor cores, whose range
# ends at 65504, while bf16 V can hold ~3e38. Every (batch, kv head, channel) of V gets a power-of-two scale
# 2^k, k the smallest integer >= 0 with max |V| / 2^k < 2^FP16_V_EXP: V is multiplied by 2^-k before the cast
# and the output by 2^k after P·V, both exact. k comes from the fp32 exponent bits of that max (the same
# integer ops in the emulation and the kernels), so k = max(0, biased exponent - 127 - (FP16_V_EXP - 1)),
# and 0 for a non-finite max (a NaN or inf in V then reaches its channel's output, as on the FP8 path).
# Below 2^15 that is k = 0 and scale 1: the same bits as without the scale. The scale costs the fp16 path
# the read of V that the FP8 path makes anyway for its scales (the statistics launch).
FP16_V_EXP = 15

# Pick tiles, launch settings and kernel variants as on another GPU generation, e.g. "8.9" (Ada) or "8.0"
# (Ampere), while the code still runs on this card: how the variants are tested on a Hopper GPU. Triton keeps
# compiling for the real device.
CAPABILITY_ENV = "SAGEGEN_CAPABILITY"


def hadamard_signs(d: int) -> list[float]:
    """The ±1 diagonal of ``SageConfig.qk_rotation="hadamard"`` for head dim ``d`` (a power of two): a fixed
    draw (seed 0), the same for Q and K of every call, in the emulation and the kernels."""
    import torch

    if d < 2 or d & (d - 1):
        raise ValueError(f"SageConfig.qk_rotation='hadamard' needs a power-of-two head dim (32, 64, 128); got {d}")
    draw = torch.randint(0, 2, (d,), generator=torch.Generator().manual_seed(0))
    return [float(2 * int(x) - 1) for x in draw]


def cdiv(a: int, b: int) -> int:
    """ceil(a / b), for host code: `triton.cdiv` became a ConstexprFunction (~2 us a call from Python), and an
    attention call made a dozen such calls."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1), for host code (as `cdiv`)."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


def capturing() -> bool:
    """Whether this thread's current CUDA stream is being captured into a CUDA graph (where a host sync fails)."""
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def device_capability(device: torch.device) -> tuple[int, int]:
    """The compute capability sagegen plans for: the device's, or SAGEGEN_CAPABILITY ("major.minor")."""
    forced = os.environ.get(CAPABILITY_ENV)
    if forced:
        major, _, minor = forced.partition(".")
        if not (major.isdigit() and (minor.isdigit() or not minor)):
            raise ValueError(f"{CAPABILITY_ENV}={forced!r}: expected a compute capability such as '8.9' or '9.0'")
        return int(major), int(minor or 0)
    if device is None or device.index is None:  # "the current device", which can change: not cached
        return tuple(torch.cuda.get_device_capability(device))
    return _cuda_capability(device.index, torch.cuda.get_device_capability)


@functools.lru_cache(maxsize=None)
def _cuda_capability(index: int, query) -> tuple[int, int]:
    # torch's query costs ~9 us of host time, and an attention call made several; keyed on the query function
    # too, so that a replaced one (tests) is never served another's answer
    return tuple(query(index))


@dataclass
class MaskSpec:
    """A mask normalised by `sagegen.api`.

    kind:
      - ``"none"``
      - ``"key"``: ``tensor`` is an fp32 additive bias [B, Nk] in natural-log units (-inf = masked): a
        key-padding mask, applied per key inside the kernel without materialising Nq×Nk.
      - ``"bool"``: ``tensor`` is bool, broadcastable to [B, H, Nq, Nk], True = attend.
      - ``"additive"``: ``tensor`` is float, broadcastable to [B, H, Nq, Nk], added to the scaled scores.
    """

    kind: str = "none"
    tensor: torch.Tensor | None = None


def value_checks_allowed() -> bool:
    """Whether code may read tensor values on the host (mask simplifications): not while dynamo traces, and
    not while a CUDA graph is being captured, where a host sync fails the capture (the checks are skipped:
    the unsimplified path computes the same result)."""
    if torch.compiler.is_compiling():
        return False
    return not capturing()
