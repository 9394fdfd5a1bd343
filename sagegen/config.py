"""`SageConfig`: the numerics of one `sageattn` call, as a small frozen object.

Both implementations (the PyTorch emulation in `kernels/reference.py` and the Triton kernels in
`kernels/triton_*.py`) read their numerics from here and nowhere else, so the emulation can be an exact
oracle for the kernel.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

Granularity = Literal["per_token", "per_block"]
PVPrecision = Literal["fp8", "fp16"]
PVAccum = Literal["fp32", "fp22"]
Fallback = Literal["sdpa", "reference", "error"]
QKRotation = Literal["none", "hadamard"]
QKPrecision = Literal["int8", "fp8"]

# Tile sizes are part of the numerics: per-block K scales, the smooth-Q blocks and the per-block rescaling
# of P all follow them, so the emulation must use the same ones as the kernel.
# 64 query rows x 128 keys measured fastest on an H200 at head dims 64 and 128 (bench/results/).
DEFAULT_BLOCKS: dict[int, tuple[int, int]] = {32: (64, 128), 64: (64, 128), 96: (64, 128), 128: (64, 128)}
SUPPORTED_HEAD_DIMS = tuple(sorted(DEFAULT_BLOCKS))
# Ada / Ampere (mma.sync, no wgmma): 128 x 64 tiles with two warpgroups compile without register spills for
# sm_80/86/89 at head dims 64 and 128 (bench/compile_check.py), where 64 x 128 spills. Not measured on such GPUs.
PRE_HOPPER_BLOCKS = (128, 64)

_CHOICES = {
    "q_granularity": ("per_token", "per_block"),
    "k_granularity": ("per_token", "per_block"),
    "pv_precision": ("fp8", "fp16"),
    "pv_accum": ("fp32", "fp22"),
    "fallback": ("sdpa", "reference", "error"),
    "qk_rotation": ("none", "hadamard"),
    "qk_precision": ("int8", "fp8"),
}
# Numerics the emulation has and the kernels do not yet (issue 58's study): `choose` runs the emulation for them.
EMULATION_ONLY = {"pv_accum": "fp22", "qk_precision": "fp8"}
# Fields added after runs were fingerprinted: left out of to_dict() at their defaults, so those runs resume.
_LATER_FIELDS = {"qk_rotation": "none", "qk_precision": "int8"}


@dataclass(frozen=True)
class SageConfig:
    """Numerics of SageAttention2-style quantized attention.

    Fields:
        q_granularity: INT8 scale granularity of Q. ``"per_token"`` (default) gives every query row its own
            scale; it costs nothing in the kernel because it folds into the per-row softmax scale.
            ``"per_block"`` shares one scale per ``block_q`` rows (upstream SageAttention's coarsest mode).
        k_granularity: INT8 scale granularity of K. ``"per_block"`` (default): one scale per ``block_k`` keys
            of the smoothed K (smoothing makes K's rows similar, so this is nearly as accurate as per-token).
            ``"per_token"`` gives each key its own scale at one extra multiply per score.
        smooth_k: subtract K's per-channel mean over tokens before quantizing (default True). Softmax is
            invariant to it; the log-sum-exp gets the exact correction added back. The mean is taken over
            at most 1,024 evenly spaced keys (``spec.SAMPLE_TOKENS``): any vector near the mean smooths as
            well, and the pass saves a whole read of K.
        smooth_q: subtract the per-block mean of Q before quantizing and add the exact correction
            ``mean(Q_block) · Kᵀ`` back to the scores (default False: costs an extra GEMV per block).
        smooth_v: subtract V's per-channel mean (sampled like K's) before the FP8 cast and add it back to
            the output (default False here; the diffusion patcher turns it on). Cuts the error when V carries a bias.
        pv_precision: ``"fp8"`` (default; e4m3 P and V, needs sm89+) or ``"fp16"`` (P·V in fp16 with an fp32
            accumulator, for Ampere). fp16 V is scaled by a power of two per channel where it would overflow
            fp16 (bf16 V past 2^15; exact, ``kernels/spec.py`` FP16_V_EXP), at the cost of one read of V.
        pv_accum: ``"fp32"`` (default): two-level accumulation, each block's P·V starts from zero and is
            added into an FP32 accumulator, so the FP8 tensor cores' ~22-bit accumulator never spans more
            than one block. ``"fp22"`` emulates single-level FP22 accumulation over the whole sequence; it
            exists only in the emulation, to show what two-level accumulation buys.
        qk_rotation: ``"none"`` (default) or ``"hadamard"``: incoherent processing. Q and K (after smoothing) are
            multiplied by the same orthogonal matrix, a fixed random ±1 diagonal times the normalised
            Hadamard matrix, before quantization. Q·Kᵀ is unchanged in exact arithmetic; outlier channels are
            spread over all channels, so the quantization scales fit the bulk better. Head dims 32, 64 and 128
            (powers of two). The kernels turn Q and K in the quantization pass (a Walsh-Hadamard transform in
            registers); Gluon's in-kernel Q quantization steps aside for it.
        qk_precision: ``"int8"`` (default, SageAttention2) or ``"fp8"``: Q and K in e4m3 with the same scale
            granularity (FlashAttention-3's FP8 Q·Kᵀ with block scales). Emulation only for now; its Q·Kᵀ sums
            in fp32, where Hopper's FP8 tensor cores keep fewer accumulator bits.
        fallback: what to do when the Triton kernel cannot run the call (no supported GPU, Triton missing):
            ``"sdpa"`` (default): PyTorch SDPA with a one-time warning; ``"reference"``: the emulation;
            ``"error"``: raise.
        block_q, block_k: tile sizes (rows of Q, keys of K) the numerics follow. ``None`` picks the
            default: 64 x 128 on Hopper (and in the emulation on CPU), 128 x 64 on Ada/Ampere.
    """

    q_granularity: Granularity = "per_token"
    k_granularity: Granularity = "per_block"
    smooth_k: bool = True
    smooth_q: bool = False
    smooth_v: bool = False
    pv_precision: PVPrecision = "fp8"
    pv_accum: PVAccum = "fp32"
    fallback: Fallback = "sdpa"
    qk_rotation: QKRotation = "none"
    qk_precision: QKPrecision = "int8"
    block_q: int | None = None
    block_k: int | None = None

    def __post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"SageConfig.{name}={value!r} is not allowed; choose one of {allowed}")
        for name in ("smooth_k", "smooth_q", "smooth_v"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"SageConfig.{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("block_q", "block_k"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value not in (16, 32, 64, 128, 256)):
                raise ValueError(f"SageConfig.{name}={value!r}: use None or one of 16, 32, 64, 128, 256")

    def blocks(self, head_dim: int, capability: tuple[int, int] | None = None) -> tuple[int, int]:
        """The (block_q, block_k) tile sizes used for ``head_dim`` on a GPU of ``capability`` (None: Hopper's,
        also what the emulation uses on CPU)."""
        if capability is not None and tuple(capability) < (9, 0):
            default_q, default_k = PRE_HOPPER_BLOCKS
        else:
            default_q, default_k = DEFAULT_BLOCKS.get(head_dim, (64, 128))
        return (self.block_q or default_q, self.block_k or default_k)

    def replace(self, **changes) -> "SageConfig":
        """A copy with some fields changed (the config is frozen)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for name, default in _LATER_FIELDS.items():
            if d[name] == default:
                del d[name]
        return d

    def emulation_only(self) -> list[str]:
        """The fields set to numerics only the emulation implements (``name=value``)."""
        return [f"{n}={v!r}" for n, v in EMULATION_ONLY.items() if getattr(self, n) == v]


DEFAULT_CONFIG = SageConfig()
# What the diffusion patcher uses by default: V-smoothing on (diffusion models' V carries large biases).
DIFFUSION_CONFIG = SageConfig(smooth_v=True)


def check_config(config) -> SageConfig:
    if config is None:
        return DIFFUSION_CONFIG
    if isinstance(config, SageConfig):
        return config
    if isinstance(config, dict):
        fields = {f.name for f in dataclasses.fields(SageConfig)}
        unknown = sorted(set(config) - fields)
        if unknown:
            raise ValueError(f"config has unknown SageConfig field(s) {unknown}; fields are {sorted(fields)}")
        return DIFFUSION_CONFIG.replace(**config)
    raise TypeError(f"config must be a sagegen.SageConfig, a dict of SageConfig fields or None, got "
                    f"{type(config).__name__}")
