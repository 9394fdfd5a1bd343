"""What the families' fused code shares: argument binding and the checks of a fused Q/K prologue (`prologue`),
the joint-attention prologue of SD3, Flux and HunyuanVideo (`joint`), block-level residual + norm fusion
(`blocks`) and the table of which prologue serves a family (`route`). Imports no family module except
through those tables."""
