"""The public attention call: `sagegen.sageattn`.

Validates input, normalises layouts and masks, picks a backend and runs it through a `torch.library`
custom op (so `torch.compile(fullgraph=True)` traces through it).
"""

from __future__ import annotations

import functools
import math
import numbers
import os
import warnings
import weakref

import torch

from sagegen.config import SUPPORTED_HEAD_DIMS, SageConfig
from sagegen.kernels import dispatch as backends
from sagegen.kernels.block_sparse import BlockSparse, check_against_call
from sagegen.kernels.spec import MaskSpec

_LAYOUTS = ("HND", "NHD")
_BACKENDS = ("auto", "triton", "reference")
_DTYPES = (torch.float16, torch.bfloat16)


def sageattn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    tensor_layout: str = "HND",
    is_causal: bool = False,
    sm_scale: float | None = None,
    attn_mask: torch.Tensor | None = None,
    return_lse: bool = False,
    config: SageConfig | None = None,
    backend: str = "auto",
    block_mask=None,
    sparse=None,
):
    """SageAttention2-style quantized attention (INT8 Q·Kᵀ, FP8 P·V, two-level accumulation).

    Args:
        q: [B, Hq, Nq, D] for ``tensor_layout="HND"`` or [B, Nq, Hq, D] for ``"NHD"``; fp16 or bf16.
        k, v: [B, Hkv, Nk, D] (``"HND"``) or [B, Nk, Hkv, D] (``"NHD"``); same dtype and device as q;
            Hq must be a multiple of Hkv (grouped-query attention). D in (32, 64, 96, 128).
            Any strides (non-contiguous views are read in place).
        tensor_layout: ``"HND"`` or ``"NHD"``.
        is_causal: top-left aligned causal mask (query i sees keys j <= i), as PyTorch SDPA.
        sm_scale: softmax scale, default 1/sqrt(D).
        attn_mask: optional mask broadcastable to [B, Hq, Nq, Nk] (always in this order, whatever the
            layout), as in PyTorch SDPA: bool (True = attend) or float (added to the scaled scores).
            A key-padding mask of shape [B, 1, 1, Nk] is applied per key inside the kernel.
            Rows with every key masked give zeros (and lse = -inf).
        return_lse: also return the natural-log log-sum-exp of each query row, [B, Hq, Nq] fp32.
        config: `SageConfig` (numerics and fallback policy); default `SageConfig()`.
        backend: ``"triton"``, ``"reference"`` (the PyTorch emulation of the same numerics) or ``"auto"``
            (Triton on a supported CUDA GPU, the emulation on CPU; on the GPU, calls with less work than the
            measured crossover, ``kernels.backends.auto_prefers_sdpa`` (batch·heads·Nq·Nk), run PyTorch SDPA,
            which is faster there). With ``TRITON_INTERPRET=1`` the Triton backend also runs on CPU tensors.
        block_mask: block-sparse attention: a `sagegen.BlockSparse`, or FlexAttention's `BlockMask` (from
            `torch.nn.attention.flex_attention.create_block_mask`, built for this call's Nq and Nk; it is
            converted with `BlockSparse.from_flex_block_mask` once per BlockMask object, a host sync, so under
            `torch.compile` convert it outside and pass the `BlockSparse`). Only the listed key blocks are computed;
            the result equals the call with the equivalent dense bool mask (`BlockSparse.to_dense_mask`)
            combined with ``attn_mask`` and ``is_causal``. Block sizes must be multiples of the kernel's
            tiles (64 x 128 on Hopper and in the emulation, 128 x 64 on Ada/Ampere; 128 x 128 works
            everywhere). See docs/block-sparse.md.
        sparse: a `sagegen.SparseConfig` (or None): predict the block mask from q and k (``mode="topk"`` /
            ``"cdf"``) or build a static one from the latent grid (``"sta"`` / ``"radial"``), then run
            block-sparse as with ``block_mask`` (not both). The mask comes from its own custom op, so
            ``torch.compile(fullgraph=True)`` still traces the call. See docs/sparse.md.

    Returns:
        out in q's layout, dtype and memory layout (q's strides where q is dense, else the dense order of
        q's strides), or ``(out, lse)`` when ``return_lse``.
    """
    config = _check_config(config)
    _validate(q, k, v, tensor_layout, is_causal, sm_scale, attn_mask, return_lse, backend)
    d = q.shape[-1]
    scale = float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(d)
    n_dim = 2 if tensor_layout == "HND" else 1
    if sparse is not None:  # predicted / static block mask (sagegen.sparse); kept apart from the kernel path
        block_mask = _sparse_mask(sparse, block_mask, q, k, tensor_layout, attn_mask, scale, config)
    sparse = _block_sparse(block_mask, q, k, n_dim)
    if (backend == "auto" and q.is_cuda and not return_lse and sparse is None
            and backends.auto_prefers_sdpa(q.shape[n_dim], k.shape[n_dim], q.shape[0] * q.shape[3 - n_dim], d)):
        # Below the crossover, stock SDPA is faster: call it directly (no custom op, no copies).
        return backends.sdpa_direct(q, k, v, tensor_layout, attn_mask, is_causal, scale)
    sparse_args = (None, None, 0, 0) if sparse is None else tuple(sparse)
    args = (q, k, v, attn_mask, is_causal, scale, tensor_layout, return_lse, backend, *_config_args(config),
            *sparse_args)
    direct = _eager_direct(q, k, v, attn_mask, sparse_args[0], sparse_args[1])
    out, lse = _as_the_op_runs(_sageattn_impl, *args) if direct else torch.ops.sagegen.sageattn(*args)
    return (out, lse) if return_lse else out


