"""`PatchSession`: one patched transformer's settings and counters, and the router that answers an intercepted
SDPA call (`route`: sageattn where it can take the call, else SDPA with the reason counted). Below the wrapper
that picks a route per processor call (`sagegen.patch.wrapper`)."""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F

from sagegen import api as _api
from sagegen.backend.calls import bind_sdpa, simplify_mask, unsupported
from sagegen.config import SUPPORTED_HEAD_DIMS, SageConfig
from sagegen.kernels.spec import value_checks_allowed


_SDPA = F.scaled_dot_product_attention


_HALF = (torch.float16, torch.bfloat16)


class PatchSession:
    """What one `sagegen.patch` installed on one transformer: settings, policy state and counters."""

    def __init__(self, *, family: str, config: SageConfig, backend: str, fp32_dtype: torch.dtype):
        self.family = family
        self.config = config
        self.backend = backend
        self.fp32_dtype = fp32_dtype
        self.full_precision_names: frozenset[str] = frozenset()
        self.step_full_precision = False  # set per transformer forward by the step tracker
        self.attention_override = None  # analysis hook: fn(q, k, v, attn_mask, is_causal, scale) -> out
        self.fuse_qk_prologue = True  # eager CogVideoX/Mochi/Flux/SD3: Q/K norm + rotary in one pass (fused.py)
        self.sparse = None  # sparse_policy.SparseState when patched with sparse=...
        self.current_name = ""  # the attention module whose processor is running (sparse policy, calibration)
        self.stats: Counter = Counter()  # diagnostics only (no lock: a lock would break torch.compile graphs)
        # the backend route's settings (quantized, full precision), rebuilt by `sagegen.patch` (dispatch_route)
        self.backend_settings = None
        self.backend_settings_full = None
        self._warned: set[str] = set()

    def count(self, key: str, n: int = 1) -> None:
        if _compiling():  # never inside traced code: dynamo would guard on the counts and recompile each call
            return
        self.stats[key] += n

    def warn_once(self, message: str) -> None:
        if _compiling():
            return
        if message not in self._warned:
            self._warned.add(message)
            warnings.warn(message, RuntimeWarning, stacklevel=4)

    # -- the routing decision for one intercepted SDPA call ------------------------------------------------
    def route(self, args: tuple, kwargs: dict[str, Any]) -> torch.Tensor:
        bound = bind_sdpa(args, kwargs)
        reason = unsupported(bound)
        if reason is not None:
            self.count("fallback")
            self.count(f"fallback:{reason}")
            return _SDPA(*args, **kwargs)
        q, k, v = bound["query"], bound["key"], bound["value"]
        in_dtype = q.dtype
        if in_dtype not in _HALF:  # fp32 model: quantized attention on a bf16 (or fp16) copy, result cast back
            q, k, v = (t.to(self.fp32_dtype) for t in (q, k, v))
        if q.device.type != "cuda":
            # Workaround: the PyTorch emulation (the CPU path) fails on some non-contiguous views (a .view in
            # kernels/reference.py quantize_int8 when N is a multiple of the block). The GPU path reads strides.
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        if self.attention_override is not None:
            self.count("overridden")
            out = self.attention_override(q, k, v, bound["attn_mask"], bool(bound["is_causal"]), bound["scale"])
            return out if out.dtype == in_dtype else out.to(in_dtype)
        mask, rows = ((simplify_mask(bound["attn_mask"], q.shape[2]) if value_checks_allowed()
                       else (bound["attn_mask"], None)))
        block_mask = None
        if self.sparse is not None:
            from sagegen.patch.sparse_policy import block_mask_for

            block_mask = block_mask_for(self, q, k, mask, bound["scale"])
        out = _api.sageattn(q, k, v, tensor_layout="HND", is_causal=bool(bound["is_causal"]),
                            sm_scale=bound["scale"], attn_mask=mask, config=self.config, backend=self.backend,
                            block_mask=block_mask)
        if rows is not None:
            out = out * rows  # query rows with no key to attend: zeros, as sageattn gives fully masked rows
        self.count("routed")
        if (not _compiling() and self.backend == "auto" and q.device.type == "cuda"
                and _auto_prefers_sdpa(q.shape[2], k.shape[2], q.shape[0] * q.shape[1], q.shape[3])):
            self.count("routed_auto_sdpa")  # sageattn's "auto" runs PyTorch SDPA below its speed crossover
        return out if out.dtype == in_dtype else out.to(in_dtype)


    def route_fp8(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask=None):
        """`route` for a fused processor whose output projection takes FP8 (patch/fp8_out.py), with q, k, v
        [B, H, N, D] fp16/bf16 views: ``(out e4m3 [B, H, N, D], scale fp32 [1])``, or None where the call would
        not run sagegen's kernel or emulation as it is (then the caller `route`s it)."""
        if (self.attention_override is not None or _compiling() or q.dtype not in _HALF
                or q.shape[-1] not in SUPPORTED_HEAD_DIMS or torch.is_grad_enabled()):
            return None
        if q.device.type != "cuda":  # (as in `route`: the emulation wants dense tensors)
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        mask, rows = simplify_mask(attn_mask, q.shape[2]) if value_checks_allowed() else (attn_mask, None)
        if rows is not None:  # rows with no key are zeroed after the call, which an FP8 output does not take
            return None
        block_mask = None
        if self.sparse is not None:
            from sagegen.patch.sparse_policy import block_mask_for

            block_mask = block_mask_for(self, q, k, mask, None)
        result = _api.sageattn_fp8_out(q, k, v, attn_mask=mask, config=self.config, backend=self.backend,
                                       block_mask=block_mask)
        if result is not None:
            self.count("routed")
            self.count("routed_fp8_out")
        return result


def _compiling() -> bool:
    """Whether dynamo is tracing this code (a constant True to dynamo, False when run eagerly)."""
    return torch.compiler.is_compiling()


def _auto_prefers_sdpa(n_q: int, n_kv: int, batch_heads: int = 1, head_dim: int = 128) -> bool:
    from sagegen.kernels import dispatch as backends

    rule = getattr(backends, "auto_prefers_sdpa", None)
    return bool(rule(n_q, n_kv, batch_heads, head_dim)) if rule is not None else False
