"""PyTorch emulation of sagegen's quantized attention: the oracle for the Triton kernels and the CPU path.

It reproduces the kernel's math step by step: the same smoothing, the same INT8 scales and rounding, the same
per-block rescaling of P before its FP8 cast, the same FP8 V scales, and the same order of the scale
multiplications. Only fp32 summation order and `exp2` rounding differ from the GPU.

All tensors here are in the canonical layout [B, H, N, D]; `sagegen.api` normalises layouts and masks.
This module imports nothing from the Triton implementation.
"""

from __future__ import annotations

import functools
import math

import torch

from sagegen.config import SageConfig
from sagegen.kernels.block_sparse import BlockSparse, tile_layout
from sagegen.kernels.spec import (EPS, FP8_MAX, FP8_OUT_MARGIN, FP16_V_EXP, INT8_MAX, LN2, LOG2_FP8_MAX, LOG2E,
                                  REF_WINDOW, SAMPLE_TOKENS, MaskSpec, device_capability, hadamard_signs)

_CHUNK_ELEMS = 1 << 26  # scores materialised per chunk of query rows


def round_half_away(x: torch.Tensor) -> torch.Tensor:
    """Round to nearest, ties away from zero (the kernel's float -> int8 rounding)."""
    return torch.trunc(x + 0.5 * torch.sign(x))


def _div(a: float, t: torch.Tensor) -> torch.Tensor:
    """a / t correctly rounded, as the kernels' div_rn: `a / t` with a Python number computes
    t.reciprocal() * a, which is off by an ulp now and then (and flips an int8 rounding)."""
    return torch.full_like(t, a) / t


