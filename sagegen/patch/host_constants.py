"""Small host values moved to the GPU inside a forward that is being captured as a CUDA graph.

Some diffusers forwards build a tiny tensor from Python values and copy it to the GPU: Qwen-Image's
``compute_text_seq_len_from_mask`` calls ``torch.as_tensor(text_seq_len, device=...)`` on every call. A copy
from pageable host memory cannot be captured ("Cannot copy between CPU and CUDA tensors during CUDA graph
capture unless the CPU tensor is pinned"), so the whole forward ran eagerly (lab/NOTES.md v5.4).

While a capture runs, `HostConstants` (a TorchFunctionMode) answers such copies of host tensors of at most
`MAX_ELEMENTS` values with device-side fills of the same values: the graph holds them as constants. That is no
new kind of baking: every Python value a forward reads is fixed in its graph, and `graphs.GraphedForward` keys
each graph on the call's non-tensor arguments. What it covers: ``torch.tensor`` / ``torch.as_tensor`` with a
CUDA ``device``, ``Tensor.to`` / ``Tensor.cuda`` of a host tensor, and ``cuda_tensor.copy_(host_tensor)``.
Pinned host tensors are left alone (their copies can be captured, and re-read the host memory at every replay),
as are larger ones (the capture then fails as before, and those calls run eagerly). A default device set with
``torch.set_default_device`` is not seen here: creations that rely on it still fail the capture.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

MAX_ELEMENTS = 64  # each distinct value is one fill node in the graph


class HostConstants(TorchFunctionMode):
    """Turn host-to-``device_type`` copies of small pageable host tensors into fills (see the module doc).
    ``converted`` counts them. ``device_type`` is "cuda"; the CPU tests use "cpu" to check the values."""

    # sagegen's eager calls may skip their custom op under this mode (`sagegen.api`; their body runs without it,
    # as an op's would): the capture then takes the eager paths, the FP8 attention output included (no op form)
    sagegen_passes_through = True

    def __init__(self, device_type: str = "cuda"):
        super().__init__()
        self.device_type = device_type
        self.converted = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = _HANDLERS.get(func)
        if handler is not None:
            out = handler(self, args, kwargs)
            if out is not NotImplemented:
                self.converted += 1
                return out
        return func(*args, **kwargs)

    def targets(self, device) -> bool:
        return device is not None and torch.device(device).type == self.device_type

    def constant(self, host: torch.Tensor, device):
        """``host``'s values in a new tensor on ``device``, written by fills; NotImplemented if too large."""
        if host.numel() > MAX_ELEMENTS:
            return NotImplemented
        out = torch.empty(host.shape, dtype=host.dtype, device=device)
        values = host.reshape(-1).tolist()
        if values and all(v == values[0] for v in values):
            out.fill_(values[0])
        else:
            flat = out.view(-1)
            for i, v in enumerate(values):
                flat[i].fill_(v)
        return out


def _pageable_host(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cpu" and not t.is_pinned()


def _creation(mode: HostConstants, func, data, dtype, device, extra: dict):
    if not mode.targets(device) or extra.get("pin_memory") or extra.get("requires_grad"):
        return NotImplemented
    if isinstance(data, torch.Tensor) and not _pageable_host(data):
        return NotImplemented  # already on a device, or pinned
    host = func(data, dtype=dtype, **extra)
    return mode.constant(host, device)


def _tensor(mode, args, kwargs):
    extra = {k: v for k, v in kwargs.items() if k not in ("dtype", "device")}
    return _creation(mode, torch.tensor, args[0], kwargs.get("dtype"), kwargs.get("device"), extra)


def _as_tensor(mode, args, kwargs):
    return _creation(mode, torch.as_tensor, args[0], kwargs.get("dtype"), kwargs.get("device"), {})


def _to(mode, args, kwargs):
    self = args[0]
    if not _pageable_host(self):
        return NotImplemented
    # `copy` (keyword, or the second positional bool after non_blocking) does not matter for a copy to another
    # device, and the parser refuses it
    rest, kw, bools = [], {k: v for k, v in kwargs.items() if k != "copy"}, 0
    for a in args[1:]:
        bools += isinstance(a, bool)
        if not (isinstance(a, bool) and bools == 2):
            rest.append(a)
    try:
        device, dtype, _, memory_format = torch._C._nn._parse_to(*rest, **kw)
    except (RuntimeError, TypeError):  # a form this parser refuses: the plain call decides
        return NotImplemented
    if not mode.targets(device) or memory_format not in (None, torch.preserve_format):
        return NotImplemented
    return mode.constant(self if dtype is None else self.to(dtype), device)


def _cuda(mode, args, kwargs):
    self = args[0]
    device = args[1] if len(args) > 1 else kwargs.get("device")
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    elif isinstance(device, int):
        device = torch.device("cuda", device)
    if not _pageable_host(self) or kwargs.get("memory_format", torch.preserve_format) != torch.preserve_format:
        return NotImplemented
    return mode.constant(self, device) if mode.targets(device) else NotImplemented


def _copy(mode, args, kwargs):
    dst, src = args[0], (args[1] if len(args) > 1 else kwargs.get("src"))
    if not (isinstance(dst, torch.Tensor) and mode.targets(dst.device) and _pageable_host(src)):
        return NotImplemented
    values = mode.constant(src, dst.device)
    return NotImplemented if values is NotImplemented else dst.copy_(values)


_HANDLERS = {torch.tensor: _tensor, torch.as_tensor: _as_tensor, torch.Tensor.to: _to,
             torch.Tensor.cuda: _cuda, torch.Tensor.copy_: _copy}
