"""Block-sparse attention inside a patched transformer: when a routed call runs sparse, and what it computed.

`SparseState` belongs to one patch. Per routed attention call it answers a `SparseConfig` or None (dense):
- dense for the first ``dense_steps`` fraction of the denoising steps (the step tracker's count);
- dense for the modules of ``dense_blocks`` (the first main block by default);
- dense for cross-attention (Nq != Nk; modules named ``attn2``), text-only attention (HunyuanVideo's token
  refiner) and short calls (fewer than ``min_tokens`` keys);
- otherwise the config, with the module's own ``layer_values`` entry (calibration), the text tokens' range
  and, for static patterns, the latent grid read from the transformer's input (a forward pre-hook reads
  ``hidden_states.shape``: no host sync).
It records, per (step, module), the realized density (the fraction of blocks computed) as device tensors,
turned into numbers (one host sync) only when `summary` is asked for.
"""

from __future__ import annotations

import dataclasses

import torch

from sagegen.sparse.sparse_config import STATIC, SparseConfig
from sagegen.sparse.patterns import VIDEO_TOKEN_ORDER
from sagegen.patch.precision_policy import PrecisionPolicy, resolve_blocks


def resolve_sparse(value) -> SparseConfig | None:
    """`patch(..., sparse=)`: None / False (off), a SparseConfig, or its CLI text (``"topk=0.5"``)."""
    if value is None or value is False:
        return None
    if isinstance(value, SparseConfig):
        return value
    if isinstance(value, str):
        from sagegen.sparse.text import SparseArgError, parse_sparse_arg

        try:
            return parse_sparse_arg(value)
        except SparseArgError as e:  # the spec's message names no option: say which argument it came from
            raise SparseArgError(f"sparse={value!r}: {e}") from None
    raise TypeError(f"sparse must be a sagegen.SparseConfig, a string such as 'topk=0.5', or None; got "
                    f"{type(value).__name__}")


_TEXT_ONLY = "token_refiner"  # HunyuanVideo's text refiner: self-attention over the prompt only


