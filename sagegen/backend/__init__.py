"""sagegen as diffusers' ``"sagegen"`` attention backend (docs/diffusers-backend.md).

`registry` (registration in diffusers' registry, now or when diffusers loads), `attention` (the function
diffusers' dispatcher calls, and its settings), `calls` (which SDPA calls sagegen can take), `use`
(`sagegen.use_backend`). Below the patcher, which routes modules through it; knows nothing of the patcher.
"""
