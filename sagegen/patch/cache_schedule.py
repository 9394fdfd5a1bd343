"""What a step cache actually computed: per denoiser call, how many main blocks and attention modules ran their
own forward, and how many a cache answered instead.

`ScheduleRecorder(denoisers)` puts a counting hook (``sagegen_cache_schedule``, a diffusers hook) on every main
block and attention module. Installed before the cache, it is the innermost hook of each, so it counts only the
calls that reached the module's own forward: a block that FirstBlockCache or MagCache skipped, or an attention
that TaylorSeer predicted or PyramidAttentionBroadcast reused, is not counted. `remove` takes the hooks off.
"""

from __future__ import annotations

import torch

from sagegen.patch.precision_policy import main_blocks
from sagegen.patch.targets import attention_modules

HOOK_NAME = "sagegen_cache_schedule"


def _counter_class():
    from diffusers.hooks import ModelHook

    class CountingHook(ModelHook):
        def __init__(self, recorder: "ScheduleRecorder", key: str):
            super().__init__()
            self.recorder, self.key = recorder, key

        def new_forward(self, module, *args, **kwargs):
            if self.recorder.calls:
                self.recorder.calls[-1][self.key] += 1
            return self.fn_ref.original_forward(*args, **kwargs)

    return CountingHook


class ScheduleRecorder:
    def __init__(self, denoisers: list[torch.nn.Module]):
        from diffusers.hooks import HookRegistry

        hook_cls = _counter_class()
        self.calls: list[dict] = []
        self.blocks_per_call = 0
        self.attention_per_call = 0
        self._modules: list[torch.nn.Module] = []
        self._handles = []
        for model in denoisers:
            attention = attention_modules(model)
            blocks = [model.get_submodule(n) for n in main_blocks(model, list(attention))]
            self.blocks_per_call = max(self.blocks_per_call, len(blocks))
            self.attention_per_call = max(self.attention_per_call, len(attention))
            for key, modules in (("blocks", blocks), ("attention", list(attention.values()))):
                for module in modules:
                    HookRegistry.check_if_exists_or_initialize(module).register_hook(hook_cls(self, key), HOOK_NAME)
                    self._modules.append(module)
            self._handles.append(model.register_forward_pre_hook(self._new_call))

    def _new_call(self, module, args):
        self.calls.append({"blocks": 0, "attention": 0})

    def remove(self) -> None:
        for module in self._modules:
            registry = getattr(module, "_diffusers_hook", None)
            if registry is not None and registry.get_hook(HOOK_NAME) is not None:
                registry.remove_hook(HOOK_NAME, recurse=False)
        for handle in self._handles:
            handle.remove()
        self._modules, self._handles = [], []

    def summary(self) -> dict:
        """{"calls", "blocks_per_call", "attention_per_call", "blocks": [computed per call], "attention": [...],
        "block_work", "attention_work": the computed share of all calls' blocks / attention modules}."""
        calls = len(self.calls)
        blocks = [c["blocks"] for c in self.calls]
        attention = [c["attention"] for c in self.calls]
        share = lambda done, per: round(sum(done) / (per * calls), 4) if calls and per else None  # noqa: E731
        return {"calls": calls, "blocks_per_call": self.blocks_per_call,
                "attention_per_call": self.attention_per_call, "blocks": blocks, "attention": attention,
                "block_work": share(blocks, self.blocks_per_call),
                "attention_work": share(attention, self.attention_per_call)}