def sageattn_fp8_out(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, tensor_layout: str = "HND",
                     is_causal: bool = False, sm_scale: float | None = None, attn_mask: torch.Tensor | None = None,
                     config: SageConfig | None = None, backend: str = "auto", block_mask=None):
    """`sageattn` with an FP8 output for an FP8 projection of it (the patch's ``linear="fp8"`` output
    projections, which then skip their quantization pass). Eager calls only.

    Args: as `sageattn` (``block_mask``: a `BlockSparse` or FlexAttention's `BlockMask`).

    Returns:
        ``(out, row_scale)``: out float8_e4m3fn with q's shape and memory layout; row_scale fp32
        [B·Nq, 1], one call-wide scale from V's range (kernels/fp8_out.py) repeated for each token row, as a
        row-wise FP8 GEMM reads it (any M <= B·Nq rows of the output take ``row_scale[:M]``):
        ``out.float() * row_scale[0]`` is the attention output. None where sagegen's kernels or emulation
        would not run the call: a fallback to SDPA, fp16 P·V (no FP8 tensor cores), or a call being traced (the
        caller runs `sageattn`). Calls below ``auto``'s SDPA crossover run the kernel: the FP8 output is what
        pays there.
    """
    config = _check_config(config)
    _validate(q, k, v, tensor_layout, is_causal, sm_scale, attn_mask, False, backend)
    n_dim = 2 if tensor_layout == "HND" else 1
    sparse = _block_sparse(block_mask, q, k, n_dim)
    sparse_args = (None, None) if sparse is None else (sparse.counts, sparse.indices)
    if not _eager_direct(q, k, v, attn_mask, *sparse_args):
        return None
    return _as_the_op_runs(_fp8_out_call, q, k, v, tensor_layout, is_causal, sm_scale, attn_mask, config, backend,
                           sparse)


def _fp8_out_call(q, k, v, tensor_layout, is_causal, sm_scale, attn_mask, config, backend, sparse):
    hnd = (lambda t: t) if tensor_layout == "HND" else (lambda t: t.transpose(1, 2))
    qh, kh, vh = hnd(q), hnd(k), hnd(v)
    choice, config = backends.choose(qh, backend, config, interpret=triton_interpret(), warn=warn_once,
                                     n_kv=kh.shape[2], sparse=True)
    if choice not in ("triton", "reference") or config.pv_precision != "fp8":
        return None
    scale = float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    out = torch.empty_like(q, dtype=torch.float8_e4m3fn)
    rows = qh.shape[0] * qh.shape[2]
    scales = torch.empty(rows + 1, dtype=torch.float32, device=q.device)  # the row scales, then the inverse
    backends.run(choice, qh, kh, vh, hnd(out), sm_scale=scale, is_causal=is_causal,
                 mask=normalize_mask(attn_mask, qh.shape[0], kh.shape[2]), attn_mask=attn_mask, config=config,
                 return_lse=False, block_sparse=sparse, out_scale=scales)
    return out, scales[:rows].view(rows, 1)


