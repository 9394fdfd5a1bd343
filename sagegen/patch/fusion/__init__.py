"""What the families' fused code shares: argument binding and the checks of a fused Q/K prologue (`prologue`),
helpers of the joint-attention prologues of SD3, Flux and HunyuanVideo (`joint`), block fusion (`blocks`) and
the fused route's call (`route`). Reaches family code only through `sagegen.patch.family_table`."""
