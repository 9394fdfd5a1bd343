"""Tiny random LoRAs built offline for the tiny Wan and Flux pipelines: a copy of the pipeline's transformer gets
a peft adapter with random (non-zero) lora_B, and its adapter state dict is saved the way diffusers saves a
LoRA (``save_lora_weights``), so that ``pipe.load_lora_weights(path)`` reads it as it would a downloaded one."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

# diffusers' usual LoRA targets: attention projections (both streams for Flux), MLPs, Flux's single blocks
TARGETS = {
    "wan": ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"],
    "flux": ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
             "ff.net.0.proj", "ff.net.2", "proj_mlp", "proj_out"],
}


def tiny_pipeline(family: str):
    """(bf16 tiny pipeline, keyword inputs of one transformer call)."""
    g = torch.Generator().manual_seed(1)
    if family == "wan":
        from sagegen.models.tiny_video import build_tiny_video_pipeline

        pipe = build_tiny_video_pipeline("wan2.1", dtype=torch.bfloat16)
        inputs = dict(hidden_states=torch.randn(1, 16, 3, 4, 4, generator=g), timestep=torch.tensor([500]),
                      encoder_hidden_states=torch.randn(1, 512, 32, generator=g))
    else:
        from sagegen.models.tiny import build_tiny_pipeline

        pipe = build_tiny_pipeline("flux", dtype=torch.bfloat16)
        h = w = 4
        img_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(h).float(), torch.arange(w).float(),
                                             indexing="ij"), -1).reshape(-1, 3)
        inputs = dict(hidden_states=torch.randn(1, h * w, 16, generator=g),
                      encoder_hidden_states=torch.randn(1, 7, 32, generator=g),
                      pooled_projections=torch.randn(1, 64, generator=g), timestep=torch.tensor([0.5]),
                      guidance=torch.tensor([3.5]), img_ids=img_ids, txt_ids=torch.zeros(7, 3))
    inputs = {k: v.to(torch.bfloat16) if v.is_floating_point() and k not in ("timestep", "guidance") else v
              for k, v in inputs.items()}
    return pipe, dict(inputs, return_dict=False)


def write_lora(pipe, family: str, directory: Path, *, seed: int, rank: int = 4, alpha: float = 8.0) -> Path:
    """A random LoRA for ``pipe``'s transformer, saved as diffusers saves one; returns the .safetensors file."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    donor = copy.deepcopy(pipe.transformer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        donor.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, target_modules=TARGETS[family],
                                     init_lora_weights=False), adapter_name="donor")
    # diffusers saves no alpha here (it loads as alpha = rank): the scale goes into lora_B instead
    state = {k: v * (alpha / rank) if "lora_B" in k else v
             for k, v in get_peft_model_state_dict(donor, adapter_name="donor").items()}
    directory.mkdir(parents=True, exist_ok=True)
    type(pipe).save_lora_weights(str(directory), transformer_lora_layers=state)
    return directory / "pytorch_lora_weights.safetensors"


def call(pipe, inputs) -> torch.Tensor:
    with torch.inference_mode():
        return pipe.transformer(**inputs)[0].float()


def lora_layers(model) -> dict:
    return {n: m for n, m in model.named_modules() if hasattr(m, "base_layer") and hasattr(m, "lora_A")}