def _sparse_mask(sparse, block_mask, q, k, layout, attn_mask, scale, config):
    from sagegen.sparse.sparse_config import SparseConfig
    from sagegen.sparse.op import sparse_block_mask

    if not isinstance(sparse, SparseConfig):
        raise TypeError(f"sparse must be a sagegen.SparseConfig or None, got {type(sparse).__name__}")
    if block_mask is not None:
        raise ValueError("pass either block_mask (a given mask) or sparse (a predicted / static one), not both")
    return sparse_block_mask(q, k, sparse, tensor_layout=layout, attn_mask=attn_mask, sm_scale=scale,
                             config=config)


def _block_sparse(block_mask, q, k, n_dim) -> BlockSparse | None:
    """The call's block mask as a shape-checked `BlockSparse` (a FlexAttention BlockMask is converted)."""
    if block_mask is None:
        return None
    n_q, n_k = q.shape[n_dim], k.shape[n_dim]
    if not isinstance(block_mask, BlockSparse):
        if type(block_mask).__name__ != "BlockMask" or not hasattr(block_mask, "kv_num_blocks"):
            raise TypeError("block_mask must be a sagegen.BlockSparse, a FlexAttention BlockMask "
                            f"(torch.nn.attention.flex_attention.create_block_mask) or None, got "
                            f"{type(block_mask).__name__}")
        if tuple(block_mask.seq_lengths) != (n_q, n_k):
            raise ValueError(f"block_mask was built for (Q_LEN, KV_LEN) = {tuple(block_mask.seq_lengths)} but "
                             f"this call has Nq={n_q}, Nk={n_k}")
        if torch.compiler.is_compiling():
            raise TypeError("a FlexAttention BlockMask is converted with a host sync, which torch.compile cannot "
                            "trace: convert it once outside the compiled code with "
                            "sagegen.BlockSparse.from_flex_block_mask(bm) and pass that")
        block_mask = _from_flex(block_mask)
    check_against_call(block_mask, q.shape[0], q.shape[3 - n_dim], n_q, n_k, q.device)
    return block_mask


# FlexAttention BlockMask -> its BlockSparse, per BlockMask object while it lives: the conversion checks the
# partial blocks against the mask_mod (a host sync and a pass over them), so a mask reused every step pays once.
_flex_converted: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _from_flex(block_mask) -> BlockSparse:
    source = (block_mask.kv_num_blocks, block_mask.kv_indices, block_mask.full_kv_num_blocks,
              block_mask.full_kv_indices, block_mask.mask_mod)
    hit = _flex_converted.get(block_mask)
    if hit is not None and all(a is b for a, b in zip(hit[0], source)):
        return hit[1]
    converted = BlockSparse.from_flex_block_mask(block_mask)
    _flex_converted[block_mask] = (source, converted)
    return converted


def _check_config(config) -> SageConfig:
    if config is None:
        return SageConfig()
    if not isinstance(config, SageConfig):
        raise TypeError(f"config must be a sagegen.SageConfig or None, got {type(config).__name__}")
    return config


# SageConfig's fields in the custom op's argument order (the op's schema takes no dataclass). Every field must be
# here, or a call through the op would silently run the field's default (tests/test_api.py checks the set).
OP_CONFIG_FIELDS = ("q_granularity", "k_granularity", "smooth_k", "smooth_q", "smooth_v", "pv_precision",
                    "pv_accum", "fallback", "block_q", "block_k", "qk_rotation", "qk_precision")


def _config_args(c: SageConfig) -> tuple:
    return tuple((getattr(c, n) or 0) if n in ("block_q", "block_k") else getattr(c, n) for n in OP_CONFIG_FIELDS)


@functools.lru_cache(maxsize=64)
def _config_from_args(*args) -> SageConfig:
    fields = dict(zip(OP_CONFIG_FIELDS, args))
    fields["block_q"] = fields["block_q"] or None
    fields["block_k"] = fields["block_k"] or None
    return SageConfig(**fields)


