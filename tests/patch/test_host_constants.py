"""`sagegen.patch.host_constants`: host-to-device copies of small host tensors answered by fills while a CUDA
graph is captured. No GPU here, so the mode targets the CPU itself: every intercepted copy must give the very
values, dtype and shape the plain call gives, and anything it must leave alone is passed through (counted by
``converted``). tests/patch/test_gpu_graphs.py captures a forward that needs it for real."""

from __future__ import annotations

import pytest
import torch

from sagegen.patch.host_constants import MAX_ELEMENTS, HostConstants


def _same(a: torch.Tensor, b: torch.Tensor):
    assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
    assert torch.equal(a, b) or (a.isnan() == b.isnan()).all() and torch.equal(a.nan_to_num(), b.nan_to_num())


CASES = [
    ("as_tensor int", lambda: torch.as_tensor(512, device="cpu")),
    ("as_tensor dtype", lambda: torch.as_tensor(3.25, dtype=torch.float16, device="cpu")),
    ("tensor list", lambda: torch.tensor([[0, 1, 1], [2, 3, 5]], device="cpu", dtype=torch.int32)),
    ("tensor bool", lambda: torch.tensor([True, False, True], device="cpu")),
    ("tensor bf16 with nan", lambda: torch.tensor([1.5, float("nan"), -2.0], device="cpu", dtype=torch.bfloat16)),
    ("tensor complex", lambda: torch.tensor([1 + 2j, -3j], device="cpu")),
    ("tensor all equal", lambda: torch.tensor([7.0] * 40, device="cpu")),
    ("tensor empty", lambda: torch.tensor([], device="cpu")),
    ("to device", lambda: torch.arange(6).view(2, 3).to("cpu")),
    ("to device and dtype", lambda: torch.arange(5).to("cpu", torch.float64)),
    ("to keyword device", lambda: torch.linspace(0, 1, 9).to(device="cpu", dtype=torch.bfloat16)),
    ("to other tensor", lambda: torch.arange(4).to(torch.zeros(1, dtype=torch.float16))),
    ("to with copy", lambda: torch.arange(4).to("cpu", torch.float32, False, True)),
    ("to with copy keyword", lambda: torch.arange(4).to(device="cpu", copy=True)),
    ("copy_ into device tensor", lambda: torch.zeros(2, 3).copy_(torch.arange(6).view(2, 3))),
    ("copy_ broadcast", lambda: torch.zeros(4, 3).copy_(torch.tensor([1.0, 2.0, 3.0]))),
]


@pytest.mark.parametrize("name,make", CASES, ids=[c[0] for c in CASES])
def test_intercepted_copies_give_the_plain_values(name, make):
    want = make()
    with HostConstants(device_type="cpu") as mode:
        got = make()
    _same(got, want)
    assert mode.converted >= 1, name  # the mode answered it (a pass-through would also give equal values)


def test_non_contiguous_host_tensor():
    base = torch.arange(24.0).view(4, 6)
    want = base[:, ::2].to("cpu", torch.float16)
    with HostConstants(device_type="cpu") as mode:
        got = base[:, ::2].to("cpu", torch.float16)
    _same(got, want)
    assert mode.converted == 1


def test_left_alone():
    """Larger tensors, copies to other devices, creations without a device, gradients: the plain call runs."""
    big = torch.arange(MAX_ELEMENTS + 1)
    with HostConstants(device_type="cpu") as mode:
        _same(big.to("cpu"), big)
        _same(torch.tensor(list(range(MAX_ELEMENTS + 1)), device="cpu"), big)
        _same(torch.as_tensor(5), torch.as_tensor(5))              # no device: stays on the host
        _same(torch.arange(3).to(torch.float32), torch.arange(3.0))  # a dtype only
        assert torch.tensor([1.0], device="cpu", requires_grad=True).requires_grad
        assert torch.arange(3).to("meta").device.type == "meta"
    assert mode.converted == 0
    with HostConstants(device_type="cuda") as mode:  # nothing here is a copy to CUDA
        _same(torch.as_tensor(7, device="cpu"), torch.as_tensor(7))
        _same(torch.zeros(3).copy_(torch.ones(3)), torch.ones(3))
    assert mode.converted == 0


def test_inside_a_forward_the_values_reach_the_result():
    """The Qwen-Image pattern: a length as a device scalar inside torch.where."""
    def forward(mask: torch.Tensor) -> torch.Tensor:
        n = mask.shape[1]
        pos = torch.arange(n, device=mask.device)
        last = torch.where(mask, pos, pos.new_zeros(())).max(dim=1).values + 1
        return torch.where(mask.any(dim=1), last, torch.as_tensor(n, device=mask.device))

    mask = torch.tensor([[True, True, False], [False, False, False]])
    want = forward(mask)
    with HostConstants(device_type="cpu") as mode:
        got = forward(mask)
    _same(got, want)
    assert got.tolist() == [2, 3] and mode.converted == 1


def test_qwen_image_forward_copies_its_text_length_and_the_mode_answers_it():
    """diffusers' own Qwen-Image forward (the reason for the mode): its host-to-device copy is intercepted, and
    the output is the same bits."""
    from sagegen.models import arch as archs

    name = "qwen-image"
    model = archs.build_transformer(name, dtype=torch.float32, device="cpu", seed=0,
                                    config_overrides=archs.smoke_overrides(name))
    x = archs.example_inputs(name, batch=1, dtype=torch.float32, device="cpu", seed=1, height=128, width=128,
                             text_tokens=archs.smoke_text_tokens(name))
    x["encoder_hidden_states_mask"] = torch.ones(x["encoder_hidden_states"].shape[:2], dtype=torch.long)
    with torch.inference_mode():
        want = model(**x)[0]
        with HostConstants(device_type="cpu") as mode:
            got = model(**x)[0]
    assert torch.equal(got, want) and mode.converted >= 1
