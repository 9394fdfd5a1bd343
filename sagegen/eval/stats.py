"""Bootstrap confidence intervals for means and paired deltas over samples."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

N_BOOT = 2000
CI_LEVEL = 0.95


def _finite(values: Sequence[float]) -> np.ndarray:
    v = np.asarray([float(x) for x in values], dtype=np.float64)
    return v[np.isfinite(v)]


def bootstrap_mean_ci(
    values: Sequence[float], n_boot: int = N_BOOT, level: float = CI_LEVEL, seed: int = 0
) -> dict:
    """Mean of ``values`` with a percentile-bootstrap CI (resampling the values with replacement).

    Returns ``{"mean", "ci": [lo, hi], "n", "level"}``; with one value the interval collapses to it, and
    ``ci`` is None when there are no finite values."""
    v = _finite(values)
    n = int(v.size)
    if n == 0:
        return {"mean": None, "ci": None, "n": 0, "level": level}
    mean = float(v.mean())
    if n == 1 or np.all(v == v[0]):
        return {"mean": mean, "ci": [mean, mean], "n": n, "level": level}
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    means = v[idx].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return {"mean": mean, "ci": [float(lo), float(hi)], "n": n, "level": level}


def paired_delta_ci(
    candidate: Sequence[float], baseline: Sequence[float], n_boot: int = N_BOOT, level: float = CI_LEVEL, seed: int = 0
) -> dict:
    """Mean of the per-sample differences ``candidate - baseline`` with a bootstrap CI over samples."""
    c = np.asarray(candidate, dtype=np.float64)
    b = np.asarray(baseline, dtype=np.float64)
    if c.shape != b.shape:
        raise ValueError(f"paired delta needs equal lengths, got {c.shape} and {b.shape}")
    return bootstrap_mean_ci(c - b, n_boot=n_boot, level=level, seed=seed)


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
