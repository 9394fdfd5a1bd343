"""FID and KID entries of metrics.json: one number per pair of image sets (all frames of a variant), so no
per-sample values and no confidence interval; KID carries its std over random subsets where there are several."""

from __future__ import annotations

from typing import Any

import numpy as np

SET_METRICS = ("fid", "kid")


def set_metric(metric: str, baseline: str, candidates: list[str], feats: dict[str, list[np.ndarray]],
               reference: np.ndarray | None, extractor) -> dict:
    """``feats``: variant -> per-sample feature arrays; ``reference``: features of --reference or None.
    Raises (ValueError, LinAlgError, ...) when the sets cannot give a finite number; the caller records that
    as the metric's error."""
    from sagegen.eval import fid as fidmod

    sets = {v: np.concatenate(f) for v, f in feats.items() if f}
    missing = [v for v in (baseline, *candidates) if v not in sets]
    if missing:
        raise ValueError(f"no Inception features for {', '.join(missing)}")
    n = min(len(x) for x in sets.values())
    dim = int(next(iter(sets.values())).shape[1])
    one_subset = False

    def score(a: np.ndarray, b: np.ndarray) -> dict:
        nonlocal one_subset
        if metric == "fid":
            out = {"value": fidmod.fid_from_features(a, b)}
        else:
            mean, std = fidmod.kid_from_features(a, b)
            one_subset = one_subset or std is None
            out = {"value": mean, "std": std}
        if not np.isfinite(out["value"]):  # never store a NaN as if it were a score
            raise ValueError(f"{metric.upper()} came out {out['value']} (non-finite)")
        return out

    out: dict[str, Any] = {"status": "ok", "kind": "set", "extractor": extractor.label,
                           "comparable_to_published": extractor.comparable,
                           "n": {v: int(len(x)) for v, x in sets.items()}, "feature_dim": dim}
    if getattr(extractor, "comparability", ""):
        out["comparability"] = extractor.comparability
    if getattr(extractor, "sha256", None):
        out["extractor_sha256"] = extractor.sha256
    out["vs_baseline"] = {c: score(sets[c], sets[baseline]) for c in candidates}
    if reference is not None:
        out["n_reference"] = int(len(reference))
        out["vs_reference"] = {v: score(x, reference) for v, x in sets.items()}
        out["delta_vs_reference"] = {
            c: {"value": out["vs_reference"][c]["value"] - out["vs_reference"][baseline]["value"]}
            for c in candidates
        }
        n = min(n, len(reference))
    warn = fidmod.fid_warning(n, dim) if metric == "fid" else fidmod.kid_warning(n, one_subset)
    if warn:
        out["warning"] = warn
    return out
