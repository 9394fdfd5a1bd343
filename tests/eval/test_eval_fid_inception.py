"""pytorch-fid's weights (pt_inception-*.pth) run through the FID network (issue 22, bug 4), checked three ways
on shared random weights: pooling against a sum/count formula written independently here, the whole network
against pytorch-fid (when installed, e.g. `pip install --target DIR --no-deps pytorch-fid` and DIR on
$SAGEGEN_TEST_PYTORCH_FID), and against plain torchvision Inception3, which must differ."""

import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sagegen.eval import fid
from sagegen.eval import fid_inception as FI


def _random_fid_state(seed: int = 0) -> dict:
    """pytorch-fid's layout (1008 classes, no aux logits) with random weights and non-trivial BN statistics."""
    from torchvision.models import Inception3

    torch.manual_seed(seed)
    net = Inception3(num_classes=FI.FID_CLASSES, aux_logits=False, init_weights=False)
    state = net.state_dict()
    for k, v in state.items():
        if k.endswith("running_mean"):
            v.normal_(0, 0.1)
        elif k.endswith("running_var"):
            v.uniform_(0.5, 2.0)
    return state


@pytest.fixture(scope="module")
def state():
    return _random_fid_state()


@pytest.fixture(scope="module")
def images():  # two 299x299 images in [-1, 1]; small-magnitude borders differ most between the poolings
    return torch.from_numpy(np.random.default_rng(1).uniform(-1, 1, (2, 3, 299, 299)).astype(np.float32))


def _sum_over_count_pool(x: torch.Tensor) -> torch.Tensor:
    """3x3 mean over the pixels that exist, as a ratio of two box sums (no avg_pool2d)."""
    c = x.shape[1]
    ones = torch.ones(c, 1, 3, 3, dtype=x.dtype)
    total = F.conv2d(F.pad(x, (1, 1, 1, 1)), ones, groups=c)
    count = F.conv2d(F.pad(torch.ones_like(x[:, :1]), (1, 1, 1, 1)), ones[:1])
    return total / count


def test_pool_branch_counts_real_pixels_only_and_max_in_the_last_block():
    x = torch.randn(2, 4, 7, 9, dtype=torch.float64)
    assert torch.allclose(FI.pool_branch(x, "avg"), _sum_over_count_pool(x))
    corner = x[0, 0, :2, :2].mean()  # a corner's window holds 4 real pixels
    assert FI.pool_branch(x, "avg")[0, 0, 0, 0] == pytest.approx(float(corner))
    pad = torch.full((2, 4, 9, 11), -torch.inf, dtype=torch.float64)
    pad[..., 1:-1, 1:-1] = x
    assert torch.equal(FI.pool_branch(x, "max"), pad.unfold(2, 3, 1).unfold(3, 3, 1).amax(dim=(-1, -2)))


def test_mixed_block_uses_the_fid_pool_not_torchvision_s(state):
    net = FI.FIDInception(state).net
    x = torch.randn(1, 192, 35, 35)
    block = net.Mixed_5b
    with torch.no_grad():
        ours = FI.mixed_forward(block, x, "avg")
        branch_pool = block.branch_pool(_sum_over_count_pool(x))
        tv = block(x)  # torchvision: padding counted
    assert torch.allclose(ours[:, -branch_pool.shape[1]:], branch_pool, atol=1e-5)
    assert torch.allclose(ours[:, :-branch_pool.shape[1]], tv[:, :-branch_pool.shape[1]], atol=1e-5)
    assert not torch.allclose(ours, tv, atol=1e-3)


def _pytorch_fid():
    extra = os.environ.get("SAGEGEN_TEST_PYTORCH_FID", "/tmp/pfid")
    if os.path.isdir(extra) and extra not in sys.path:
        sys.path.append(extra)
    try:
        from pytorch_fid import inception
    except ImportError:
        pytest.skip("pytorch-fid not installed (pip install --target /tmp/pfid --no-deps pytorch-fid)")
    return inception


def test_features_match_pytorch_fid_on_shared_random_weights(state, images, monkeypatch):
    pfid = _pytorch_fid()
    monkeypatch.setattr(pfid, "load_state_dict_from_url", lambda *a, **k: state)  # never downloads
    ref = pfid.InceptionV3([3], resize_input=False, normalize_input=False).eval()
    with torch.no_grad():
        want = ref(images)[0].flatten(1)
    got = FI.FIDInception(state)(images)
    assert got.shape == (2, 2048)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), float((got - want).abs().max())


def test_pt_inception_file_runs_the_fid_network_and_is_labelled(state, tmp_path):
    from torchvision.models import Inception3

    path = tmp_path / "pt_inception-2015-12-05-00000000.pth"
    torch.save(state, str(path))
    ext = fid.load_inception(path)
    assert "pytorch-fid" in ext.label and ext.comparable is None and "unverified" in ext.comparability
    assert "not the TF FID weights" not in ext.comparability
    frames = np.random.default_rng(2).integers(0, 256, (2, 40, 48, 3), dtype=np.uint8)
    f = ext(frames)
    x = torch.from_numpy(np.stack([fid.clean_resize(fr) for fr in frames])).permute(0, 3, 1, 2) / 127.5 - 1
    assert np.allclose(f, FI.FIDInception(state)(x).double().numpy(), rtol=1e-5, atol=1e-6)
    # plain torchvision Inception3 on the same weights (what sagegen used to run) gives other features
    tv = Inception3(num_classes=FI.FID_CLASSES, aux_logits=False, init_weights=False)
    tv.load_state_dict(state)
    tv.fc = torch.nn.Identity()
    with torch.no_grad():
        plain = tv.eval()(x).double().numpy()
    assert np.abs(plain - f).max() > 1e-2 * np.abs(f).max()


def test_pytorch_fid_release_file_is_recognised_by_its_sha256(state, tmp_path, monkeypatch):
    path = tmp_path / "pt_inception-2015-12-05-6726825d.pth"  # the right name alone proves nothing
    torch.save(state, str(path))
    assert fid.load_inception(path).comparable is None
    monkeypatch.setattr(FI, "PYTORCH_FID_SHA256_PREFIX", fid._sha256(path)[:8])  # stands in for the real file
    ext = fid.load_inception(path)
    assert ext.comparable is True and "pytorch-fid's port of the TF FID Inception" in ext.comparability