def _amax(x: torch.Tensor, block: int, per_token: bool) -> torch.Tensor:
    """|x|'s maximum per token, or per `block` tokens repeated for each token, of x [B, H, N, D]; at least EPS."""
    B, H, N, D = x.shape
    if per_token:
        amax = x.abs().amax(dim=-1)
    else:
        n_blocks = -(-N // block)
        padded = torch.nn.functional.pad(x.abs(), (0, 0, 0, n_blocks * block - N))
        amax = padded.reshape(B, H, n_blocks, block * D).amax(dim=-1)
        amax = amax.repeat_interleave(block, dim=-1)[..., :N]
    return torch.clamp(amax, min=EPS)


def quantize_int8(x: torch.Tensor, block: int, per_token: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """INT8-quantize x [B, H, N, D] (fp32) with one scale per token or per `block` tokens.

    Returns the int8 values (as fp32, for exact fp32 matmuls) and a per-token scale [B, H, N].
    """
    amax = _amax(x, block, per_token)
    q = round_half_away(x * _div(INT8_MAX, amax)[..., None]).clamp_(-INT8_MAX, INT8_MAX)
    return q, amax / INT8_MAX


def quantize_fp8(x: torch.Tensor, block: int, per_token: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """As `quantize_int8`, to e4m3 (values as fp32, exactly the e4m3 grid) with scale amax / 448."""
    amax = _amax(x, block, per_token)
    q = (x * _div(FP8_MAX, amax)[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()
    return q, amax / FP8_MAX


@functools.lru_cache(maxsize=None)
def _rotation(d: int) -> torch.Tensor:
    """The orthogonal [d, d] fp64 matrix of ``qk_rotation="hadamard"``: diag(±1) · H_d / sqrt(d), H_d Sylvester's
    Hadamard matrix and the signs `spec.hadamard_signs` (a fixed draw), so Q and K of every call turn the same way."""
    signs = torch.tensor(hadamard_signs(d), dtype=torch.float64)
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return signs[:, None] * h / math.sqrt(d)


def rotate(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] (fp32) times `_rotation(D)`, computed in fp64."""
    r = _rotation(x.shape[-1]).to(x.device)
    return (x.double() @ r).float()


def block_means(x: torch.Tensor, block: int) -> torch.Tensor:
    """Per-block mean over tokens of x [B, H, N, D], broadcast back to every token (last block partial)."""
    B, H, N, D = x.shape
    n_blocks = -(-N // block)
    pad = n_blocks * block - N
    sums = torch.nn.functional.pad(x, (0, 0, 0, pad)).reshape(B, H, n_blocks, block, D).sum(dim=3)
    counts = torch.full((n_blocks,), float(block), device=x.device)
    counts[-1] = block - pad
    means = sums / counts[:, None]
    return means.repeat_interleave(block, dim=2)[:, :, :N]


def truncate_fp22(x: torch.Tensor) -> torch.Tensor:
    """Truncate fp32 to 13 mantissa bits: the FP8 tensor-core accumulator's precision."""
    bits = x.contiguous().view(torch.int32) & ~((1 << 10) - 1)
    return bits.view(torch.float32)


def _live_keys(mask: MaskSpec, n_k: int) -> torch.Tensor | None:
    """[B, 1, Nk, 1] fp32, 1 for keys a key-padding mask keeps (bias > -inf), 0 for masked ones."""
    if mask.kind != "key":
        return None
    return (mask.tensor > -math.inf).float()[:, None, :, None]


def sample_index(n: int, device=None) -> torch.Tensor:
    """The keys the smoothing means are taken over (spec.SAMPLE_TOKENS): (t * n) // SAMPLE_TOKENS, or all."""
    if n <= SAMPLE_TOKENS:
        return torch.arange(n, device=device)
    return torch.arange(SAMPLE_TOKENS, device=device) * n // SAMPLE_TOKENS


def _sampled_mean(x: torch.Tensor, live: torch.Tensor | None) -> torch.Tensor:
    """Smoothing mean [B, H, 1, D] of x [B, H, N, D] over the sampled tokens (live keys only under a
    key-padding mask; 0 when none of them is live). Divides correctly rounded, as the kernel's div_rn."""
    idx = sample_index(x.shape[2], x.device)
    xs = x[:, :, idx]
    if live is None:
        count = torch.full_like(xs[:, :, :1], float(len(idx)))
        return xs.sum(dim=2, keepdim=True) / count
    ls = live[:, :, idx]
    xs = torch.where(ls > 0, xs, torch.zeros_like(xs))  # (not xs * ls: a masked inf would give NaN)
    return xs.sum(dim=2, keepdim=True) / ls.sum(dim=2, keepdim=True).clamp(min=1.0)


def _expand_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    return x if group == 1 else x.repeat_interleave(group, dim=1)


def _mask_chunk(mask: MaskSpec, B: int, H: int, rows: slice, Nk: int) -> torch.Tensor | None:
    """The chunk's mask as an additive bias in log2 units, broadcastable to [B, H, rows, Nk]."""
    if mask.kind == "none":
        return None
    t = mask.tensor
    if mask.kind == "key":
        return (t.float() * LOG2E)[:, None, None, :]
    t = t[..., rows, :] if t.shape[-2] != 1 else t
    if mask.kind == "bool":
        zero = torch.zeros((), device=t.device)
        return torch.where(t, zero, torch.tensor(-math.inf, device=t.device))
    return t.float() * LOG2E


def sage_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    sm_scale: float,
    is_causal: bool = False,
    mask: MaskSpec | None = None,
    config: SageConfig | None = None,
    return_lse: bool = False,
    block_sparse: BlockSparse | None = None,
    out_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Emulated quantized attention.

    Args:
        q: [B, Hq, Nq, D]; k, v: [B, Hkv, Nk, D] with Hq % Hkv == 0; fp16/bf16/fp32.
        sm_scale: softmax scale (1/sqrt(D) usually).
        is_causal: top-left aligned causal mask (query i attends keys j <= i), as in PyTorch SDPA.
        mask: a `MaskSpec` (see there).
        config: numerics; defaults to `SageConfig()`.
        return_lse: also return the natural-log log-sum-exp per query row [B, Hq, Nq] (fp32).
        block_sparse: compute only the listed key blocks (blocks: multiples of the tiles): the dense
            computation with the equivalent bool mask, except that an unlisted tile leaves the online-softmax
            state untouched (the kernels never visit it) where a fully masked one would move the reference
            max; the two differ by fp32 rounding only. Quantization statistics stay over all keys.
        out_scale: fp32 [B·Nq + 1]: the output is e4m3 instead, with one scale from V's range (`fp8_out_scale`),
            written into the first B·Nq entries, its inverse into the last (kernels/fp8_out.py). Needs
            ``pv_precision="fp8"``.

    Returns:
        (out [B, Hq, Nq, D] in q's dtype (e4m3 with ``out_scale``), lse or None). Fully masked rows give 0 and
        lse = -inf.
    """
    config = config or SageConfig()
    mask = mask or MaskSpec()
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    group = H // Hkv
    block_q, block_k = config.blocks(D, device_capability(q.device) if q.is_cuda else None)
    c = torch.tensor(sm_scale * LOG2E, dtype=torch.float32)

    qf, kf, vf = q.float(), k.float(), v.float()
    # Keys masked out by a key-padding mask take no part in the statistics (means, scales): padding can
    # hold anything, and it must not cost the real keys precision.
    live = _live_keys(mask, Nk)
    k_mean = _sampled_mean(kf, live) if config.smooth_k else None
    ks = kf - k_mean if config.smooth_k else kf
    if live is not None:  # masked keys quantize as zeros, whatever they hold (inf and NaN too, as the kernels)
        ks = torch.where(live > 0, ks, torch.zeros_like(ks))
    q_mean = block_means(qf, block_q) if config.smooth_q else None
    qs = qf - q_mean if config.smooth_q else qf

    if config.qk_rotation == "hadamard":  # Q·Kᵀ and the smooth-Q correction unchanged: both turn alike
        qs, ks = rotate(qs), rotate(ks)
        q_mean = rotate(q_mean) if q_mean is not None else None
    quantize = quantize_fp8 if config.qk_precision == "fp8" else quantize_int8
    q8, q_scale = quantize(qs, block_q, config.q_granularity == "per_token")
    k8, k_scale = quantize(ks, block_k, config.k_granularity == "per_token")

    v_mean = _sampled_mean(vf, live) if config.smooth_v else None
    vs = vf - v_mean if config.smooth_v else vf
    if live is not None:
        vs = torch.where(live > 0, vs, torch.zeros_like(vs))
    if config.pv_precision == "fp8":
        v_amax = torch.clamp(vs.abs().amax(dim=2, keepdim=True), min=EPS)  # [B, Hkv, 1, D]
        v_scale = v_amax / FP8_MAX
        vq = (vs * _div(FP8_MAX, v_amax)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()
        v_dequant = v_scale
    else:  # fp16 V, scaled by a power of two per channel where it would overflow fp16 (spec.FP16_V_EXP)
        v_dequant, v_inv = fp16_v_scale(vs.abs().amax(dim=2, keepdim=True))
        vq = (vs * v_inv).to(torch.float16).float()

    out_inv = None
    if out_scale is not None:
        if config.pv_precision != "fp8":
            raise ValueError("an FP8 attention output needs pv_precision='fp8' (V's FP8 range sets its scale)")
        scale, out_inv = fp8_out_scale(v_scale, v_mean)
        out_scale[:-1] = scale
        out_scale[-1:] = out_inv

    k8, k_scale, ks_e, vq = (_expand_kv(t, group) for t in (k8, k_scale, ks, vq))
    if v_dequant is not None:
        v_dequant = _expand_kv(v_dequant, group)
    if v_mean is not None:
        v_mean = _expand_kv(v_mean, group)

    n_blocks = -(-Nk // block_k)
    pad_k = n_blocks * block_k - Nk
    vq_blocks = torch.nn.functional.pad(vq, (0, 0, 0, pad_k)).reshape(B, H, n_blocks, block_k, D)
    q_scale_log2 = q_scale * c

    out = torch.empty(B, H, Nq, D, dtype=q.dtype if out_inv is None else torch.float8_e4m3fn, device=q.device)
    lse = torch.empty(B, H, Nq, dtype=torch.float32, device=q.device) if return_lse else None
    tiles = tile_layout(block_sparse, block_q, block_k, Nq, Nk) if block_sparse is not None else None
    chunk = max(block_q, (_CHUNK_ELEMS // max(1, B * H * Nk)) // block_q * block_q)
    for start in range(0, Nq, chunk):
        rows = slice(start, min(Nq, start + chunk))
        s_int = q8[:, :, rows] @ k8.transpose(-1, -2)  # INT8: exact (|sum| < 2^24); FP8: fp32 sums
        if config.k_granularity == "per_token":
            s = (s_int * q_scale_log2[:, :, rows, None]) * k_scale[:, :, None, :]
        else:
            s = s_int * (q_scale_log2[:, :, rows, None] * k_scale[:, :, None, :])
        if config.smooth_q:
            s = s + (q_mean[:, :, rows] @ ks_e.transpose(-1, -2)) * c
        bias = _mask_chunk(mask, B, H, rows, Nk)
        if bias is not None:
            s = s + bias
        if is_causal:
            i = torch.arange(rows.start, rows.stop, device=q.device)[:, None]
            j = torch.arange(Nk, device=q.device)[None, :]
            s = s.masked_fill(j > i, -math.inf)
        active = None
        if tiles is not None:  # [B', H', rows, n_blocks]: the key tiles each row's q-tile computes
            active = tiles[:, :, rows.start // block_q:-(-rows.stop // block_q)].repeat_interleave(block_q, dim=2)
            active = active[:, :, :rows.stop - rows.start]
            dense = active.repeat_interleave(block_k, dim=3)[..., :Nk]
            s = s.masked_fill(~dense, -math.inf)
        o, m, l = _blockwise_softmax_pv(s, vq_blocks, block_k, pad_k, config.pv_accum, config.pv_precision == "fp8",
                                        active)
        safe_l = torch.where(l != 0, l, torch.ones_like(l))
        o = o * torch.where(l != 0, 1.0 / safe_l, torch.zeros_like(l))[..., None]
        if v_dequant is not None:
            o = o * v_dequant
        if v_mean is not None:
            o = torch.where(l[..., None] != 0, o + v_mean, torch.zeros_like(o))
        if out_inv is not None:  # clamped with NaN kept, as the kernels do
            o = o * out_inv
            o = torch.where(o.isnan(), o, o.clamp(-FP8_MAX, FP8_MAX))
        out[:, :, rows] = o.to(out.dtype)
        if lse is not None:
            lse_rows = (m + torch.log2(l) - LOG2_FP8_MAX) * LN2
            if config.smooth_k:
                # in fp64: BLAS sums in an order that depends on the row count, and an fp32 product could then
                # differ in its last bit between one call and the same rows split over calls (Ring's parts)
                km = _expand_kv(k_mean, group).transpose(-1, -2).double()
                corr = ((qf[:, :, rows].double() @ km)[..., 0] * sm_scale).float()
                lse_rows = lse_rows + corr
            lse[:, :, rows] = lse_rows
    return out, lse


def fp16_v_scale(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(2^k, 2^-k), fp32, of fp16 V with channel maxima ``amax`` (fp32, >= 0 or NaN): k the smallest integer >= 0
    with amax / 2^k < 2^FP16_V_EXP, from amax's exponent bits; 0 where amax is not finite (spec.py, and
    triton_quant's statistics launch, op for op)."""
    e = (amax.float().contiguous().view(torch.int32) >> 23) & 0xFF
    k = torch.where(e == 255, torch.zeros_like(e), (e - (126 + FP16_V_EXP)).clamp(min=0))
    return ((k + 127) << 23).view(torch.float32), ((127 - k) << 23).view(torch.float32)


def fp8_out_scale(v_scale: torch.Tensor, v_mean: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, 1 / scale), fp32 [1] each, of an FP8 attention output (kernels/fp8_out.py, op for op): V's bound
    max |mean| + 448 x scale over every head and channel, with FP8_OUT_MARGIN. v_scale, v_mean: [..., D] (the
    real channels only)."""
    bound = v_scale * FP8_MAX
    if v_mean is not None:
        bound = bound + v_mean.abs()
    bound = bound.amax().reshape(1)  # (amax keeps a NaN)
    scale = bound * torch.tensor(FP8_OUT_MARGIN / FP8_MAX, dtype=torch.float32)
    return scale, 1.0 / scale


def _blockwise_softmax_pv(s, vq_blocks, block_k, pad_k, accum, fp8, active=None):
    """Online softmax·V over key blocks, exactly as the kernel orders it.

    s: scaled scores in log2 units [B, H, M, Nk]; vq_blocks: [B, H, n_blocks, block_k, D] (quantized V).
    P = exp2(s - r + log2 448) with r the block's own row max (kept within REF_WINDOW of the running max), so
    each block's largest value lands exactly on e4m3's 448; acc and l follow r. Each block's P·V is
    accumulated fresh and added into the FP32 accumulator (or, for ``accum="fp22"``, into a
    single accumulator truncated to FP22 after every block). Returns the unnormalised output [B, H, M, D],
    the reference max r and the row sum l (both carry P's factor 448, which cancels in out = acc / l).
    active: None or bool [B', H', M, n_blocks]: blocks a row skips (False) leave its state as it was.
    """
    B, H, M, _ = s.shape
    n_blocks, D = vq_blocks.shape[2], vq_blocks.shape[-1]
    sb = torch.nn.functional.pad(s, (0, pad_k), value=-math.inf).view(B, H, M, n_blocks, block_k)
    m = torch.full((B, H, M), -math.inf, device=s.device)  # running row max
    r = m.clone()  # the max that acc and l are relative to
    l = torch.zeros(B, H, M, device=s.device)
    acc = torch.zeros(B, H, M, D, device=s.device)
    for j in range(n_blocks):
        sj = sb[..., j, :]
        m_old, l_old, acc_old = m, l, acc
        m_blk = sj.amax(dim=-1)
        m = torch.maximum(m, m_blk)
        r_new = torch.maximum(m_blk, m - REF_WINDOW)
        r_safe = torch.where(torch.isinf(r_new), torch.zeros_like(r_new), r_new)
        alpha = torch.exp2(r - r_safe)
        p = torch.exp2(sj - (r_safe - LOG2_FP8_MAX)[..., None])
        l = l * alpha + p.sum(dim=-1)
        pq = p.clamp(max=FP8_MAX).to(torch.float8_e4m3fn).float() if fp8 else p.to(torch.float16).float()
        acc = acc * alpha[..., None] + pq @ vq_blocks[:, :, j]
        if accum == "fp22":
            acc = truncate_fp22(acc)
        if active is not None:
            keep = ~active[..., j]
            m, r_new = torch.where(keep, m_old, m), torch.where(keep, r, r_new)
            l, acc = torch.where(keep, l_old, l), torch.where(keep[..., None], acc_old, acc)
        r = r_new
    return acc, r, l


def attention_fp64(q, k, v, *, sm_scale: float, is_causal: bool = False, mask: MaskSpec | None = None):
    """Plain attention in float64 (no quantization): the accuracy reference. Same conventions as
    `sage_attention` (fully masked rows give 0 and lse = -inf). Returns (out fp64, lse fp64)."""
    mask = mask or MaskSpec()
    B, H, Nq, D = q.shape
    group = H // k.shape[1]
    kd, vd = _expand_kv(k.double(), group), _expand_kv(v.double(), group)
    out = torch.empty(B, H, Nq, D, dtype=torch.float64, device=q.device)
    lse = torch.empty(B, H, Nq, dtype=torch.float64, device=q.device)
    step = max(1, (_CHUNK_ELEMS // 2) // max(1, B * H * k.shape[2]))
    for i in range(0, Nq, step):
        rows = slice(i, min(Nq, i + step))
        s = (q[:, :, rows].double() @ kd.transpose(-1, -2)) * sm_scale
        if mask.kind == "key":
            s = s + mask.tensor.double()[:, None, None, :]
        elif mask.kind in ("bool", "additive"):
            m = mask.tensor[..., rows, :] if mask.tensor.shape[-2] != 1 else mask.tensor
            s = s.masked_fill(~m, -math.inf) if mask.kind == "bool" else s + m.double()
        if is_causal:
            r = torch.arange(rows.start, rows.stop, device=q.device)[:, None]
            s = s.masked_fill(torch.arange(k.shape[2], device=q.device)[None, :] > r, -math.inf)
        lse_rows = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - torch.where(torch.isinf(lse_rows), 0.0, lse_rows)[..., None])
        out[:, :, rows] = p @ vd
        lse[:, :, rows] = lse_rows
    return out, lse
