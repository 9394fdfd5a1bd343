"""`SparseConfig`: which attention blocks a sparse call computes, and when a patched model uses sparsity.

A config has two halves:
- the per-call part (``mode``, ``value``, the judge and the always-keep rules, a static pattern's grid),
  which `sagegen.sageattn(..., sparse=...)` turns into a block mask inside its custom op; it travels
  through the op as a short string (`to_spec` / `parse_spec`), so ``torch.compile`` sees a constant;
- the policy part (``dense_steps``, ``dense_blocks``, ``min_tokens``, per-layer ``layer_values`` from
  `sagegen calibrate`), which only `sagegen.patch(pipe, sparse=...)` reads.

Text form (CLI ``--sparse``): ``topk=0.5``, ``cdf=0.95``, ``sta:f=3,h=3,w=3``, ``radial:w=4,decay=2``,
``calib=FILE``, with options after commas: ``topk=0.5,sim=0.3,steps=0.25,blocks=0``.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Literal

Mode = Literal["topk", "cdf", "sta", "radial"]
MODES = ("topk", "cdf", "sta", "radial")
PREDICTED = ("topk", "cdf")
STATIC = ("sta", "radial")
TOKEN_ORDERS = ("video_text", "text_video")


@dataclass(frozen=True)
class SparseConfig:
    """Block sparsity for attention.

    Per call:
        mode: ``"topk"`` (keep the ``value`` fraction of key blocks with the highest predicted weight per
            query block), ``"cdf"`` (keep the fewest key blocks whose predicted weight adds up to ``value``),
            ``"sta"`` (sliding-tile window on the latent grid), ``"radial"`` (window shrinking with temporal
            distance, plus an attention sink).
        value: topk: fraction of key blocks in (0, 1]; cdf: probability mass in (0, 1]. Unused by static modes.
        sim_threshold: the self-similarity judge: a query block whose tokens' mean cosine to their block mean
            is below this is computed densely, a key block below it is kept for every query. 0 disables.
        keep_first: always keep the first key block (an attention sink).
        keep_diagonal: always keep each query block's own key block (self-attention, Nq == Nk).
        text: token range [start, stop) of text / condition tokens (negative = from the end): those keys are
            always kept and those queries are computed densely. ``None``: no such tokens.
        grid: (frames, height, width) of the video tokens in the latent, for static modes; ``token_order``
            says where the text tokens are (``"video_text"``: after the video, ``"text_video"``: before).
        window: static window (frames, height, width) in tokens, each side of the query (STA), or the spatial
            window at temporal distance 0 (radial, frames ignored).
        decay: radial: the spatial window halves every ``decay`` frames of temporal distance.
    Policy (`sagegen.patch` only):
        dense_steps: the first fraction of denoising steps stays dense (default 0.25).
        dense_blocks: main-block indices / module names that stay dense (default the first block).
        min_tokens: calls with fewer keys (or queries) stay dense, and so does cross-attention (Nq != Nk).
        layer_values: per attention-module name, its own ``value`` (from `sagegen calibrate`).
    """

    mode: Mode = "topk"
    value: float = 0.5
    sim_threshold: float = 0.0
    keep_first: bool = True
    keep_diagonal: bool = True
    text: tuple[int, int] | None = None
    grid: tuple[int, int, int] | None = None
    token_order: str = "video_text"
    window: tuple[int, int, int] = (3, 8, 8)
    decay: int = 2
    dense_steps: float = 0.25
    dense_blocks: tuple[int | str, ...] = (0,)
    min_tokens: int = 4096
    layer_values: dict[str, float] = field(default_factory=dict, hash=False, compare=True)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"SparseConfig.mode={self.mode!r} is not allowed; choose one of {MODES}")
        _unit("value", self.value)
        if not 0.0 <= float(self.sim_threshold) <= 1.0:
            raise ValueError(f"SparseConfig.sim_threshold must be in [0, 1], got {self.sim_threshold!r}")
        if not 0.0 <= float(self.dense_steps) <= 1.0:
            raise ValueError(f"SparseConfig.dense_steps must be a fraction in [0, 1], got {self.dense_steps!r}")
        if self.text is not None:
            t = tuple(self.text)
            if len(t) != 2 or not all(isinstance(x, int) for x in t):
                raise ValueError(f"SparseConfig.text must be None or (start, stop) ints, got {self.text!r}")
            object.__setattr__(self, "text", t)
        if self.grid is not None:
            g = tuple(self.grid)
            if len(g) != 3 or not all(isinstance(x, int) and x >= 1 for x in g):
                raise ValueError(f"SparseConfig.grid must be (frames, height, width) ints >= 1, got {self.grid!r}")
            object.__setattr__(self, "grid", g)
        if self.mode in STATIC and self.grid is None:
            pass  # the patch fills the grid in per family; sageattn refuses a static mode without one
        w = tuple(self.window)
        if len(w) != 3 or not all(isinstance(x, int) and x >= 0 for x in w):
            raise ValueError(f"SparseConfig.window must be (frames, height, width) ints >= 0, got {self.window!r}")
        object.__setattr__(self, "window", w)
        if self.token_order not in TOKEN_ORDERS:
            raise ValueError(f"SparseConfig.token_order={self.token_order!r}; choose one of {TOKEN_ORDERS}")
        if not isinstance(self.decay, int) or self.decay < 1:
            raise ValueError(f"SparseConfig.decay must be an int >= 1, got {self.decay!r}")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise ValueError(f"SparseConfig.min_tokens must be an int >= 0, got {self.min_tokens!r}")
        blocks = (self.dense_blocks,) if isinstance(self.dense_blocks, (int, str)) else tuple(self.dense_blocks)
        bad = [b for b in blocks if isinstance(b, bool) or not isinstance(b, (int, str)) or b == ""]
        if bad:  # checked here, not first when the patch resolves the names (after the model has loaded)
            raise ValueError(f"SparseConfig.dense_blocks entries must be block indices (int) or module names "
                             f"(non-empty str), got {bad[0]!r}")
        object.__setattr__(self, "dense_blocks", blocks)
        for name, v in dict(self.layer_values).items():
            _unit(f"layer_values[{name!r}]", v)
        object.__setattr__(self, "layer_values", dict(self.layer_values))

    def replace(self, **changes) -> "SparseConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    # -- the per-call part as a string (the custom op's argument) ------------------------------------------
    def to_spec(self, value: float | None = None) -> str:
        """The per-call fields as a canonical string; ``value`` overrides ``self.value`` (a layer's own)."""
        parts = [f"mode={self.mode}", f"value={float(self.value if value is None else value)!r}",
                 f"sim={float(self.sim_threshold)!r}", f"first={int(self.keep_first)}",
                 f"diag={int(self.keep_diagonal)}"]
        if self.text is not None:
            parts.append(f"text={self.text[0]}:{self.text[1]}")
        if self.mode in STATIC:
            if self.grid is None:
                raise ValueError(f"SparseConfig(mode={self.mode!r}) needs grid=(frames, height, width) "
                                 "(sagegen.patch fills it in for video families)")
            parts += [f"grid={'x'.join(map(str, self.grid))}", f"order={self.token_order}",
                      f"window={'x'.join(map(str, self.window))}", f"decay={self.decay}"]
        return ";".join(parts)


def _unit(name: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 < float(v) <= 1.0:
        raise ValueError(f"SparseConfig.{name} must be a number in (0, 1], got {v!r}")


@functools.lru_cache(maxsize=256)
def parse_spec(spec: str) -> SparseConfig:
    """Inverse of `SparseConfig.to_spec` (cached: the op calls it once per distinct string)."""
    f = dict(p.split("=", 1) for p in spec.split(";") if p)
    kw: dict = dict(mode=f["mode"], value=float(f["value"]), sim_threshold=float(f["sim"]),
                    keep_first=f["first"] == "1", keep_diagonal=f["diag"] == "1")
    if "text" in f:
        a, b = f["text"].split(":")
        kw["text"] = (int(a), int(b))
    if "grid" in f:
        kw["grid"] = tuple(int(x) for x in f["grid"].split("x"))
        kw["token_order"] = f["order"]
        kw["window"] = tuple(int(x) for x in f["window"].split("x"))
        kw["decay"] = int(f["decay"])
    return SparseConfig(**kw)
