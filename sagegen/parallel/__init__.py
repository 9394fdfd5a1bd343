"""Context parallelism (one sequence over several GPUs) with sagegen as the attention, on diffusers' engine
(`transformer.enable_parallelism(config=ContextParallelConfig(...))`).

- `context_parallel_attention`: Ulysses, Ring and both, called by sagegen's diffusers backend;
- `sagegen_local_attention`: the per-rank attention it runs (sagegen.sageattn, LSE in diffusers' layout);
- `enable_context_parallel`: diffusers' enable_parallelism with sagegen's plans (HunyuanVideo,
  HunyuanVideo-1.5) and checks.
"""

from sagegen.parallel.attention import context_parallel_attention
from sagegen.parallel.enable import enable_context_parallel
from sagegen.parallel.local import sagegen_local_attention
from sagegen.parallel.plans import ContextParallelUnsupported, check_cp_config, check_cp_support, cp_plan_for

__all__ = ["context_parallel_attention", "sagegen_local_attention", "enable_context_parallel",
           "check_cp_config", "check_cp_support", "cp_plan_for", "ContextParallelUnsupported"]