class SparseState:
    def __init__(self, cfg: SparseConfig, family: str, transformer: torch.nn.Module, attention_names: list[str]):
        self.cfg = cfg
        self.family = family
        blocks = tuple(b for b in cfg.dense_blocks)
        self.dense_names = (resolve_blocks(PrecisionPolicy(blocks=blocks), transformer, attention_names)
                            if blocks else frozenset())
        self.order = VIDEO_TOKEN_ORDER.get(family)
        self.grid: tuple[int, int, int] | None = cfg.grid
        self.tracker = None  # the patch's StepTracker (index, total), when dense_steps > 0
        self.records: list[tuple[int, str, torch.Tensor, int]] = []
        self._configs: dict[tuple, SparseConfig] = {}
        self._handle = None
        self.dense_step = False  # set per transformer call by the pre-hook
        if cfg.mode in STATIC and cfg.grid is None and self.order is None and family != "wan":
            raise ValueError(f"sparse mode {cfg.mode!r} needs the latent grid; sagegen knows the token order of "
                             f"{sorted(VIDEO_TOKEN_ORDER)} only ({family!r} given): pass SparseConfig(grid=...)")

    # -- installation -------------------------------------------------------------------------------------
    def attach(self, transformer: torch.nn.Module) -> None:
        """A forward pre-hook, registered after the step tracker's (so it sees this call's step): reads the
        latent grid from ``hidden_states.shape`` and decides once per transformer call whether this step is
        dense -- a bool, so that a compiled model guards on two values, not on the step index."""
        self._handle = transformer.register_forward_pre_hook(self._pre_hook, with_kwargs=True)

    def detach(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _pre_hook(self, module, args, kwargs):
        if self.cfg.grid is None:
            hs = kwargs.get("hidden_states", args[0] if args else None)
            if isinstance(hs, torch.Tensor):
                self.grid = latent_grid(module, self.family, hs.shape)
        self.dense_step = self._step_is_dense()
        return None

    def _step_is_dense(self) -> bool:
        if self.tracker is None or self.cfg.dense_steps <= 0:
            return False
        total = self.tracker.total
        return total is None or self.tracker.index < self.cfg.dense_steps * total

    # -- per call -----------------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        return self.tracker.index if self.tracker is not None else -1

    def for_call(self, name: str, q: torch.Tensor, k: torch.Tensor, q_offset: int | None = None
                 ) -> SparseConfig | None:
        """The config this routed call ([B, H, N, D] q and k) runs with, or None for dense. ``q_offset``: the
        queries are a window of a self-attention over the keys (a Ring's one call), not cross-attention."""
        cfg = self.cfg
        n_q, n_k = q.shape[2], k.shape[2]
        window = q_offset is not None and q_offset + n_q <= n_k
        if ((n_q != n_k and not window) or n_k < cfg.min_tokens or name in self.dense_names or name.endswith("attn2")
                or _TEXT_ONLY in name):
            return None
        if self.dense_step:
            return None
        grid = self.grid
        if grid is not None and grid[0] * grid[1] * grid[2] > n_k:
            grid = None  # not this sequence's grid (e.g. a text-only refiner)
        if cfg.mode in STATIC and grid is None:
            return None
        if torch.compiler.is_compiling():
            # made afresh while tracing (a constant of the graph): a cache filled inside traced code makes dynamo
            # guard on its contents, and the next step, finding its entry there, recompiled
            return self._call_config(name, grid, n_k)
        key = (name, grid, n_k)
        out = self._configs.get(key)
        if out is None:
            out = self._configs[key] = self._call_config(name, grid, n_k)
        return out

    def _call_config(self, name, grid, n_k) -> SparseConfig:
        cfg = self.cfg
        changes: dict = {"layer_values": {}}
        if name in cfg.layer_values:
            changes["value"] = cfg.layer_values[name]
        if grid is not None:
            changes["grid"] = grid
            changes["token_order"] = self.order or "video_text"
            video = grid[0] * grid[1] * grid[2]
            if cfg.text is None and video < n_k:
                changes["text"] = (video, n_k) if changes["token_order"] == "video_text" else (0, n_k - video)
        return dataclasses.replace(cfg, **changes)

    def record(self, name: str, counts: torch.Tensor, n_kv_blocks: int) -> None:
        if torch.compiler.is_compiling():
            return
        self.records.append((self.step, name, counts.sum(dtype=torch.int64), counts.numel() * n_kv_blocks))

    def summary(self) -> dict:
        """{"per_step_layer": [{"step", "layer", "density"}...], "per_step": {step: density}, "overall": float}
        (one host sync). Densities are fractions of the (q-block, kv-block) pairs computed by sparse calls,
        pooled over the calls (samples, CFG passes) of each step and layer; dense calls are not counted."""
        if not self.records:
            return {"per_step_layer": [], "per_step": {}, "overall": None}
        kept = torch.stack([r[2] for r in self.records]).tolist()
        cells: dict[tuple[int, str], list[int]] = {}
        for (step, name, _, n), k in zip(self.records, kept):
            c = cells.setdefault((step, name), [0, 0])
            c[0] += k
            c[1] += n
        rows, by_step = [], {}
        for (step, name), (k, n) in cells.items():
            rows.append({"step": step, "layer": name, "density": round(k / n, 4)})
            s = by_step.setdefault(step, [0, 0])
            s[0] += k
            s[1] += n
        total_k, total_n = sum(v[0] for v in by_step.values()), sum(v[1] for v in by_step.values())
        return {"per_step_layer": rows, "per_step": {str(s): round(k / n, 4) for s, (k, n) in by_step.items()},
                "overall": round(total_k / total_n, 4)}


def latent_grid(transformer: torch.nn.Module, family: str, shape) -> tuple[int, int, int] | None:
    """(frames, height, width) in tokens of a video transformer's input ``hidden_states`` shape."""
    cfg = getattr(transformer, "config", None)
    if cfg is None or len(shape) != 5:
        return None
    p = getattr(cfg, "patch_size", 1) or 1
    if isinstance(p, (tuple, list)):  # Wan: (t, h, w)
        pt, ph, pw = p
    else:
        pt, ph, pw = (getattr(cfg, "patch_size_t", None) or 1), p, p
    if family == "cogvideox":  # [B, F, C, H, W]
        f, h, w = shape[1], shape[3], shape[4]
    else:  # [B, C, F, H, W]
        f, h, w = shape[2], shape[3], shape[4]
    return (-(-f // pt), h // ph, w // pw)


def block_mask_for(session, q: torch.Tensor, k: torch.Tensor, attn_mask, scale, ordered: bool = True,
                   q_offset: int | None = None):
    """The BlockSparse for a routed call of `session` (q, k [B, H, N, D]), or None (dense); records density.

    ``ordered=False``: the keys may not be in one process's order (a joint call that diffusers' Ulysses split
    gathered as [video 0, text 0, video 1, text 1, ...]); a call whose policy keeps a text range then stays
    dense, counted as ``sparse_dense_unordered``. ``q_offset``: the queries are positions [q_offset,
    q_offset + Nq) of a self-attention over the keys (a Ring's one call over the gathered keys)."""
    import math

    state: SparseState = session.sparse
    cfg = state.for_call(session.current_name, q, k, q_offset)
    if cfg is not None and not ordered and cfg.text is not None:
        session.count("sparse_dense_unordered")
        return None
    if cfg is None:
        session.count("sparse_dense_calls")
        return None
    from sagegen.sparse.op import sparse_block_mask

    sm_scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    bs = sparse_block_mask(q, k, cfg, tensor_layout="HND", attn_mask=attn_mask, sm_scale=sm_scale,
                           config=session.config, q_offset=q_offset)
    state.record(session.current_name, bs.counts, bs.indices.shape[-1])
    session.count("sparse_calls")
    return bs


def split_settings(session, settings, ordered: bool = True):
    """``settings`` (a `BackendSettings`) for a call that diffusers' context parallelism splits, with the
    patch's block-sparse policy. Under Ulysses each rank attends over every key for its heads; under Ring
    sagegen's CP then gathers the keys whole and attends once (``ring_one_call``), so the predictor still ranks
    every key, with the rank's queries placed by ``q_offset``. ``ordered``: as in `block_mask_for`; a joint
    call with segments is in one process's order under either split (a Ring's keys are put in that order and
    its parts attend one by one: `parallel.context_parallel_attention`'s ``ring_in_order``)."""
    if session.sparse is None:
        return settings
    import functools

    return dataclasses.replace(settings, block_mask=functools.partial(block_mask_for, session, ordered=ordered))
