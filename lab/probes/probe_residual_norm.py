"""Probe: Wan's block element-wise work, diffusers' eager ops vs `residual_norm` (one Triton pass), at the
hidden-state sizes of Wan2.1-14B 720p and Wan2.1-1.3B 480p. Prints ms per block and effective GB/s.

    python lab/probes/probe_residual_norm.py
"""

from __future__ import annotations

import torch

from sagegen.kernels.triton_residual_norm import residual_norm, residual_norm_reference


def _time(fn, reps=20):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def block(impl, x, y, mods, w, b):
    shift, scale, gate, c_shift, c_scale, c_gate = mods
    _, n = impl(x, scale=scale, shift=shift)
    x1, n = impl(x, y, gate, weight=w, bias=b)
    x2, n = impl(x1, y, scale=c_scale, shift=c_shift)
    return impl(x2, y, c_gate, norm=False)[0]


def main():
    for name, s, c in (("wan2.1-14b 720p", 75_600, 5120), ("wan2.1-1.3b 480p", 32_760, 1536)):
        x = torch.randn(1, s, c, device="cuda", dtype=torch.bfloat16)
        y = torch.randn_like(x)
        mods = [torch.randn(1, 1, c, device="cuda") * 0.1 for _ in range(6)]
        w, b = torch.randn(c, device="cuda"), torch.randn(c, device="cuda")
        eager = _time(lambda: block(residual_norm_reference, x, y, mods, w, b))
        fused = _time(lambda: block(residual_norm, x, y, mods, w, b))
        ref, out = block(residual_norm_reference, x, y, mods, w, b), block(residual_norm, x, y, mods, w, b)
        moved = 2 * s * c * (2 + 4 + 5 + 3)  # bytes the four fused passes must move (bf16 rows)
        print(f"{name}: eager {eager:.3f} ms/block, fused {fused:.3f} ms/block ({eager / fused:.2f}x, "
              f"{moved / fused / 1e6:.0f} GB/s); max |diff| {float((out.float() - ref.float()).abs().max()):.3g}")


if __name__ == "__main__":
    main()
