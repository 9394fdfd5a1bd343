"""Context-parallel attention (one sequence over several GPUs) with sagegen as the local attention, on
diffusers' process groups:
- `context_parallel_attention`: Ulysses, Ring and both, called by sagegen's diffusers backend;
- `sagegen_local_attention`: the per-rank attention it runs (sagegen.sageattn, LSE in diffusers' layout).

Turning it on for a model (diffusers' enable_parallelism with sagegen's plans and checks) is the patcher's:
`sagegen.patch.cp.enable_context_parallel`.
"""

from sagegen.parallel.collective import context_parallel_attention
from sagegen.parallel.local import sagegen_local_attention

__all__ = ["context_parallel_attention", "sagegen_local_attention"]
