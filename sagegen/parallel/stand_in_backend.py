"""A minimal CP-capable sagegen backend in diffusers' registry, for the CP tests and bench/bench_cp.py until
sagegen's own diffusers backend (sagegen/patch/diffusers_backend.py) is wired to `context_parallel_attention`.
It honours what the CP tests and benchmarks use (masks, scale, return_lse; fp32 cast to bf16 as the patcher
does), not every form the full backend handles. Delete once the real backend calls
`context_parallel_attention` and the tests/bench use it."""

from __future__ import annotations

import torch

from .attention import context_parallel_attention
from .local import sagegen_local_attention

NAME = "sagegen_cp_stand_in"


def register_stand_in_backend(backend: str = "auto", config=None) -> str:
    """Register (once per process; re-registering replaces the function) and return the backend's name."""
    from diffusers.models import attention_dispatch as ad

    enum = ad.AttentionBackendName
    if NAME not in enum._value2member_map_:
        # diffusers' registry is a closed Enum; a member added at run time must appear in all three maps
        member = str.__new__(enum, NAME)
        member._name_, member._value_ = NAME.upper(), NAME
        enum._member_map_[member._name_] = member
        enum._value2member_map_[NAME] = member
        enum._member_names_.append(member._name_)
    local = sagegen_local_attention(config=config, backend=backend)

    def cast_local(q, k, v, mask, scale, return_lse):
        dtype = q.dtype
        if dtype == torch.float32:
            q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
        res = local(q, k, v, mask, scale, return_lse)
        return (res[0].to(dtype), res[1]) if return_lse else res.to(dtype)

    @ad._AttentionBackendRegistry.register(enum(NAME), supports_context_parallel=True)
    def _sagegen_stand_in(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                          enable_gqa=False, return_lse=False, _parallel_config=None):
        if _parallel_config is not None:
            return context_parallel_attention(query, key, value, attn_mask=attn_mask, scale=scale,
                                              return_lse=return_lse, parallel_config=_parallel_config,
                                              local_attention=cast_local, is_causal=is_causal,
                                              enable_gqa=enable_gqa)
        if attn_mask is not None and attn_mask.dim() == 2 and attn_mask.shape[0] == query.shape[0] != query.shape[1]:
            attn_mask = attn_mask[:, None, None, :]          # diffusers' [B, S_kv] key-padding form
        return cast_local(query, key, value, attn_mask, scale, return_lse)

    return NAME
