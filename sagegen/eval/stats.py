"""Confidence intervals for means and paired deltas over samples, and number formatting for tables.

The interval is Student's t on the mean with a cluster-robust standard error: samples that share a prompt
(several seeds per prompt) are one cluster, so the interval reflects the spread between prompts, not the
much smaller spread between seeds of one prompt; with one sample per prompt it is the textbook t interval.
A percentile bootstrap was used before: it covers only ~84% at n = 5 and ~90% at n = 10-34 for a nominal
95% (it ignores that the spread itself is estimated), while t holds its level at these sizes for roughly
normal per-sample scores (tests/eval/test_eval_stats.py simulates it). Strongly skewed scores at n = 5 still
under-cover somewhat; no interval fixes that at such sizes.
"""

from __future__ import annotations

import math
from typing import Hashable, Sequence

import numpy as np

CI_LEVEL = 0.95
METHOD = "student-t"


def _t_quantile(p: float, df: int) -> float:
    from scipy.stats import t

    return float(t.ppf(p, df))


def mean_ci(values: Sequence[float], groups: Sequence[Hashable] | None = None, level: float = CI_LEVEL) -> dict:
    """Mean of ``values`` with a Student-t interval; ``groups`` (e.g. each sample's prompt) marks samples
    that are not independent of each other.

    Returns ``{"mean", "ci": [lo, hi], "n", "level", "clusters"}``. ``ci`` is None when fewer than two
    independent units (clusters) hold finite values, since their spread cannot be estimated; it collapses
    to the mean when every value is equal."""
    v = np.asarray([float(x) for x in values], dtype=np.float64)
    g = list(groups) if groups is not None else list(range(len(v)))
    if len(g) != len(v):
        raise ValueError(f"groups has {len(g)} entries for {len(v)} values")
    keep = np.isfinite(v)
    v = v[keep]
    g = [x for x, k in zip(g, keep) if k]
    n = int(v.size)
    clusters = len(set(g))
    out = {"mean": None, "ci": None, "n": n, "level": level, "clusters": clusters}
    if n == 0:
        return out
    mean = float(v.mean())
    out["mean"] = mean
    if clusters < 2:
        return out
    if np.all(v == v[0]):
        out["ci"] = [mean, mean]
        return out
    # cluster-robust (CR1) variance of the mean: sums of residuals per cluster, small-sample factor G/(G-1)
    resid = v - mean
    sums: dict = {}
    for key, r in zip(g, resid):
        sums[key] = sums.get(key, 0.0) + r
    var = clusters / (clusters - 1) * sum(s * s for s in sums.values()) / (n * n)
    half = _t_quantile(0.5 + level / 2, clusters - 1) * math.sqrt(var)
    out["ci"] = [mean - half, mean + half]
    return out


def paired_delta_ci(candidate: Sequence[float], baseline: Sequence[float],
                    groups: Sequence[Hashable] | None = None, level: float = CI_LEVEL) -> dict:
    """Mean of the per-sample differences ``candidate - baseline`` with its interval (see :func:`mean_ci`)."""
    c = np.asarray(candidate, dtype=np.float64)
    b = np.asarray(baseline, dtype=np.float64)
    if c.shape != b.shape:
        raise ValueError(f"paired delta needs equal lengths, got {c.shape} and {b.shape}")
    return mean_ci(c - b, groups=groups, level=level)


def fmt_num(v, digits: int = 4, sign: bool = False) -> str:
    """A number for a table cell; None/NaN/inf (stored as null in metrics.json) show as "—"."""
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        return "—"
    return f"{v:+.{digits}f}" if sign else f"{v:.{digits}f}"


def fmt_counts(n: dict | None, unit: str = "images") -> str:
    """``{"sdpa": 27, "sage": 27}`` -> ``27 images each (sdpa, sage)``, or ``sdpa 27, sage 20 images``."""
    if not n:
        return f"? {unit}"
    values = set(n.values())
    if len(values) == 1:
        return f"{next(iter(values))} {unit} each ({', '.join(n)})" if len(n) > 1 else f"{next(iter(values))} {unit}"
    return ", ".join(f"{k} {v}" for k, v in n.items()) + f" {unit}"


def fmt_ci(entry: dict | None, digits: int = 4) -> str:
    """``mean [lo, hi]`` for a table cell."""
    if not entry or fmt_num(entry.get("mean")) == "—":
        return "—"
    m = entry["mean"]
    ci = entry.get("ci")
    s = f"{m:.{digits}f}"
    if ci and entry.get("n", 0) > 1 and None not in ci and not math.isclose(ci[0], ci[1]):
        s += f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"
    return s
