"""Context parallelism for a diffusers transformer with sagegen's attention: which models can run it, the plans
sagegen supplies where diffusers has none, and `enable_context_parallel` (diffusers' enable_parallelism with
those plans and checks). The collective attention itself is `sagegen.parallel`.
"""

from sagegen.patch.cp.enable import enable_context_parallel
from sagegen.patch.cp.plans import ContextParallelUnsupported, check_cp_config, check_cp_support, cp_plan_for

__all__ = ["enable_context_parallel", "check_cp_config", "check_cp_support", "cp_plan_for",
           "ContextParallelUnsupported"]
