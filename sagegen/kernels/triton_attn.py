"""Triton attention kernel: INT8 Q·Kᵀ, FP8 (or fp16) P·V with two-level accumulation, online softmax.

Scores live in log2 units (the softmax scale is folded with log2(e) into the per-row Q scale) so the kernel
uses `exp2`. P is rescaled per key block to that block's own row max before its FP8 cast (the whole e4m3
range is used in every block); each block's P·V is computed fresh by the tensor cores and added into the
FP32 accumulator with its rescale factor: that is the two-level accumulation.

Inputs come from `triton_quant.quantize`; this module knows nothing of the public API's layouts beyond
strides.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..config import SageConfig
from .spec import FP8_MAX, LN2, LOG2E, MaskSpec
from .triton_quant import interpreting, quantize, round_to_e4m3_grid

MASK_NONE, MASK_KEY, MASK_BOOL, MASK_ADD = 0, 1, 2, 3
_MASK_KINDS = {"none": MASK_NONE, "key": MASK_KEY, "bool": MASK_BOOL, "additive": MASK_ADD}


@triton.jit
def _pv_update(acc, pq, v_base, offs_d, offs_n, stride_vn, stride_vd, alpha, beta, PV_FP8: tl.constexpr):
    """acc * alpha + (P·V over this key block, accumulated fresh) * beta, for one chunk of head-dim columns."""
    if PV_FP8:
        v = tl.load(v_base + offs_d[:, None] * stride_vd + offs_n[None, :] * stride_vn)
        part = tl.dot(pq, tl.trans(v))
    else:
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd)
        part = tl.dot(pq, v)
    # Two-level accumulation: `part` starts from zero in the tensor cores; the sum across blocks is FP32.
    return acc * alpha[:, None] + part * beta[:, None]


@triton.jit
def _store_out(acc, offs_d, inv_l, l_i, VS, VM, vs_off, o_base, offs_m, stride_om, stride_od, N_Q, D,
               PV_FP8: tl.constexpr, SMOOTH_V: tl.constexpr):
    o = acc * inv_l[:, None]
    if PV_FP8:
        v_dq = tl.load(VS + vs_off + offs_d) / 448.0
        o = o * v_dq[None, :]
    if SMOOTH_V:
        v_mean = tl.load(VM + vs_off + offs_d)
        o = tl.where((l_i > 0)[:, None], o + v_mean[None, :], 0.0)
    o_ptrs = o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, o.to(o_base.dtype.element_ty), mask=(offs_m < N_Q)[:, None] & (offs_d < D)[None, :])


@triton.jit
def _attn_fwd_kernel(
    Q, K, V, QS, KS, VS, VM, QB, MSK, Out, Lse,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_qsb, stride_qsh,
    stride_ksb, stride_ksh,
    stride_vsb, stride_vsh,
    stride_qbb, stride_qbh, stride_qbm,
    stride_mb, stride_mh, stride_mm, stride_mn,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_lb, stride_lh,
    H, GROUP, N_Q, N_K, D, sm_scale_log2,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr, K_PER_TOKEN: tl.constexpr, MASK_KIND: tl.constexpr,
    SMOOTH_Q: tl.constexpr, SMOOTH_V: tl.constexpr, PV_FP8: tl.constexpr, RETURN_LSE: tl.constexpr,
    EXACT_FP8_CAST: tl.constexpr, SPLIT_D: tl.constexpr,
):
    start_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    h_kv = h // GROUP
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)

    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :])
    q_scale = tl.load(QS + b * stride_qsb + h * stride_qsh + offs_m) * sm_scale_log2
    k_base = K + b * stride_kb + h_kv * stride_kh
    v_base = V + b * stride_vb + h_kv * stride_vh
    ks_base = KS + b * stride_ksb + h_kv * stride_ksh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    # Head-dim columns in one or two chunks: two halves keep the fresh per-block P·V result (which two-level
    # accumulation needs besides the accumulator) small enough not to spill registers at head dim 128.
    CHUNK_D: tl.constexpr = HEAD_DIM // 2 if SPLIT_D else HEAD_DIM
    offs_d0 = tl.arange(0, CHUNK_D)
    offs_d1 = CHUNK_D + offs_d0
    acc0 = tl.zeros([BLOCK_M, CHUNK_D], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_M, CHUNK_D], dtype=tl.float32)

    hi = N_K
    if CAUSAL:
        hi = tl.minimum(N_K, (start_m + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :])
        qk = tl.dot(q, tl.trans(k)).to(tl.float32)
        if K_PER_TOKEN:
            k_scale = tl.load(ks_base + offs_n)
            s = (qk * q_scale[:, None]) * k_scale[None, :]
        else:
            k_scale = tl.load(ks_base + start_n)
            s = qk * (q_scale * k_scale)[:, None]
        if SMOOTH_Q:
            s += tl.load(QB + b * stride_qbb + h * stride_qbh + start_m * stride_qbm + offs_n)[None, :]
        if MASK_KIND == 1:
            key_bias = tl.load(MSK + b * stride_mb + offs_n * stride_mn, mask=offs_n < N_K, other=float("-inf"))
            s += key_bias[None, :]
        elif MASK_KIND != 0:
            m_ptrs = MSK + b * stride_mb + h * stride_mh + offs_m[:, None] * stride_mm + offs_n[None, :] * stride_mn
            in_bounds = (offs_m < N_Q)[:, None] & (offs_n < N_K)[None, :]
            if MASK_KIND == 2:
                keep = tl.load(m_ptrs, mask=in_bounds, other=0)
                s = tl.where(keep != 0, s, float("-inf"))
            else:
                s += tl.load(m_ptrs, mask=in_bounds, other=0.0).to(tl.float32) * 1.4426950408889634
        if start_n + BLOCK_N > N_K:
            s = tl.where((offs_n < N_K)[None, :], s, float("-inf"))
        if CAUSAL:
            s = tl.where(offs_n[None, :] <= offs_m[:, None], s, float("-inf"))

        m_blk = tl.max(s, axis=1)
        m_blk_safe = tl.where(m_blk == float("-inf"), 0.0, m_blk)
        p = tl.math.exp2(s - m_blk_safe[:, None])
        l_blk = tl.sum(p, axis=1)
        m_new = tl.maximum(m_i, m_blk)
        m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_new_safe)
        beta = tl.math.exp2(m_blk - m_new_safe)
        if PV_FP8:
            p_scaled = p * 448.0
            if EXACT_FP8_CAST:
                p_scaled = round_to_e4m3_grid(p_scaled)
            pq = p_scaled.to(tl.float8e4nv)
        else:
            pq = p.to(tl.float16)
        acc0 = _pv_update(acc0, pq, v_base, offs_d0, offs_n, stride_vn, stride_vd, alpha, beta, PV_FP8)
        if SPLIT_D:
            acc1 = _pv_update(acc1, pq, v_base, offs_d1, offs_n, stride_vn, stride_vd, alpha, beta, PV_FP8)
        l_i = l_i * alpha + l_blk * beta
        m_i = m_new

    inv_l = tl.where(l_i > 0, 1.0 / tl.where(l_i > 0, l_i, 1.0), 0.0)
    vs_off = b * stride_vsb + h_kv * stride_vsh
    o_base = Out + b * stride_ob + h * stride_oh
    _store_out(acc0, offs_d0, inv_l, l_i, VS, VM, vs_off, o_base, offs_m, stride_om, stride_od, N_Q, D,
               PV_FP8, SMOOTH_V)
    if SPLIT_D:
        _store_out(acc1, offs_d1, inv_l, l_i, VS, VM, vs_off, o_base, offs_m, stride_om, stride_od, N_Q, D,
                   PV_FP8, SMOOTH_V)
    if RETURN_LSE:
        lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
        tl.store(Lse + b * stride_lb + h * stride_lh + offs_m, lse, mask=offs_m < N_Q)


# Launch settings per (block_m, block_n, head_dim); tuned on an H200 (bench/tune_attention.py), and
# overridable for tuning runs.
LAUNCH_OVERRIDES: dict[tuple[int, int, int], tuple[int, int]] = {}


def launch_settings(block_m: int, block_n: int, head_dim: int) -> tuple[int, int]:
    """(num_warps, num_stages): two warpgroups for 128-row tiles keep the accumulators out of local memory."""
    key = (block_m, block_n, head_dim)
    if key in LAUNCH_OVERRIDES:
        return LAUNCH_OVERRIDES[key]
    return (8 if block_m >= 128 else 4), 2


def sage_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    *,
    sm_scale: float,
    is_causal: bool = False,
    mask: MaskSpec | None = None,
    config: SageConfig | None = None,
    return_lse: bool = False,
) -> torch.Tensor | None:
    """Quantized attention with the Triton kernels, written into ``out``.

    Args:
        q: [B, Hq, Nq, D]; k, v: [B, Hkv, Nk, D]; fp16/bf16, any strides (views of either layout).
        out: [B, Hq, Nq, D] in q's dtype, any strides; every element is written.
        sm_scale, is_causal, mask, config: as in `sagegen.sageattn` (mask already normalised).
        return_lse: compute the natural-log log-sum-exp.

    Returns:
        lse [B, Hq, Nq] fp32 if return_lse else None.
    """
    config = config or SageConfig()
    mask = mask or MaskSpec()
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    block_q, block_k = config.blocks(D)
    d_pad = max(16, triton.next_power_of_2(D))
    qq = quantize(q, k, v, config, block_q, block_k, d_pad)
    c = sm_scale * LOG2E

    q_bias = qq.q_scale  # placeholder pointer when unused
    qb_strides = (0, 0, 0)
    if config.smooth_q:
        ks = (k.float() - qq.k_mean[:, :, None, :D]) if qq.k_mean is not None else k.float()
        ks = ks.repeat_interleave(H // Hkv, dim=1) if Hkv != H else ks
        q_bias = torch.zeros(B, H, qq.q_block_mean.shape[2], qq.k8.shape[2], device=q.device)
        q_bias[..., :Nk] = (qq.q_block_mean[..., :D] @ ks.transpose(-1, -2)) * c
        qb_strides = q_bias.stride()[:3]

    kind = _MASK_KINDS[mask.kind]
    m_arg = mask.tensor if mask.tensor is not None else qq.q_scale
    if kind == MASK_KEY:
        m_arg = (mask.tensor.float() * LOG2E).contiguous()
        m_strides = (m_arg.stride(0), 0, 0, m_arg.stride(1))
    elif kind in (MASK_BOOL, MASK_ADD):
        if kind == MASK_BOOL:
            m_arg = m_arg.view(torch.int8) if m_arg.element_size() == 1 else m_arg.to(torch.int8)
        m_arg = m_arg.expand(B, H, Nq, Nk)
        m_strides = m_arg.stride()
    else:
        m_strides = (0, 0, 0, 0)

    lse = torch.empty(B, H, Nq, dtype=torch.float32, device=q.device) if return_lse else qq.q_scale
    vs = qq.v_scale if qq.v_scale is not None else qq.q_scale
    vm = qq.v_mean if qq.v_mean is not None else vs
    if config.pv_precision == "fp8":
        v_strides = (qq.v.stride(0), qq.v.stride(1), qq.v.stride(3), qq.v.stride(2))
    else:
        v_strides = qq.v.stride()
    grid = (triton.cdiv(Nq, block_q), B * H)
    num_warps, num_stages = launch_settings(block_q, block_k, d_pad)
    _attn_fwd_kernel[grid](
        qq.q8, qq.k8, qq.v, qq.q_scale, qq.k_scale, vs, vm, q_bias, m_arg, out, lse,
        *qq.q8.stride()[:3], *qq.k8.stride()[:3], *v_strides,
        *qq.q_scale.stride()[:2], *qq.k_scale.stride()[:2], *vs.stride()[:2],
        *qb_strides, *m_strides, *out.stride(), lse.stride(0) if return_lse else 0,
        lse.stride(1) if return_lse else 0,
        H, H // Hkv, Nq, Nk, D, c,
        BLOCK_M=block_q, BLOCK_N=block_k, HEAD_DIM=d_pad,
        CAUSAL=is_causal, K_PER_TOKEN=config.k_granularity == "per_token", MASK_KIND=kind,
        SMOOTH_Q=config.smooth_q, SMOOTH_V=config.smooth_v, PV_FP8=config.pv_precision == "fp8",
        RETURN_LSE=return_lse, EXACT_FP8_CAST=interpreting(), SPLIT_D=d_pad >= 128,
        num_warps=num_warps, num_stages=num_stages,
    )
    if not return_lse:
        return None
    if qq.k_mean is not None:
        k_mean = qq.k_mean[..., :D].repeat_interleave(H // Hkv, dim=1) if Hkv != H else qq.k_mean[..., :D]
        lse += (q.float() @ k_mean[..., None])[..., 0] * sm_scale
    return lse
