"""FID/KID known answers, and the Inception loaders on stand-ins."""

import math

import numpy as np
import pytest
import torch

from sagegen.eval import fid
from sagegen.testing.metric_standins import write_tiny_inception
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
    assert mean == pytest.approx(_kid_brute(x, y), rel=1e-10)
    assert std is None  # one subset: a std of 0.0 would claim a certainty nobody measured
    far, _ = fid.kid_from_features(x, y + 2.0, n_subsets=3, subset_size=12)
    assert far > mean


def test_kid_std_over_several_subsets_and_warnings_say_which():
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(30, 5)), rng.normal(size=(20, 5))
    _, std = fid.kid_from_features(x, y, n_subsets=10)  # unequal sizes: 10 random subsets of 20
    assert std is not None and std > 0
    one = fid.kid_warning(15, one_subset=True)
    assert "no std" in one and "std across subsets" not in one
    assert "std across subsets" in fid.kid_warning(15, one_subset=False)
    assert fid.kid_warning(500, one_subset=True) is None


def test_fid_warning_threshold_names_the_real_dimension():
    assert "unreliable" in fid.fid_warning(100, 2048) and "< 2048, the feature dimension" in fid.fid_warning(100, 2048)
    assert fid.fid_warning(5000, 2048) is None
    small = fid.fid_warning(15, 32)  # the stand-in's 32-d features
    assert "< 32, the feature dimension" in small and "2048, the feature dimension" not in small
    between = fid.fid_warning(100, 32)  # full-rank covariance, still too few images
    assert "feature dimension" not in between and "unreliable" in between


def test_nan_never_becomes_a_perfect_fid():
    eye = np.eye(2)
    assert math.isnan(fid.frechet_distance(np.array([np.nan, 0.0]), eye, np.zeros(2), eye))
    assert fid.frechet_distance(np.zeros(2), eye, np.zeros(2), eye) == 0.0  # rounding below 0 still clamps
    feats = np.random.default_rng(6).normal(size=(10, 4))
    bad = feats.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="1 of 10 feature vectors hold NaN"):
        fid.fid_from_features(bad, feats)
    with pytest.raises(ValueError, match="NaN"):
        fid.kid_from_features(feats, bad)


def test_clean_resize_is_per_channel_float_bicubic_without_rounding():
    from PIL import Image

    frame = np.random.default_rng(7).integers(0, 256, (23, 37, 3), dtype=np.uint8)
    seen = []

    def identity(x):  # the network sees exactly what the resize produced
        seen.append(x.clone())
        return x

    ext = fid.FeatureExtractor(fn=identity, label="identity", comparable=False)
    ext(frame[None])
    got = seen[0][0].permute(1, 2, 0).numpy()
    want = np.stack([np.asarray(Image.fromarray(frame[..., c].astype(np.float32), mode="F")
                                .resize((299, 299), Image.BICUBIC)) for c in range(3)], axis=-1)
    assert np.allclose(got, np.clip(want, 0, 255), atol=1e-4)
    assert not np.allclose(got, np.round(got))  # not quantised back to integers
    uint8_path = np.asarray(Image.fromarray(frame).resize((299, 299), Image.BICUBIC)).astype(np.float32)
    assert np.abs(got - uint8_path).max() > 0.1


def test_torchscript_standin_extracts_and_identical_sets_give_zero(tmp_path):
    ext = fid.load_inception(resolve_inception(str(write_tiny_inception(tmp_path / "inc.pt"))))
    # the random stand-in is TorchScript too, and must not be called comparable to published FIDs
    assert ext.comparable is False and "32-d features" in ext.comparability and "TorchScript" in ext.label
    assert len(ext.sha256) == 64
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
    assert ext.comparable is False and "torchvision" in ext.comparability
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


def test_torchscript_with_2048_features_is_unverified_not_comparable(tmp_path):
    import warnings

    class Wide(torch.nn.Module):
        def forward(self, x: torch.Tensor, return_features: bool = False) -> torch.Tensor:
            return x.mean(dim=(2, 3)).repeat(1, 683)[:, :2048]

    path = tmp_path / "inception-2015-12-05.pt"  # the right name proves nothing
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.script(Wide()).save(str(path))
    ext = fid.load_inception(path)
    assert ext.comparable is None and "unverified" in ext.comparability
