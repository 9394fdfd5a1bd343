"""The FID Inception network for pytorch-fid's weights (``pt_inception-2015-12-05-*.pth``).

Those weights are a port of the TensorFlow graph that defined FID, and that graph differs from torchvision's
``Inception3`` in two ways that change the features (by ~40% on random weights), so they must not be run
through plain ``Inception3``:

* the average pool in the pooling branch of the 35x35, 17x17 and first 8x8 mixed blocks (Mixed_5b-d,
  Mixed_6b-e, Mixed_7b) divides by the number of *real* pixels in the 3x3 window (TF's "SAME" padding),
  where torchvision counts the zero padding too (so border pixels come out darker);
* the last mixed block (Mixed_7c) pools its pooling branch with a 3x3 *max* pool, not an average.

The classifier has 1008 classes (the TF graph's), and there are no auxiliary logits. Everything else
(the stem, the reduction blocks Mixed_6a / Mixed_7a, the final global average pool) is torchvision's.

The parameters are torchvision's modules, loaded strictly from the state dict; only the forward pass of the
mixed blocks is re-written here, from the layer names. Input: Nx3x299x299 in [-1, 1]; output: Nx2048.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FID_CLASSES = 1008  # the TF Inception graph's classifier size; torchvision's ImageNet weights have 1000
# torch hub names weight files name-<first 8 hex digits of their sha256>.pth; pytorch-fid's release file is
# pt_inception-2015-12-05-6726825d.pth
PYTORCH_FID_SHA256_PREFIX = "6726825d"
_REAL_PIXEL_AVG = ("Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6b", "Mixed_6c", "Mixed_6d", "Mixed_6e", "Mixed_7b")
_MAX_POOL = ("Mixed_7c",)
_STEM = ("Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "maxpool1", "Conv2d_3b_1x1", "Conv2d_4a_3x3",
         "maxpool2")
_MIXED = ("Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c", "Mixed_6d", "Mixed_6e",
          "Mixed_7a", "Mixed_7b", "Mixed_7c")


def is_fid_state_dict(state: dict) -> bool:
    """pytorch-fid's FID Inception: 1008 classes and no auxiliary classifier."""
    fc = state.get("fc.weight")
    return fc is not None and int(fc.shape[0]) == FID_CLASSES and not any(k.startswith("AuxLogits.") for k in state)


def pool_branch(x: torch.Tensor, kind: str) -> torch.Tensor:
    """The 3x3, stride 1 pool feeding a mixed block's ``branch_pool`` conv: ``avg`` over the real pixels
    only (padding not counted), or ``max``."""
    if kind == "max":
        return F.max_pool2d(x, kernel_size=3, stride=1, padding=1)
    return F.avg_pool2d(x, kernel_size=3, stride=1, padding=1, count_include_pad=False)


def _split(block, names_a: tuple[str, ...], names_b: tuple[str, str], x: torch.Tensor) -> torch.Tensor:
    """Run convs ``names_a`` in sequence, then the two parallel ``names_b`` on the result, concatenated."""
    for n in names_a:
        x = getattr(block, n)(x)
    return torch.cat([getattr(block, n)(x) for n in names_b], 1)


def _chain(block, names: tuple[str, ...], x: torch.Tensor) -> torch.Tensor:
    for n in names:
        x = getattr(block, n)(x)
    return x


def mixed_forward(block, x: torch.Tensor, pool: str) -> torch.Tensor:
    """One torchvision InceptionA / InceptionC / InceptionE block with the TF graph's pooling branch.
    The branch order (1x1, then the wider branches, pool last) is torchvision's and the TF graph's."""
    if hasattr(block, "branch5x5_1"):  # InceptionA (35x35)
        branches = [block.branch1x1(x), _chain(block, ("branch5x5_1", "branch5x5_2"), x),
                    _chain(block, ("branch3x3dbl_1", "branch3x3dbl_2", "branch3x3dbl_3"), x)]
    elif hasattr(block, "branch7x7_1"):  # InceptionC (17x17)
        branches = [block.branch1x1(x), _chain(block, ("branch7x7_1", "branch7x7_2", "branch7x7_3"), x),
                    _chain(block, tuple(f"branch7x7dbl_{i}" for i in range(1, 6)), x)]
    elif hasattr(block, "branch3x3_2a"):  # InceptionE (8x8)
        branches = [block.branch1x1(x), _split(block, ("branch3x3_1",), ("branch3x3_2a", "branch3x3_2b"), x),
                    _split(block, ("branch3x3dbl_1", "branch3x3dbl_2"), ("branch3x3dbl_3a", "branch3x3dbl_3b"), x)]
    else:
        raise TypeError(f"{type(block).__name__} is not an Inception mixed block with a pooling branch")
    branches.append(block.branch_pool(pool_branch(x, pool)))
    return torch.cat(branches, 1)


class FIDInception(torch.nn.Module):
    """torchvision's Inception3 parameters, run the way the TF FID graph (and pytorch-fid) runs them."""

    def __init__(self, state: dict) -> None:
        super().__init__()
        from torchvision.models import Inception3

        self.net = Inception3(num_classes=FID_CLASSES, aux_logits=False, transform_input=False, init_weights=False)
        self.net.load_state_dict(state, strict=True)
        self.net.eval()

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Nx3x299x299 in [-1, 1] -> Nx2048 pool features."""
        for name in _STEM:
            x = getattr(self.net, name)(x)
        for name in _MIXED:
            block = getattr(self.net, name)
            if name in _REAL_PIXEL_AVG:
                x = mixed_forward(block, x, "avg")
            elif name in _MAX_POOL:
                x = mixed_forward(block, x, "max")
            else:  # the reduction blocks (Mixed_6a, Mixed_7a) are the same in both graphs
                x = block(x)
        return F.adaptive_avg_pool2d(x, 1).flatten(1)
