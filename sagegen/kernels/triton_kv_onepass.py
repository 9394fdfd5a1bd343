"""K/V quantization in one launch: channel statistics, their reduction and the quantization of K and V.

The two-launch form (`triton_quant._kv_stats`, then `_quant_kv_kernel`) reads K and V from memory twice: the
statistics (K's and V's channel means, V's range) cover every token, so no tile can be quantized before the
last tile of its head has been summed. Here the programs of one head wait for each other instead: each sums
its tiles into the head's partials, the last one to finish (an atomic count) reduces them to the means and
scales and raises the head's flag, and every program then quantizes its tiles, which the statistics read
moments earlier and L2 still holds. One launch instead of three, and K and V cross HBM once.

Waiting inside a kernel is only safe if the programs a head waits for can all be resident at once. Programs
take their work in the order they start (a ticket from an atomic counter, as single-pass scans do), so every
earlier ticket has started; a head has at most as many programs as the GPU has SMs, so they fit. The
Triton interpreter runs programs one after another, where a wait could never end: there the same kernel runs
as two launches (statistics and reduction, then quantization), which checks everything but the wait.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_quant import _kv_finish_channels, _kv_tile_stats, _quant_kv_tile, interpreting

STATS_AND_QUANT, STATS_ONLY, QUANT_ONLY = 0, 1, 2


@triton.jit
def _kv_onepass_kernel(
    K, V, KeyBias, KSum, VSum, VMin, VMax, KMean, VMean, VScale, VInvScale, K8, KScale, VQ, Sync,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    H, BH, N, D, N_PAD, N_BLOCKS, PROGRAMS_PER_HEAD,
    BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, CHANNELS: tl.constexpr, SMOOTH_K: tl.constexpr,
    SMOOTH_V: tl.constexpr, V_RANGE: tl.constexpr, K_PER_TOKEN: tl.constexpr, FP8: tl.constexpr,
    EXACT_FP8_CAST: tl.constexpr, KEY_MASK: tl.constexpr, PERMUTE_KEYS: tl.constexpr, PHASE: tl.constexpr,
):
    """Sync: int32 [1 + 2·BH] zeros: the ticket counter, then per head the count of programs done with their
    statistics and the flag that its means and scales are written."""
    if PHASE == 0:
        ticket = tl.atomic_add(Sync, 1)  # start order, not launch index: every smaller ticket has started
    else:
        ticket = tl.program_id(0)
    pid_bh = ticket // PROGRAMS_PER_HEAD
    first = ticket % PROGRAMS_PER_HEAD
    b = pid_bh // H
    h = pid_bh % H
    if PHASE != 2:
        for blk in range(first, N_BLOCKS, PROGRAMS_PER_HEAD):
            _kv_tile_stats(K, V, KeyBias, KSum, VSum, VMin, VMax, b, h, pid_bh, blk, stride_kb, stride_kh,
                           stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd, N, D, N_BLOCKS,
                           BLOCK, HEAD_DIM, SMOOTH_K, SMOOTH_V, V_RANGE, KEY_MASK)
        tl.debug_barrier()  # every thread's partials written before the count says so (release below)
        done = tl.atomic_add(Sync + 1 + pid_bh, 1, sem="acq_rel")
        if done == PROGRAMS_PER_HEAD - 1:  # the last of its head: reduce the partials
            tl.debug_barrier()
            for c in tl.static_range(0, HEAD_DIM, CHANNELS):
                _kv_finish_channels(KSum, VSum, VMin, VMax, KeyBias, KMean, VMean, VScale, VInvScale, pid_bh,
                                    c + tl.arange(0, CHANNELS), H, N, D, N_BLOCKS, HEAD_DIM, SMOOTH_K,
                                    SMOOTH_V, V_RANGE, KEY_MASK, 64, 1024)
            tl.debug_barrier()
            tl.atomic_xchg(Sync + 1 + BH + pid_bh, 1, sem="release")
    if PHASE == 0:
        while tl.atomic_add(Sync + 1 + BH + pid_bh, 0, sem="acquire") == 0:
            pass
        tl.debug_barrier()
    if PHASE != 1:
        for blk in range(first, N_BLOCKS, PROGRAMS_PER_HEAD):
            _quant_kv_tile(K, V, KeyBias, KMean, VMean, VInvScale, K8, KScale, VQ, b, h, pid_bh, blk, stride_kb,
                           stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd, N, D,
                           N_PAD, BLOCK, HEAD_DIM, SMOOTH_K, SMOOTH_V, K_PER_TOKEN, FP8, EXACT_FP8_CAST,
                           KEY_MASK, PERMUTE_KEYS)


def programs_per_head(n_blocks: int, device: torch.device) -> int:
    """At most one program per SM for each head, so that a head's programs can all be resident (on a CPU,
    under the interpreter, one per tile)."""
    if device.type != "cuda":
        return n_blocks
    return max(1, min(n_blocks, torch.cuda.get_device_properties(device).multi_processor_count))


def quantize_kv(k, v, k8, k_scale, vq, *, d_pad: int, block: int, smooth_k: bool, smooth_v: bool, fp8: bool,
                k_per_token: bool, key_bias=None, permute_keys: bool = False, num_warps: int = 4):
    """Fill k8, k_scale and vq (as `triton_quant._quant_kv_kernel` does) in one launch; returns
    (k_mean, v_mean, v_scale), each fp32 [B*H, d_pad] or None. Needs statistics (smooth_k, smooth_v or fp8)."""
    B, H, N, D = k.shape
    nb = triton.cdiv(N, block)
    n_pad = k8.shape[2]
    dev = k.device
    part = lambda flag: torch.empty(B * H, nb, d_pad, dtype=torch.float32, device=dev) if flag else None
    final = lambda flag: torch.empty(B * H, d_pad, dtype=torch.float32, device=dev) if flag else None
    ksum, vsum, vmin, vmax = part(smooth_k), part(smooth_v), part(fp8), part(fp8)
    k_mean, v_mean, v_scale, v_inv = final(smooth_k), final(smooth_v), final(fp8), final(fp8)
    sync = torch.zeros(1 + 2 * B * H, dtype=torch.int32, device=dev)
    dummy = k_scale
    interp = interpreting()
    per_head = programs_per_head(nb, dev)
    args = (k, v, key_bias if key_bias is not None else dummy,
            *(t if t is not None else dummy for t in (ksum, vsum, vmin, vmax, k_mean, v_mean, v_scale, v_inv)),
            k8, k_scale, vq, sync, *k.stride(), *v.stride(), H, B * H, N, D, n_pad, nb, per_head)
    meta = dict(BLOCK=block, HEAD_DIM=d_pad, CHANNELS=min(32, d_pad), SMOOTH_K=smooth_k, SMOOTH_V=smooth_v,
                V_RANGE=fp8, K_PER_TOKEN=k_per_token, FP8=fp8, EXACT_FP8_CAST=interp,
                KEY_MASK=key_bias is not None, PERMUTE_KEYS=permute_keys and fp8, num_warps=num_warps,
                enable_fp_fusion=True)
    grid = (B * H * per_head,)
    if interp:  # programs run one after another here: statistics first, then quantization
        _kv_onepass_kernel[grid](*args, PHASE=STATS_ONLY, **meta)
        _kv_onepass_kernel[grid](*args, PHASE=QUANT_ONLY, **meta)
    else:
        _kv_onepass_kernel[grid](*args, PHASE=STATS_AND_QUANT, **meta)
    return k_mean, v_mean, v_scale
