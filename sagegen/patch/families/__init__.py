"""Each model family's patcher code: fused Q/K prologues, fused block norms and residuals, GELU fused into
FP8 quantization, and context-parallel plans, one family per module (a family's block code may sit in
``<family>_blocks``). The shared machinery is `sagegen.patch.fusion`; the class -> family table is
`sagegen.models.families`."""
