"""Evaluation of a run directory: CLIP text/temporal scores, FID/KID, and paired fidelity vs the baseline.

Entry point: :func:`sagegen.eval.runner.evaluate` (used by ``sagegen eval``). Metric weights are resolved
offline only (:mod:`sagegen.eval.weights`); a metric whose weights are missing is skipped with a reason.
"""

METRICS = ("clipsim", "clipt", "clipscore", "fid", "kid", "psnr", "ssim", "lpips")

__all__ = ["METRICS"]