def _validate(q, k, v, layout, is_causal, sm_scale, attn_mask, return_lse, backend) -> None:
    if layout not in _LAYOUTS:
        raise ValueError(f"tensor_layout={layout!r} is not supported; use one of {_LAYOUTS}")
    if backend not in _BACKENDS:
        raise ValueError(f"backend={backend!r} is not supported; use one of {_BACKENDS}")
    shape_doc = "[B, H, N, D]" if layout == "HND" else "[B, N, H, D]"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D {shape_doc} for tensor_layout={layout!r}, got shape "
                             f"{tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}.dtype={t.dtype} is not supported; use torch.float16 or torch.bfloat16")
        if t.numel() == 0:
            raise ValueError(f"{name} is empty (shape {tuple(t.shape)}); every dimension must be >= 1")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    h_dim, n_dim = (1, 2) if layout == "HND" else (2, 1)
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"batch sizes differ: q has {q.shape[0]}, k has {k.shape[0]}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"head dims differ: q has {q.shape[-1]}, k has {k.shape[-1]}")
    if q.shape[h_dim] % k.shape[h_dim]:
        raise ValueError(f"q's head count ({q.shape[h_dim]}) must be a multiple of k's ({k.shape[h_dim]}) "
                         f"with tensor_layout={layout!r}; is the layout right?")
    if q.shape[-1] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dim {q.shape[-1]} is not supported; use one of {SUPPORTED_HEAD_DIMS} "
                         "(or torch.nn.functional.scaled_dot_product_attention)")
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {is_causal!r}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {return_lse!r}")
    # numbers.Real admits numpy scalars; bool is an int to Python but never meant as a scale
    if sm_scale is not None and (isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real)
                                 or not math.isfinite(sm_scale) or not sm_scale > 0):
        raise ValueError(f"sm_scale must be a positive finite number or None, got {sm_scale!r}")
    grads = [t for t in (q, k, v, attn_mask) if isinstance(t, torch.Tensor) and t.requires_grad]
    if torch.is_grad_enabled() and grads:
        raise RuntimeError("sageattn is inference-only (no backward); call it under torch.no_grad() or "
                           "torch.inference_mode()")
    if attn_mask is not None:
        _validate_mask(attn_mask, q, k, h_dim, n_dim)


def _validate_mask(mask, q, k, h_dim, n_dim) -> None:
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"attn_mask.dtype={mask.dtype}: use torch.bool (True = attend) or a float dtype "
                        "(added to the scores)")
    if mask.device != q.device:
        raise ValueError(f"attn_mask is on {mask.device} but q is on {q.device}")
    target = (q.shape[0], q.shape[h_dim], q.shape[n_dim], k.shape[n_dim])
    ok = mask.dim() <= 4 and all(m in (1, t) for m, t in zip(reversed(mask.shape), reversed(target)))
    if not ok:
        raise ValueError(f"attn_mask of shape {tuple(mask.shape)} does not broadcast to [B, H, Nq, Nk] = "
                         f"{list(target)}")


def normalize_mask(mask: torch.Tensor | None, batch: int, n_kv: int) -> MaskSpec:
    """Turn a user mask (validated, broadcastable to [batch, H, Nq, n_kv]) into the kernels' `MaskSpec`.

    A mask that is the same for every head and query row (size 1 or an expanded, stride-0 view along both)
    is a key-padding mask: one bias per key, broadcast along the keys too when its key dim is 1."""
    if mask is None:
        return MaskSpec()
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    constant = lambda dim: mask.shape[dim] == 1 or mask.stride(dim) == 0
    if constant(1) and constant(2):
        row = mask[:, 0, 0, :]
        if mask.dtype == torch.bool:
            bias = torch.zeros(row.shape, dtype=torch.float32, device=row.device).masked_fill(~row, -math.inf)
        else:
            bias = row.float()
        return MaskSpec("key", bias.expand(batch, n_kv).contiguous())
    return MaskSpec("bool" if mask.dtype == torch.bool else "additive", mask)


def triton_interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


_warned: set[str] = set()


def warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


# False routes eager calls through the custom op as well (only to measure the difference).
EAGER_DIRECT = True


def _eager_direct(*tensors) -> bool:
    """Whether a call may run `_sageattn_impl` without the custom op's dispatch, as an eager FP8 linear does: no
    compiler or tracer is recording it (dynamo, `torch.jit.trace`, a dispatch mode such as FakeTensorMode or
    FlopCounterMode, a torch-function mode other than the one whose handler is calling, a default device or a
    mode that says it passes sagegen through: those see the op) and the tensors are plain ones. The dispatch
    alone took 20-110 us of host time a call on an H200's host
    (lab/data/probe-call-overhead-ab-h200-2026-11-26.json); the result is the same."""
    return (EAGER_DIRECT and not torch.compiler.is_compiling() and not torch.jit.is_tracing()
            and not torch._C._len_torch_dispatch_stack() and _function_modes_pass_through()
            and all(t is None or type(t) is torch.Tensor for t in tensors))


