"""Tiny random-weight stand-ins for the metric networks (CLIP, Inception, LPIPS), written to disk in the
same formats as the real weights so the real loading code runs on them. For tests and offline demos only:
scores from random weights mean nothing."""

from __future__ import annotations

import json
from pathlib import Path

import torch

TINY_CLIP_CFG = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


def write_tiny_clip(folder: str | Path, seed: int = 0, weights: bool = True) -> Path:
    """A ``local-dir:`` CLIP folder: open_clip_config.json + open_clip_model.safetensors (random weights)."""
    import open_clip
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = open_clip.CLIP(**TINY_CLIP_CFG)
    cfg = {"model_cfg": TINY_CLIP_CFG, "preprocess_cfg": {"mean": [0.48145466, 0.4578275, 0.40821073],
                                                          "std": [0.26862954, 0.26130258, 0.27577711]}}
    (folder / "open_clip_config.json").write_text(json.dumps(cfg))
    if weights:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                  str(folder / "open_clip_model.safetensors"))
    return folder


class _TinyInception(torch.nn.Module):
    """Conv features + global pooling, with the ``return_features`` keyword of the TorchScript FID models."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 5, stride=4)
        self.conv2 = torch.nn.Conv2d(16, dim, 3, stride=2)

    def forward(self, x: torch.Tensor, return_features: bool = False) -> torch.Tensor:
        x = x / 127.5 - 1.0
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        f = x.mean(dim=(2, 3))
        return f if return_features else f.sum(dim=1, keepdim=True)


def write_tiny_inception(path: str | Path, seed: int = 0, dim: int = 32) -> Path:
    """A TorchScript feature extractor file, loaded like ``inception-2015-12-05.pt``."""
    import warnings

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        m = torch.jit.script(_TinyInception(dim).eval())
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    m.save(str(path))
    return path


def write_tiny_lpips(path: str | Path, seed: int = 0) -> Path:
    """A combined LPIPS state dict (torchvision AlexNet ``features.*`` + ``lin{i}.model.1.weight``), random."""
    from sagegen.eval.fidelity import LPIPS

    torch.manual_seed(seed)
    m = LPIPS()
    state = {f"features.{k}": v for k, v in m.features.state_dict().items()}
    for i, lin in enumerate(m.lins):
        state[f"lin{i}.model.1.weight"] = torch.rand_like(lin.weight) * 0.1  # LPIPS heads are non-negative
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, str(path))
    return path
