"""Context parallelism (one sequence over several GPUs) with sagegen as the attention, on diffusers' engine
(`transformer.enable_parallelism(config=ContextParallelConfig(...))`).

- `context_parallel_attention`: Ulysses, Ring and both, called by sagegen's diffusers backend;
- `sagegen_local_attention`: the per-rank attention it runs (sagegen.sageattn, LSE in diffusers' layout).
"""

from .attention import context_parallel_attention
from .local import sagegen_local_attention

__all__ = ["context_parallel_attention", "sagegen_local_attention"]
