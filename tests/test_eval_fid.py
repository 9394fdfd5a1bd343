"""FID/KID known answers, and the Inception loaders on stand-ins."""

import numpy as np
import pytest
import torch

from sagegen.eval import fid
from sagegen.eval.standins import write_tiny_inception
from sagegen.eval.weights import WeightsMissing, resolve_inception


def test_frechet_distance_closed_form_diagonal():
    mu1, mu2 = np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, 0.0])
    v1, v2 = np.array([1.0, 4.0, 9.0]), np.array([4.0, 1.0, 1.0])
    want = np.sum((mu1 - mu2) ** 2) + np.sum(v1 + v2 - 2 * np.sqrt(v1 * v2))
    assert fid.frechet_distance(mu1, np.diag(v1), mu2, np.diag(v2)) == pytest.approx(want, rel=1e-10)


def test_fid_identical_sets_is_zero_even_when_rank_deficient():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(20, 64))  # N < dim: singular covariance
    assert fid.fid_from_features(a, a) == pytest.approx(0.0, abs=1e-8)
    b = a + 3.0
    assert fid.fid_from_features(a, b) == pytest.approx(64 * 9.0, rel=1e-6)  # pure mean shift


def test_fid_non_diagonal_against_scipy_sqrtm():
    from scipy import linalg

    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(300, 6)), rng.normal(size=(300, 6)) @ rng.normal(size=(6, 6)) + 0.5
    mu1, s1 = a.mean(0), np.cov(a, rowvar=False)
    mu2, s2 = b.mean(0), np.cov(b, rowvar=False)
    ref = np.sum((mu1 - mu2) ** 2) + np.trace(s1 + s2 - 2 * linalg.sqrtm(s1 @ s2).real)
    assert fid.fid_from_features(a, b) == pytest.approx(ref, rel=1e-8)


def _kid_brute(x, y):
    m, d = len(x), x.shape[1]
    k = lambda p, q: (p @ q / d + 1) ** 3  # noqa: E731
    sxx = sum(k(x[i], x[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
    syy = sum(k(y[i], y[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
    sxy = sum(k(x[i], y[j]) for i in range(m) for j in range(m)) / (m * m)
    return sxx + syy - 2 * sxy


def test_kid_matches_brute_force_and_grows_with_shift():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(12, 5)), rng.normal(size=(12, 5)) + 0.3
    mean, std = fid.kid_from_features(x, y, n_subsets=3, subset_size=12)  # subset = whole set
    assert mean == pytest.approx(_kid_brute(x, y), rel=1e-10) and std == pytest.approx(0.0, abs=1e-12)
    far, _ = fid.kid_from_features(x, y + 2.0, n_subsets=3, subset_size=12)
    assert far > mean


def test_fid_warning_threshold():
    assert "unreliable" in fid.fid_warning(100, 2048)
    assert fid.fid_warning(5000, 2048) is None


def test_torchscript_standin_extracts_and_identical_sets_give_zero(tmp_path):
    ext = fid.load_inception(resolve_inception(str(write_tiny_inception(tmp_path / "inc.pt"))))
    assert ext.comparable and "TorchScript" in ext.label
    rng = np.random.default_rng(3)
    frames = rng.integers(0, 256, (6, 40, 56, 3), dtype=np.uint8)
    f = ext(frames)
    assert f.shape == (6, 32) and np.isfinite(f).all()
    assert fid.fid_from_features(f, f) == pytest.approx(0.0, abs=1e-9)
    other = ext(np.clip(frames.astype(int) + 90, 0, 255).astype(np.uint8))
    assert fid.fid_from_features(f, other) > 1e-6


def test_torchvision_inception_state_dict(tmp_path):
    from torchvision.models import Inception3

    torch.manual_seed(0)
    path = tmp_path / "inception_v3_test.pth"
    torch.save(Inception3(num_classes=10, aux_logits=False, init_weights=False).state_dict(), str(path))
    ext = fid.load_inception(path)
    assert not ext.comparable
    f = ext(np.random.default_rng(4).integers(0, 256, (2, 30, 30, 3), dtype=np.uint8))
    assert f.shape == (2, 2048)


def test_bad_and_missing_inception_weights(tmp_path, monkeypatch):
    monkeypatch.delenv("SAGEGEN_INCEPTION_WEIGHTS", raising=False)
    with pytest.raises(WeightsMissing, match="--inception-weights"):
        resolve_inception(None)
    with pytest.raises(WeightsMissing, match="not found"):
        resolve_inception(str(tmp_path / "missing.pt"))
    junk = tmp_path / "junk.pth"
    torch.save({"a": torch.zeros(1)}, str(junk))
    with pytest.raises(ValueError, match="not torchvision Inception"):
        fid.load_inception(junk)
