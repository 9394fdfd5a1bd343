"""`PrecisionPolicy`: which parts of a patched transformer keep full-precision attention.

Quantization error matters most in a few places: the first denoising steps (which fix the layout) and the
last ones (which fix fine detail), and some layers (often the first and last blocks). A policy names them;
everything else runs on sagegen's kernels.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class PrecisionPolicy:
    """Parts of the denoising transformer whose attention stays on the original (full-precision) path.

    Fields:
        blocks: layer indices and/or module names. An ``int`` is an index into the transformer's main blocks
            in execution order (e.g. Flux: its 19 double-stream blocks, then its 38 single-stream blocks, so
            index 19 is ``single_transformer_blocks.0``); negative indices count from the end. A ``str`` is a
            submodule name or glob pattern, matched against each attention module's name and its ancestors
            (``"transformer_blocks.0"``, ``"single_transformer_blocks.*"``, ``"*.attn2"``,
            ``"context_embedder"`` for HunyuanVideo's text refiner).
        first_steps: keep the first k denoising steps in full precision.
        last_steps: keep the last k denoising steps in full precision. The step count comes from the
            pipeline's scheduler; when a bare transformer is patched, give it as ``num_steps``.
        num_steps: number of denoising steps per generation, for a transformer patched without its pipeline
            (its step counter then wraps around after ``num_steps`` steps).

    A denoising step is one transformer evaluation at a new timestep: the conditional and unconditional
    passes of classifier-free guidance (batched, or as separate calls at the same timestep) are one step.
    """

    blocks: tuple[int | str, ...] = field(default_factory=tuple)
    first_steps: int = 0
    last_steps: int = 0
    num_steps: int | None = None

    def __post_init__(self) -> None:
        blocks = self.blocks
        if isinstance(blocks, (int, str)):
            blocks = (blocks,)
        try:
            blocks = tuple(blocks)
        except TypeError:
            raise TypeError(f"PrecisionPolicy.blocks must be a sequence of ints and/or strings, got "
                            f"{type(self.blocks).__name__}") from None
        for b in blocks:
            if isinstance(b, bool) or not isinstance(b, (int, str)) or (isinstance(b, str) and not b.strip()):
                raise TypeError(f"PrecisionPolicy.blocks entries must be layer indices (int) or module names "
                                f"(non-empty str), got {b!r}")
        object.__setattr__(self, "blocks", blocks)
        for name in ("first_steps", "last_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"PrecisionPolicy.{name} must be an int >= 0, got {value!r}")
        if self.num_steps is not None and (isinstance(self.num_steps, bool) or not isinstance(self.num_steps, int)
                                           or self.num_steps < 1):
            raise ValueError(f"PrecisionPolicy.num_steps must be None or an int >= 1, got {self.num_steps!r}")

    @property
    def uses_steps(self) -> bool:
        return self.first_steps > 0 or self.last_steps > 0

    def step_is_full_precision(self, index: int, total: int | None) -> bool:
        """Whether denoising step ``index`` (0-based) of ``total`` keeps full precision."""
        if index < self.first_steps:
            return True
        return total is not None and self.last_steps > 0 and index >= total - self.last_steps


def main_blocks(transformer: torch.nn.Module, attention_names: list[str]) -> list[str]:
    """Names of the transformer's main blocks in execution order.

    These are the children of its top-level `nn.ModuleList`s that contain attention, in registration order
    (for every supported model this is the order the forward runs them in).
    """
    blocks = []
    for list_name, child in transformer.named_children():
        if not isinstance(child, torch.nn.ModuleList):
            continue
        for index, _ in enumerate(child):
            prefix = f"{list_name}.{index}"
            if any(n == prefix or n.startswith(prefix + ".") for n in attention_names):
                blocks.append(prefix)
    return blocks


def _matches(name: str, pattern: str) -> bool:
    parts = name.split(".")
    prefixes = [".".join(parts[: i + 1]) for i in range(len(parts))]
    return any(p == pattern or fnmatch.fnmatchcase(p, pattern) for p in prefixes)


def resolve_blocks(policy: PrecisionPolicy, transformer: torch.nn.Module,
                   attention_names: list[str]) -> frozenset[str]:
    """The attention modules (by name) that the policy's ``blocks`` keep in full precision."""
    if not policy.blocks:
        return frozenset()
    blocks = main_blocks(transformer, attention_names)
    chosen: set[str] = set()
    for entry in policy.blocks:
        if isinstance(entry, int):
            if not -len(blocks) <= entry < len(blocks):
                raise ValueError(f"PrecisionPolicy.blocks: layer index {entry} is out of range; "
                                 f"{type(transformer).__name__} has {len(blocks)} blocks (indices "
                                 f"{-len(blocks)}..{len(blocks) - 1}): {_summary(blocks)}")
            prefix = blocks[entry]
            hits = {n for n in attention_names if n == prefix or n.startswith(prefix + ".")}
        else:
            hits = {n for n in attention_names if _matches(n, entry)}
            if not hits:
                raise ValueError(f"PrecisionPolicy.blocks: {entry!r} matches no attention module of "
                                 f"{type(transformer).__name__}; its attention modules are "
                                 f"{_summary(attention_names)} and its blocks are {_summary(blocks)}")
        chosen |= hits
    return frozenset(chosen)


def _summary(names: list[str], limit: int = 6) -> str:
    if len(names) <= limit:
        return ", ".join(names)
    return ", ".join(names[: limit // 2]) + f", ... ({len(names)} in all), " + ", ".join(names[-limit // 2:])
