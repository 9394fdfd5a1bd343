"""Known-answer tests for PSNR, SSIM, LPIPS and the confidence intervals."""

import math

import numpy as np
import pytest
import torch

from sagegen.eval import fidelity, stats
from sagegen.testing.metric_standins import write_tiny_lpips
from sagegen.eval.weights import WeightsMissing, resolve_lpips


def test_psnr_known_pair():
    a = np.full((1, 8, 8, 3), 100, np.uint8)
    b = a.copy()
    b[0, 0, 0, 0] = 110  # one value off by 10: MSE = 100 / 192
    mse = 100 / (8 * 8 * 3)
    assert fidelity.psnr_frames(b, a)[0] == pytest.approx(10 * math.log10(255**2 / mse), abs=1e-9)


def test_psnr_uniform_offset_and_cap():
    a = np.zeros((2, 4, 4, 3), np.uint8)
    b = a + 5
    v = fidelity.psnr_frames(b, a)
    assert v == pytest.approx([10 * math.log10(255**2 / 25)] * 2)
    assert fidelity.psnr_frames(a, a) == [fidelity.PSNR_CAP_DB, fidelity.PSNR_CAP_DB]


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="shapes differ"):
        fidelity.psnr_frames(np.zeros((1, 4, 4, 3), np.uint8), np.zeros((1, 4, 5, 3), np.uint8))


def test_ssim_identical_is_one_and_constant_images_known_answer():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (2, 24, 24, 3), dtype=np.uint8)
    assert fidelity.ssim_frames(x, x) == pytest.approx([1.0, 1.0], abs=1e-12)
    # constant images: variances are 0, so SSIM = (2ab + C1) / (a^2 + b^2 + C1)
    a, b = 80.0, 120.0
    c1 = (0.01 * 255) ** 2
    want = (2 * a * b + c1) / (a * a + b * b + c1)
    got = fidelity.ssim_frames(np.full((1, 16, 16, 3), b, np.uint8), np.full((1, 16, 16, 3), a, np.uint8))
    assert got[0] == pytest.approx(want, rel=1e-9)


def test_ssim_decreases_with_noise():
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, (1, 32, 32, 3), dtype=np.uint8)
    small = np.clip(x + rng.normal(0, 2, x.shape), 0, 255).astype(np.uint8)
    big = np.clip(x + rng.normal(0, 30, x.shape), 0, 255).astype(np.uint8)
    s_small, s_big = fidelity.ssim_frames(small, x)[0], fidelity.ssim_frames(big, x)[0]
    assert 0.0 < s_big < s_small < 1.0


def test_lpips_standin_identity_symmetry_monotone(tmp_path):
    model = fidelity.load_lpips(resolve_lpips(str(write_tiny_lpips(tmp_path / "lpips.pth"))))
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (2, 48, 48, 3), dtype=np.uint8)
    near = np.clip(x + rng.normal(0, 4, x.shape), 0, 255).astype(np.uint8)
    far = np.clip(x + rng.normal(0, 60, x.shape), 0, 255).astype(np.uint8)
    assert fidelity.lpips_frames(model, x, x) == pytest.approx([0.0, 0.0], abs=1e-7)
    d_near = fidelity.lpips_frames(model, near, x)
    assert d_near == pytest.approx(fidelity.lpips_frames(model, x, near), rel=1e-5)
    d_far = fidelity.lpips_frames(model, far, x)
    assert all(0 < n < f for n, f in zip(d_near, d_far))


def test_lpips_folder_layout_and_missing(tmp_path, monkeypatch):
    combined = torch.load(str(write_tiny_lpips(tmp_path / "c.pth")), weights_only=True)
    folder = tmp_path / "lp"
    folder.mkdir()
    torch.save({k: v for k, v in combined.items() if k.startswith("features.")}, str(folder / "alexnet-owt-test.pth"))
    with pytest.raises(WeightsMissing, match="linear-head"):
        resolve_lpips(str(folder))
    torch.save({k: v for k, v in combined.items() if k.startswith("lin")}, str(folder / "alex.pth"))
    state = resolve_lpips(str(folder))
    assert set(state) == set(combined)
    with pytest.raises(WeightsMissing, match="--lpips-weights"):
        resolve_lpips(str(tmp_path / "nope.pth"))
    monkeypatch.setattr("sagegen.eval.weights._alexnet_from_torch_cache", lambda: None)
    monkeypatch.delenv("SAGEGEN_LPIPS_WEIGHTS", raising=False)
    with pytest.raises(WeightsMissing, match="not found offline"):
        resolve_lpips(None)


def test_interval_constant_single_and_empty():
    r = stats.mean_ci([2.5, 2.5, 2.5])
    assert r["mean"] == 2.5 and r["ci"] == [2.5, 2.5] and r["n"] == 3
    assert stats.mean_ci([7.0])["ci"] is None  # one value: its spread is unknown, so no interval
    assert stats.mean_ci([])["mean"] is None


def test_interval_is_student_t():
    v = [1.0, 2.0, 4.0, 8.0, 9.5]
    r = stats.mean_ci(v)
    half = 2.7764451051977987 * np.std(v, ddof=1) / math.sqrt(5)  # t(0.975, 4)
    assert r["ci"] == pytest.approx([np.mean(v) - half, np.mean(v) + half])


def test_paired_delta():
    base = [1.0, 2.0, 3.0, 4.0]
    cand = [1.5, 2.5, 3.5, 4.5]
    r = stats.paired_delta_ci(cand, base)
    assert r["mean"] == pytest.approx(0.5) and r["ci"] == [0.5, 0.5]
    with pytest.raises(ValueError):
        stats.paired_delta_ci([1.0], [1.0, 2.0])
