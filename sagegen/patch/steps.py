"""Denoising-step tracking for `PrecisionPolicy`'s first/last-k steps.

A forward pre-hook on the transformer reads the ``timestep`` argument of each call. A new timestep value
starts a new step; a call at the same timestep (the unconditional pass of true CFG in Flux/HunyuanVideo,
SD3's skip-layer-guidance pass) belongs to the same step, and batched CFG is one call anyway. All five
pipelines (CogVideoX, HunyuanVideo, Mochi, Flux, SD3) pass ``timestep`` to the transformer by keyword.

Generations are told apart through the pipeline's scheduler: every pipeline call runs
``scheduler.set_timesteps``, which installs a new ``scheduler.timesteps`` tensor; seeing a new one resets the
counter and gives the number of steps (minus the scheduler's ``begin_index`` for img2img-style starts).
For a transformer patched without its pipeline, the policy's ``num_steps`` gives the count and the counter
wraps after it; `reset()` starts over by hand.

Reading the timestep costs one host sync per transformer call, so the hook is installed only when the
policy has step rules. Second-order schedulers that evaluate the model twice at one timestep (Heun) are not
told apart: their two evaluations count as one step.
"""

from __future__ import annotations

import inspect
import weakref
from typing import Callable

import torch

from sagegen.patch.precision_policy import PrecisionPolicy
from sagegen.patch.session import PatchSession


class StepTracker:
    """One step counter for a pipeline's denoisers. With several (Wan2.2-A14B's two experts) they share it,
    so a step is counted once whichever denoiser runs it, and every denoiser's session learns the step's
    precision."""

    def __init__(self, session: PatchSession | list[PatchSession], policy: PrecisionPolicy,
                 scheduler_source: Callable[[], object] | None = None):
        self.sessions = list(session) if isinstance(session, (list, tuple)) else [session]
        self.session = self.sessions[0]
        self.policy = policy
        self.scheduler_source = scheduler_source
        self.index = -1
        self.total: int | None = policy.num_steps
        self.history: list[tuple[int, bool]] = []  # (step index, full precision) per transformer call
        self._last_t: float | None = None
        self._timesteps_ref = None
        self._handles = []

    # -- installation ---------------------------------------------------------------------------------------
    def attach(self, transformer: torch.nn.Module) -> None:
        params = [p for p in inspect.signature(type(transformer).forward).parameters.values()][1:]
        names = [p.name for p in params]
        position = names.index("timestep") if "timestep" in names else None
        hook = lambda module, args, kwargs: self._pre_hook(module, args, kwargs, position)  # noqa: E731
        self._handles.append(transformer.register_forward_pre_hook(hook, with_kwargs=True))

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for session in self.sessions:
            session.step_full_precision = False

    def reset(self) -> None:
        self.index = -1
        self._last_t = None
        self.total = self.policy.num_steps

    # -- per call -------------------------------------------------------------------------------------------
    # Outside any compiled graph: the counting is Python state and reads the timestep on the host. Traced, it
    # broke the graph at the read and made dynamo guard on the counter's fields (a recompile in every new
    # generation). Disabled, a compiled model runs the hook eagerly (one graph break before the forward, so
    # fullgraph=True refuses a patch with step rules) and guards only on the step's outcome: one graph per
    # precision (tests/patch/test_patch_compile_native.py).
    @torch.compiler.disable
    def _pre_hook(self, module, args, kwargs, timestep_pos):
        t = kwargs.get("timestep")
        if t is None and timestep_pos is not None and len(args) > timestep_pos:
            t = args[timestep_pos]
        if t is None:
            for session in self.sessions:
                session.step_full_precision = False
            return None
        self.observe(t)
        return None

    def observe(self, t) -> bool:
        """Record one transformer call at timestep ``t``; returns whether it runs in full precision."""
        self._check_scheduler()
        value = float(t.reshape(-1)[0]) if isinstance(t, torch.Tensor) else float(t)
        if self._last_t is None or value != self._last_t:
            self.index += 1
            if self.scheduler_source is None and self.total is not None and self.index >= self.total:
                self.index = 0
            self._last_t = value
        full = self.policy.step_is_full_precision(self.index, self.total)
        for session in self.sessions:
            session.step_full_precision = full
        self.history.append((self.index, full))
        return full

    def _check_scheduler(self) -> None:
        if self.scheduler_source is None:
            return
        scheduler = self.scheduler_source()
        timesteps = getattr(scheduler, "timesteps", None) if scheduler is not None else None
        if timesteps is None or timesteps is self._timesteps_ref:
            return
        self._timesteps_ref = timesteps
        self.index = -1
        self._last_t = None
        begin = getattr(scheduler, "begin_index", None) or 0
        self.total = max(0, len(timesteps) - int(begin)) or self.policy.num_steps


def pipeline_scheduler_source(pipe) -> Callable[[], object]:
    """Reads ``pipe.scheduler`` at call time (a swapped scheduler is picked up) without keeping ``pipe`` alive."""
    ref = weakref.ref(pipe)

    def source():
        p = ref()
        return getattr(p, "scheduler", None) if p is not None else None

    return source
