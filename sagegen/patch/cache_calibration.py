"""MagCache's magnitude ratios from the user's own weights and prompts (``sagegen calibrate MODEL --cache
magcache``).

MagCache skips the main blocks while the accumulated change of their residual (the last block's output minus the
first block's input) stays small; it reads that change from per-step ratios measured once per model:
``ratio_t = mean over tokens of |r_t| / |r_{t-1}|`` (``ratio_0 = 1``), the formula of diffusers' own calibration
mode. Here the ratios are measured on uncached generations of the patched pipeline (the attention the user will
run), per guidance stream (with guidance in two calls, the conditional and the unconditional call of a step are
separate streams, as MagCache keeps separate states), and averaged over the samples. The blocks' argument and
output positions come from diffusers' ``TransformerBlockRegistry`` (what MagCache itself reads).
"""

from __future__ import annotations

from typing import Callable

import torch

from sagegen.patch.precision_policy import main_blocks
from sagegen.patch.targets import attention_modules, denoisers


class _Streams:
    """Per denoiser call: its stream (position within the step) and the residual's per-token norms."""

    def __init__(self):
        self.head_input: torch.Tensor | None = None
        self.timestep = None
        self.position = 0
        self.previous: dict[int, torch.Tensor] = {}
        self.ratios: dict[int, list[float]] = {}
        self.runs: list[dict[int, list[float]]] = []

    def new_call(self, timestep) -> None:
        same = (isinstance(timestep, torch.Tensor) and isinstance(self.timestep, torch.Tensor)
                and timestep.shape == self.timestep.shape and torch.equal(timestep, self.timestep))
        self.position = self.position + 1 if same else 0
        self.timestep = timestep

    def record(self, residual: torch.Tensor) -> None:
        norm = torch.linalg.norm(residual.float(), dim=-1)
        prev = self.previous.get(self.position)
        ratio = 1.0 if prev is None or prev.shape != norm.shape else float((norm / (prev + 1e-8)).mean())
        self.ratios.setdefault(self.position, []).append(ratio)
        self.previous[self.position] = norm

    def end_run(self) -> None:
        if self.ratios:
            self.runs.append(self.ratios)
        self.ratios, self.previous, self.timestep, self.position = {}, {}, None, 0


def _residual(out_hidden: torch.Tensor, in_hidden: torch.Tensor) -> torch.Tensor:
    """The blocks' residual as MagCache takes it (the image tokens at the end where the last block returns the
    text and image sequence joined)."""
    if out_hidden.shape == in_hidden.shape:
        return out_hidden - in_hidden
    if out_hidden.ndim == 3 and in_hidden.ndim == 3 and out_hidden.shape[2] == in_hidden.shape[2]:
        return out_hidden[:, -in_hidden.shape[1]:] - in_hidden
    return out_hidden


def magcache_ratios(pipe, generate: Callable[[], None], runs: int) -> dict:
    """Run ``generate(i)`` for each of ``runs`` generations on the (patched or stock) pipeline and measure the
    ratios. Returns {"mag_ratios": cond stream's mean ratios per step, "streams": {position: ratios}, "runs": n,
    "per_run": [...]}."""
    from diffusers.hooks._helpers import TransformerBlockRegistry

    model = next(iter(denoisers(pipe)[0].values()))
    names = main_blocks(model, list(attention_modules(model)))
    if len(names) < 2:
        raise ValueError(f"{type(model).__name__} has {len(names)} main block(s); MagCache needs a first and a last")
    head, tail = model.get_submodule(names[0]), model.get_submodule(names[-1])
    head_meta, tail_meta = TransformerBlockRegistry.get(type(head)), TransformerBlockRegistry.get(type(tail))
    streams = _Streams()

    def on_call(module, args, kwargs):
        streams.new_call(kwargs.get("timestep"))

    def on_head(module, args, kwargs):
        streams.head_input = head_meta._get_parameter_from_args_kwargs(head_meta.hidden_states_argument_name,
                                                                        args, kwargs)

    def on_tail(module, args, kwargs, output):
        out = output[tail_meta.return_hidden_states_index] if isinstance(output, tuple) else output
        if streams.head_input is not None:
            streams.record(_residual(out, streams.head_input))
        streams.head_input = None

    handles = [model.register_forward_pre_hook(on_call, with_kwargs=True),
               head.register_forward_pre_hook(on_head, with_kwargs=True),
               tail.register_forward_hook(on_tail, with_kwargs=True)]
    try:
        for i in range(runs):
            generate(i)
            streams.end_run()
    finally:
        for handle in handles:
            handle.remove()
    if not streams.runs:
        raise ValueError("no denoiser call reached the model's first and last main blocks")
    mean = {}
    for position in sorted({p for run in streams.runs for p in run}):
        rows = [run[position] for run in streams.runs if position in run]
        steps = min(len(r) for r in rows)
        mean[position] = [round(sum(r[t] for r in rows) / len(rows), 6) for t in range(steps)]
    return {"mag_ratios": mean[0], "streams": {str(k): v for k, v in mean.items()}, "runs": len(streams.runs),
            "per_run": [{str(k): v for k, v in run.items()} for run in streams.runs]}
