"""`LinearPolicy`: which ``nn.Linear`` layers of a denoiser run in FP8, and with which numerics.

Default: every ``nn.Linear`` inside the transformer's main blocks (the children of its top-level
``nn.ModuleList``s, as `sagegen.patch.precision_policy.main_blocks` finds them) except those of the first and the last
block. Everything outside the main blocks stays in bf16: the embedders (patch/time/text/guidance/pooled
projections, HunyuanVideo's token refiner), the output norm's modulation and the final projection.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import torch

from sagegen.linear import numerics, peft_layers
from sagegen.linear.module import OUTLIER_MODES

_GEMM_DIVISOR = 16  # cuBLASLt FP8: K and N must be multiples of 16
BF16_COPIES = ("cpu", "keep", "drop")


@dataclass(frozen=True)
class LinearPolicy:
    """How `sagegen.patch(..., linear="fp8")` chooses and runs FP8 linears.

    Fields:
        keep_blocks: main blocks whose linears stay in bf16, as in `PrecisionPolicy.blocks`: an ``int`` indexes
            the main blocks in execution order (negative from the end), a ``str`` is a module name or glob
            matched against each linear's name and its ancestors (``"*.ff.net.2"``, ``"*.norm1.linear"``).
            Default ``(0, -1)``: the first and the last block.
        include_outside_blocks: also quantize linears outside the main blocks (embedders, final projection).
            Default False.
        act_granularity: ``"per_token"`` (default; row-wise cuBLASLt) or ``"per_block"`` (1x128 blocks).
        weight_granularity: ``"per_channel"`` (default, pairs with per-token activations) or ``"per_block"``
            (128x128, pairs with per-block activations). cuBLASLt runs only these two pairings on the GPU.
        outliers: ``"off"`` (default), ``"smooth"`` or ``"split"`` (see `sagegen.linear.module`).
        outlier_ratio, max_outliers: the ``"split"`` detector: channel amax above ratio x median, at most this many.
        min_rows: calls with fewer tokens run the bf16 linear (default 1024). Below ~1k rows an FP8 layer
            (quantizer launch + ``_scaled_mm``, ~70 us of host time a call) costs more than the bf16 GEMM it
            replaces: back to back on an H200, FP8 wins from M = 1024 at 3072 x 12288 and 12288 x 3072, from
            M = 4096 at 3072 x 3072 (bench/results/archive/probe-fp8-eager-host-h200-2026-11-26.json). So the text
            streams of the image models (Flux 512, SD3.5 2 x 333, Qwen-Image ~128 tokens) and the modulation
            vectors stay bf16; their eager steps got faster (Flux 110.0 -> 106.1 ms, SD3.5 113.2 -> 104.6 ms).
        bf16_copies: where the original bf16 weights of the FP8 layers stay while patched.
            ``"cpu"`` (default): moved to host memory, so the GPU holds only the FP8 weights (GPU memory: -1 byte
            per quantized weight against the unpatched model; host memory: +2 bytes per quantized weight,
            ``patch_info(...)["linear"]["bf16_bytes_moved_to_cpu"]``); `unpatch` moves them back, bit for bit.
            ``"keep"``: they stay where they are (+1 byte per quantized weight on the GPU; patching costs no copy).
            ``"drop"``: freed (the meta device): nothing on the host either, and `unpatch` restores the
            dequantized FP8 weights (not the original bits; it warns). With ``"cpu"`` or ``"drop"``, calls below
            ``min_rows`` use the dequantized FP8 weight.
        fast_accum: cuBLASLt's fast FP8 accumulation for the row-wise GEMM (default True, as torchao's
            inference float8; False: the periodic promotion to fp32, slower). bench/bench_fp8_linear.py
            measures both, speed and error.
        fuse_gelu: where an FP8 linear is an MLP's second layer after diffusers' ``GELU(approximate="tanh")``
            (``FeedForward``: GELU, Dropout(0), Linear), the GELU runs inside the activation quantization
            (one read of the pre-GELU tensor instead of GELU's read+write and the quantizer's read). Default True:
            on an H100 the fused quantizer takes 0.57-0.80x the time of eager GELU + the plain quantizer at the
            models' MLP shapes (bench/results/archive/probe-gelu-quant-h100-2026-11-25.json; CogVideoX-5b step 1089 ->
            1069 ms). Its tanh differs from torch's in the last bits: ~1e-4 of the FP8 codes differ.
    """

    keep_blocks: tuple[int | str, ...] = (0, -1)
    include_outside_blocks: bool = False
    act_granularity: str = "per_token"
    weight_granularity: str = "per_channel"
    outliers: str = "off"
    outlier_ratio: float = 8.0
    max_outliers: int = 64
    min_rows: int = 1024
    bf16_copies: str = "cpu"
    fast_accum: bool = True
    fuse_gelu: bool = True

    def __post_init__(self) -> None:
        keep = self.keep_blocks
        keep = (keep,) if isinstance(keep, (int, str)) else tuple(keep)
        for b in keep:
            if isinstance(b, bool) or not isinstance(b, (int, str)) or (isinstance(b, str) and not b.strip()):
                raise TypeError(f"LinearPolicy.keep_blocks entries must be block indices (int) or module names "
                                f"(non-empty str), got {b!r}")
        object.__setattr__(self, "keep_blocks", keep)
        if self.act_granularity not in numerics.ACT_GRANULARITIES:
            raise ValueError(f"LinearPolicy.act_granularity={self.act_granularity!r}; use one of "
                             f"{numerics.ACT_GRANULARITIES}")
        if self.weight_granularity not in numerics.WEIGHT_GRANULARITIES:
            raise ValueError(f"LinearPolicy.weight_granularity={self.weight_granularity!r}; use one of "
                             f"{numerics.WEIGHT_GRANULARITIES}")
        pair = (self.act_granularity, self.weight_granularity)
        if pair not in (("per_token", "per_channel"), ("per_block", "per_block")):
            raise ValueError(f"LinearPolicy: act_granularity={pair[0]!r} with weight_granularity={pair[1]!r} has "
                             "no FP8 GEMM; use per_token with per_channel, or per_block with per_block")
        if self.outliers not in OUTLIER_MODES:
            raise ValueError(f"LinearPolicy.outliers={self.outliers!r}; use one of {OUTLIER_MODES}")
        if not (isinstance(self.min_rows, int) and not isinstance(self.min_rows, bool) and self.min_rows >= 1):
            raise ValueError(f"LinearPolicy.min_rows must be an int >= 1, got {self.min_rows!r}")
        if self.bf16_copies not in BF16_COPIES:
            raise ValueError(f"LinearPolicy.bf16_copies={self.bf16_copies!r}; use one of {BF16_COPIES}")
        if self.bf16_copies == "drop" and self.outliers != "off":
            raise ValueError(f"LinearPolicy.bf16_copies='drop' needs outliers='off' (outliers={self.outliers!r} "
                             "calibrates from the bf16 weight on the first call); use bf16_copies='cpu'")
        for flag in ("fast_accum", "fuse_gelu"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"LinearPolicy.{flag} must be True or False, got {getattr(self, flag)!r}")
        if not (isinstance(self.max_outliers, int) and self.max_outliers >= 1):
            raise ValueError(f"LinearPolicy.max_outliers must be an int >= 1, got {self.max_outliers!r}")
        if not (isinstance(self.outlier_ratio, (int, float)) and self.outlier_ratio > 1):
            raise ValueError(f"LinearPolicy.outlier_ratio must be a number > 1, got {self.outlier_ratio!r}")

    def module_kwargs(self) -> dict:
        return dict(act_granularity=self.act_granularity, weight_granularity=self.weight_granularity,
                    outliers=self.outliers, min_rows=self.min_rows, outlier_ratio=self.outlier_ratio,
                    max_outliers=self.max_outliers, park=self.bf16_copies != "keep", fast_accum=self.fast_accum)


def _matches(name: str, pattern: str) -> bool:
    parts = name.split(".")
    return any(fnmatch.fnmatchcase(".".join(parts[: i + 1]), pattern) for i in range(len(parts)))


def select_linears(transformer: torch.nn.Module, policy: LinearPolicy, blocks: list[str],
                   skip_types: tuple[type, ...] = ()) -> tuple[dict[str, torch.nn.Linear], dict[str, str]]:
    """(linears to run in FP8 by name, {name: why it stays bf16}) for every ``nn.Linear`` of ``transformer``.

    ``blocks``: the main blocks' names in execution order. Modules of ``skip_types`` (already patched
    layers) and everything under them are passed over.
    """
    kept_blocks: set[str] = set()
    for entry in policy.keep_blocks:
        if isinstance(entry, int):
            if blocks and not -len(blocks) <= entry < len(blocks):
                raise ValueError(f"LinearPolicy.keep_blocks: block index {entry} is out of range; "
                                 f"{type(transformer).__name__} has {len(blocks)} main blocks")
            if blocks:
                kept_blocks.add(blocks[entry])
    patterns = [e for e in policy.keep_blocks if isinstance(e, str)]
    linears = {n: m for n, m in transformer.named_modules() if isinstance(m, torch.nn.Linear)}
    for pattern in patterns:
        if not any(_matches(n, pattern) for n in linears):
            raise ValueError(f"LinearPolicy.keep_blocks: {pattern!r} matches no nn.Linear of "
                             f"{type(transformer).__name__}")

    skipped_prefixes = [n for n, m in transformer.named_modules() if skip_types and isinstance(m, skip_types)]
    # peft LoRA layers: their base_layer is a candidate like any linear (peft adds the bf16 LoRA branch to its
    # output; the patcher re-quantizes it when an adapter is merged in or out); the branch itself stays bf16
    lora = peft_layers.lora_layers(transformer)
    chosen, bf16 = {}, {}
    for name, module in linears.items():
        if any(name.startswith(p + ".") for p in skipped_prefixes):
            continue
        block = next((b for b in blocks if name.startswith(b + ".")), None)
        owner = next((p for p in lora if name.startswith(p + ".")), None)
        if owner is not None and name != owner + ".base_layer":
            bf16[name] = "the LoRA branch of a peft layer (runs bf16 beside its base)"
        elif owner is not None and peft_layers.variant(lora[owner]):
            bf16[name] = (f"base of a peft LoRA layer with {peft_layers.variant(lora[owner])}, which reads the bf16 "
                          "weight itself")
        elif block is None and not policy.include_outside_blocks:
            bf16[name] = "outside the main blocks (embedder / final projection)"
        elif block in kept_blocks:
            bf16[name] = f"in kept block {block}"
        elif any(_matches(name, p) for p in patterns):
            bf16[name] = "matched by keep_blocks"
        elif module.in_features % _GEMM_DIVISOR or module.out_features % _GEMM_DIVISOR:
            bf16[name] = f"shape {module.out_features}x{module.in_features} not a multiple of {_GEMM_DIVISOR}"
        elif module.weight.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            bf16[name] = f"weight dtype {module.weight.dtype}"
        else:
            chosen[name] = module
    return chosen, bf16