def _function_modes_pass_through() -> bool:
    """No torch-function mode is active, or each active one needs no view of sagegen's op: torch's default
    device (``torch.set_default_device``, ``with torch.device(...)``) or a mode with ``sagegen_passes_through =
    True`` (the patch's CUDA-graph capture runs under one). `sageattn_fp8_out` has no op form, so under any
    other mode it answers None."""
    if not torch._C._len_torch_function_stack():
        return True
    stack = getattr(torch.overrides, "_get_current_function_mode_stack", None)
    return stack is not None and all(getattr(mode, "sagegen_passes_through", False) or _is_default_device(mode)
                                     for mode in stack())


def _is_default_device(mode) -> bool:
    try:
        from torch.utils._device import DeviceContext
    except ImportError:  # (private; present in torch 2.1-2.15)
        return False
    return type(mode) is DeviceContext


def _as_the_op_runs(fn, *args):
    """``fn(*args)`` without the active torch-function modes, as the body of a custom op runs (the mode sees the
    op call, not the torch calls inside it): under a default device or a graph capture's mode an eager call
    computes exactly what the op would."""
    if not torch._C._len_torch_function_stack():
        return fn(*args)
    with torch._C.DisableTorchFunction():
        return fn(*args)


def _sageattn_impl(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool,
    sm_scale: float, tensor_layout: str, return_lse: bool, backend: str,
    q_granularity: str, k_granularity: str, smooth_k: bool, smooth_q: bool, smooth_v: bool,
    pv_precision: str, pv_accum: str, fallback: str, block_q: int, block_k: int,
    qk_rotation: str = "none", qk_precision: str = "int8",
    sparse_counts: torch.Tensor | None = None, sparse_indices: torch.Tensor | None = None,
    sparse_block_q: int = 0, sparse_block_kv: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The body of the custom op below (eager calls run it directly): (out in q's layout, lse [B, Hq, Nq] fp32 or
    an empty tensor)."""
    config = _config_from_args(q_granularity, k_granularity, smooth_k, smooth_q, smooth_v, pv_precision,
                               pv_accum, fallback, block_q, block_k, qk_rotation, qk_precision)
    sparse = None
    if sparse_counts is not None:
        sparse = BlockSparse(sparse_counts, sparse_indices, sparse_block_q, sparse_block_kv)
    hnd = (lambda t: t) if tensor_layout == "HND" else (lambda t: t.transpose(1, 2))
    qh, kh, vh = hnd(q), hnd(k), hnd(v)
    mask = normalize_mask(attn_mask, qh.shape[0], kh.shape[2])
    choice, config = backends.choose(qh, backend, config, interpret=triton_interpret(), warn=warn_once,
                                     n_kv=kh.shape[2], sparse=sparse is not None)
    # q's own memory layout where it is dense (as SDPA's flash kernels do): a processor that passes [B, H, N, D]
    # views of [B, N, H, D] projections gets a [B, N, H, D] buffer back, so its transpose + reshape is a view
    out = torch.empty_like(q)
    lse = backends.run(choice, qh, kh, vh, hnd(out), sm_scale=sm_scale, is_causal=is_causal, mask=mask,
                       attn_mask=attn_mask, config=config, return_lse=return_lse, block_sparse=sparse)
    if lse is None:
        lse = torch.empty(0, dtype=torch.float32, device=q.device)
    return out, lse


# the op's schema comes from _sageattn_impl's annotations; the plain function stays callable
_sageattn_op = torch.library.custom_op("sagegen::sageattn", mutates_args=())(_sageattn_impl)


@_sageattn_op.register_fake
def _(q, k, v, attn_mask, is_causal, sm_scale, tensor_layout, return_lse, backend, *config_and_sparse_args):
    out = torch.empty_like(q)  # the real op's layout rule (the compiled graph relies on the strides)
    if not return_lse:
        return out, q.new_empty(0, dtype=torch.float32)
    b, h, n = (q.shape[0], q.shape[1], q.shape[2]) if tensor_layout == "HND" else (q.shape[0], q.shape[2],
                                                                                   q.shape[1])
    return out, q.new_empty((b, h, n), dtype=torch.float32)
