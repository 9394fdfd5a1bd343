"""Full-size denoising transformers of the presets, with random weights, and their forward inputs.

For GPU speed and accuracy measurements without downloading weights: `build_transformer(name)` builds the real
diffusers class with the real config (``ARCHS``, written from each model's published ``transformer/config.json``)
directly on the target device in the target dtype, with random variance-preserving weights;
`example_inputs(name)` makes the kwargs of one denoising step's forward at the model's default resolution, as
its pipeline would pass them (latents, text embeddings, timestep, rotary embeddings / position ids, guidance,
pooled projections, text masks), with the CFG batch where the pipeline batches guidance.

Tokens per sample at the defaults (see /work/shared/anchors/attention-h200.md): CogVideoX-2b/5b 17,776,
CogVideoX1.5-5B 45,106, HunyuanVideo 720p 119,056 (text key-padding mask), Mochi 163 frames 44,520 latent +
valid text, Flux 1024² 4,608 (dev; schnell 4,352 with 256 text tokens), SD3.5 1024² 4,429.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sagegen.models import arch_video

# torch is imported where it is used: the CLI reads ARCHS (names, configs) to check `sagegen bench`'s arguments
# before torch loads.
if TYPE_CHECKING:  # annotations only
    import torch

_COG_BASE = dict(activation_fn="gelu-approximate", attention_bias=True, attention_head_dim=64, dropout=0.0,
                 flip_sin_to_cos=True, freq_shift=0, in_channels=16, max_text_seq_length=226,
                 norm_elementwise_affine=True, norm_eps=1e-05, out_channels=16, patch_size=2,
                 spatial_interpolation_scale=1.875, temporal_compression_ratio=4, temporal_interpolation_scale=1.0,
                 text_embed_dim=4096, time_embed_dim=512, timestep_activation_fn="silu")
_FLUX = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
             num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
             axes_dims_rope=(16, 56, 56))
_SD35_LARGE = dict(sample_size=128, patch_size=2, in_channels=16, num_layers=38, attention_head_dim=64,
                   num_attention_heads=38, joint_attention_dim=4096, caption_projection_dim=2432,
                   pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=192, qk_norm="rms_norm",
                   dual_attention_layers=())


@dataclass(frozen=True)
class Arch:
    """One full-size denoiser: its diffusers class and config, and one step's default input sizes."""

    name: str
    family: str
    cls: str
    config: dict
    height: int
    width: int
    frames: int | None = None          # video models
    batch: int = 1                      # samples per transformer call in one step (2 = batched CFG)
    text_tokens: int = 0                # padded text length the pipeline feeds the transformer
    guidance: float | None = None       # embedded guidance (guidance-distilled models)
    source: str = ""
    notes: dict = field(default_factory=dict)


ARCHS: dict[str, Arch] = {a.name: a for a in [
    Arch("cogvideox-2b", "cogvideox", "CogVideoXTransformer3DModel",
         dict(_COG_BASE, num_attention_heads=30, num_layers=30, sample_frames=49, sample_height=60, sample_width=90,
              use_rotary_positional_embeddings=False),
         height=480, width=720, frames=49, batch=2, text_tokens=226,
         source="THUDM/CogVideoX-2b transformer/config.json"),
    Arch("cogvideox-5b", "cogvideox", "CogVideoXTransformer3DModel",
         dict(_COG_BASE, num_attention_heads=48, num_layers=42, sample_frames=49, sample_height=60, sample_width=90,
              use_rotary_positional_embeddings=True),
         height=480, width=720, frames=49, batch=2, text_tokens=226,
         source="THUDM/CogVideoX-5b transformer/config.json"),
    Arch("cogvideox1.5-5b", "cogvideox", "CogVideoXTransformer3DModel",
         dict(_COG_BASE, num_attention_heads=48, num_layers=42, sample_frames=81, sample_height=300,
              sample_width=300, patch_size_t=2, patch_bias=False, use_rotary_positional_embeddings=True,
              use_learned_positional_embeddings=False),
         height=768, width=1360, frames=81, batch=2, text_tokens=226,
         source="THUDM/CogVideoX1.5-5B transformer/config.json (diffusers conversion: patch_size_t 2, "
                "patch_bias false, sample 300x300x81)"),
    Arch("hunyuanvideo", "hunyuanvideo", "HunyuanVideoTransformer3DModel",
         dict(in_channels=16, out_channels=16, num_attention_heads=24, attention_head_dim=128, num_layers=20,
              num_single_layers=40, num_refiner_layers=2, mlp_ratio=4.0, patch_size=2, patch_size_t=1,
              qk_norm="rms_norm", guidance_embeds=True, text_embed_dim=4096, pooled_projection_dim=768,
              rope_theta=256.0, rope_axes_dim=(16, 56, 56)),
         height=720, width=1280, frames=129, batch=1, text_tokens=256, guidance=6.0,
         source="hunyuanvideo-community/HunyuanVideo transformer/config.json"),
    Arch("mochi-1", "mochi", "MochiTransformer3DModel",
         dict(patch_size=2, num_attention_heads=24, attention_head_dim=128, num_layers=48,
              pooled_projection_dim=1536, in_channels=12, out_channels=None, qk_norm="rms_norm",
              text_embed_dim=4096, time_embed_dim=256, activation_fn="swiglu", max_sequence_length=256),
         height=480, width=848, frames=163, batch=2, text_tokens=256,
         source="genmo/mochi-1-preview transformer/config.json"),
    Arch("flux.1-dev", "flux", "FluxTransformer2DModel", dict(_FLUX, guidance_embeds=True),
         height=1024, width=1024, batch=1, text_tokens=512, guidance=3.5,
         source="black-forest-labs/FLUX.1-dev transformer/config.json"),
    Arch("flux.1-schnell", "flux", "FluxTransformer2DModel", dict(_FLUX, guidance_embeds=False),
         height=1024, width=1024, batch=1, text_tokens=256,
         source="black-forest-labs/FLUX.1-schnell transformer/config.json"),
    Arch("sd3.5-large", "sd3", "SD3Transformer2DModel", dict(_SD35_LARGE),
         height=1024, width=1024, batch=2, text_tokens=77 + 256,
         source="stabilityai/stable-diffusion-3.5-large transformer/config.json"),
    Arch("sd3.5-large-turbo", "sd3", "SD3Transformer2DModel", dict(_SD35_LARGE),
         height=1024, width=1024, batch=1, text_tokens=77 + 256,
         source="stabilityai/stable-diffusion-3.5-large-turbo transformer/config.json (same as large; "
                "guidance 0, so no CFG batch)"),
    Arch("sd3.5-medium", "sd3", "SD3Transformer2DModel",
         dict(sample_size=128, patch_size=2, in_channels=16, num_layers=24, attention_head_dim=64,
              num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536,
              pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=384, qk_norm="rms_norm",
              dual_attention_layers=tuple(range(13))),
         height=1024, width=1024, batch=2, text_tokens=77 + 256,
         source="stabilityai/stable-diffusion-3.5-medium transformer/config.json"),
]}

ARCHS.update({d["name"]: Arch(**d) for d in arch_video.VIDEO_ARCHS})  # Wan, LTX, Qwen-Image, HV-1.5

_ALIASES = {**arch_video.VIDEO_ALIASES, "cogvideox": "cogvideox-2b", "cogvideox1.5": "cogvideox1.5-5b",
            "hunyuan": "hunyuanvideo",
            "mochi": "mochi-1", "flux": "flux.1-schnell", "flux-dev": "flux.1-dev", "flux-schnell": "flux.1-schnell",
            "sd3.5": "sd3.5-large", "sd3.5-turbo": "sd3.5-large-turbo"}


def get_arch(name: str) -> Arch:
    key = name.strip().lower() if isinstance(name, str) else name
    key = _ALIASES.get(key, key)
    if key not in ARCHS:
        raise ValueError(f"unknown architecture {name!r}; choose one of {', '.join(ARCHS)}")
    return ARCHS[key]


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_transformer(name: str, *, dtype: torch.dtype | None = None, device: str | torch.device = "cuda",
                      seed: int = 0, config_overrides: dict | None = None) -> torch.nn.Module:
    """The full-size transformer ``name`` (see ``ARCHS``) with random weights, built on ``device`` in ``dtype``.

    Parameters are created directly on the device in the target dtype (no fp32 copy, no CPU round trip: a 13B
    model needs 26 GB in bf16). Linear and conv weights are then drawn N(0, 1/fan_in) (variance-preserving, so
    activations and attention logits keep realistic scales through the depth), biases 0, norms at their
    default (1, 0); deterministic in ``seed``. ``config_overrides`` changes config fields (e.g. fewer layers).
    ``dtype`` None: bfloat16.
    """
    import diffusers
    import torch

    dtype = torch.bfloat16 if dtype is None else dtype
    arch = get_arch(name)
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"dtype={dtype!r} is not supported; use torch.bfloat16, torch.float16 or torch.float32")
    device = torch.device(device)
    cls = getattr(diffusers, arch.cls)
    config = dict(arch.config, **(config_overrides or {}))
    with torch.device(device), _default_dtype(dtype):
        model = cls(**config)
    # nn.Module.to itself: diffusers' ModelMixin.to warns about fp32-kept modules (none in these models).
    torch.nn.Module.to(model, device=device, dtype=dtype)
    random_init_(model, seed=seed)
    return model.eval().requires_grad_(False)


def random_init_(model: torch.nn.Module, *, seed: int = 0) -> torch.nn.Module:
    """Variance-preserving random weights in place (see `build_transformer`). No-op on the meta device."""
    import torch

    device = next(model.parameters()).device
    if device.type == "meta":
        return model
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)):
                fan_in = module.weight[0].numel()
                module.weight.normal_(0.0, fan_in ** -0.5, generator=gen)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, torch.nn.Embedding):
                module.weight.normal_(0.0, 1.0, generator=gen)
    return model


def smoke_overrides(name: str) -> dict:
    """Config overrides that shrink ``name`` to 1 layer of each kind and 2 heads (same head dim, same input
    and text dims, same position embeddings): the same forward interface, cheap enough for a CPU smoke test."""
    arch = get_arch(name)
    heads = 2
    overrides = {"num_layers": 1, "num_attention_heads": heads}
    if arch.family in ("hunyuanvideo", "flux"):
        overrides["num_single_layers"] = 1
    if arch.family in ("hunyuanvideo", "hunyuanvideo15"):
        overrides["num_refiner_layers"] = 1
    if arch.family == "ltx":  # its cross-attention reads the caption projected to the model width
        overrides["cross_attention_dim"] = heads * arch.config["attention_head_dim"]
    if arch.family == "sd3":
        overrides["caption_projection_dim"] = heads * arch.config["attention_head_dim"]
        if arch.config.get("dual_attention_layers"):
            overrides["dual_attention_layers"] = (0,)
    return overrides


SMOKE_TEXT_TOKENS = 32


def smoke_text_tokens(name: str) -> int:
    """A short padded text length for CPU smoke runs (the presets' 226-512 text tokens dominate a 64x64 input).
    CogVideoX without rotary embeddings adds position embeddings sized for its full text, so it keeps it."""
    arch = get_arch(name)
    if arch.family == "cogvideox" and not arch.config.get("use_rotary_positional_embeddings"):
        return arch.text_tokens
    return min(arch.text_tokens, SMOKE_TEXT_TOKENS)


def tokens_per_sample(name: str, *, height: int | None = None, width: int | None = None,
                      frames: int | None = None, text_tokens: int | None = None) -> int:
    """Sequence length of the transformer's attention (image/video tokens + padded text tokens).

    Mochi attends over its latent tokens and only the valid text tokens of each sample, so its real length is
    this minus the padding (the anchors' "~44,550" for a typical prompt)."""
    arch = get_arch(name)
    h, w, f = height or arch.height, width or arch.width, frames or arch.frames
    # cross-attention text attends apart
    text = 0 if arch.family in arch_video.CROSS_ATTENTION_TEXT else (text_tokens or arch.text_tokens)
    if arch.family == "hunyuanvideo15":
        text += arch_video._HV15_EXTRA_TEXT
    return _latent_tokens(arch.family, arch.config, h, w, f) + text


def _latent_frames(family: str, frames: int | None, config: dict) -> int:
    if frames is None:
        return 1
    temporal = 6 if family == "mochi" else 4
    n = (frames - 1) // temporal + 1
    p_t = config.get("patch_size_t") if family == "cogvideox" else None
    if p_t and n % p_t:  # the CogVideoX1.5 pipeline pads the latent frames to a multiple of patch_size_t
        n += p_t - n % p_t
    return n


def _latent_tokens(family: str, config: dict, height: int, width: int, frames: int | None) -> int:
    if family in arch_video.INPUT_BUILDERS:
        return arch_video.latent_tokens(family, config, height, width, frames)
    lh, lw = height // 8, width // 8
    lf = _latent_frames(family, frames, config)
    if family == "flux":
        return (lh // 2) * (lw // 2)
    p = config["patch_size"]
    p_t = (config.get("patch_size_t") or 1)
    return (lf // p_t) * (lh // p) * (lw // p)


def example_inputs(name_or_model, *, batch: int | None = None, height: int | None = None,
                   width: int | None = None, frames: int | None = None, text_tokens: int | None = None,
                   valid_text: list[int] | None = None, dtype: torch.dtype | None = None,
                   device: str | torch.device = "cuda", seed: int = 0) -> dict:
    """Forward kwargs of one denoising step, shaped as the model's pipeline passes them.

    ``name_or_model``: an ``ARCHS`` name (defaults from there), or a built transformer of one of the five
    classes (then give ``height``/``width``/``frames``/``text_tokens``; e.g. the tiny models). Random latents
    and text embeddings (N(0, 1)); a mid-schedule timestep. ``valid_text`` (HunyuanVideo, Mochi): the number
    of real text tokens per sample, default different lengths per sample (so the key-padding mask differs).
    ``dtype`` None: bfloat16.
    """
    import torch

    dtype = torch.bfloat16 if dtype is None else dtype
    if isinstance(name_or_model, str):
        arch = get_arch(name_or_model)
        family, config = arch.family, dict(arch.config)
        batch = batch or arch.batch
        height, width = height or arch.height, width or arch.width
        frames = frames or arch.frames
        text_tokens = text_tokens or arch.text_tokens
        guidance = arch.guidance
    else:
        from sagegen.models.families import family_of_class

        family = family_of_class(type(name_or_model))
        if family is None:
            raise ValueError(f"example_inputs does not know {type(name_or_model).__name__}")
        config = dict(name_or_model.config)
        if height is None or width is None or text_tokens is None:
            raise ValueError("give height, width and text_tokens with a model object")
        batch = batch or 1
        guidance = 3.5 if config.get("guidance_embeds") else None
    device = torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    lh, lw = height // 8, width // 8
    lf = _latent_frames(family, frames, config)
    t = torch.full((batch,), 500.0, device=device)
    if valid_text is None:
        valid_text = [max(1, min(text_tokens, text_tokens // 4 + 37 * i)) for i in range(batch)]
    if len(valid_text) != batch:
        raise ValueError(f"valid_text needs one length per sample ({batch}), got {valid_text}")
    text_mask = (torch.arange(text_tokens)[None, :] < torch.tensor(valid_text)[:, None]).to(device)

    if family in arch_video.INPUT_BUILDERS:
        kw = arch_video.INPUT_BUILDERS[family](config, batch=batch, height=height, width=width, frames=frames,
                                               text_tokens=text_tokens, randn=randn, device=device, dtype=dtype,
                                               text_mask=text_mask)
    elif family == "cogvideox":
        kw = dict(hidden_states=randn(batch, lf, config["in_channels"], lh, lw),
                  encoder_hidden_states=randn(batch, text_tokens, config["text_embed_dim"]),
                  timestep=t.long())
        if config.get("use_rotary_positional_embeddings"):
            kw["image_rotary_emb"] = _cogvideox_rope(config, lh, lw, lf, device)
        if config.get("ofs_embed_dim"):
            kw["ofs"] = torch.full((batch,), 2.0, device=device, dtype=dtype)
    elif family == "hunyuanvideo":
        kw = dict(hidden_states=randn(batch, config["in_channels"], lf, lh, lw), timestep=t.to(dtype),
                  encoder_hidden_states=randn(batch, text_tokens, config["text_embed_dim"]),
                  encoder_attention_mask=text_mask.to(dtype),
                  pooled_projections=randn(batch, config["pooled_projection_dim"]))
        if config.get("guidance_embeds", True):
            kw["guidance"] = torch.full((batch,), (guidance or 6.0) * 1000.0, device=device, dtype=dtype)
    elif family == "mochi":
        kw = dict(hidden_states=randn(batch, config["in_channels"], lf, lh, lw),
                  encoder_hidden_states=randn(batch, text_tokens, config["text_embed_dim"]),
                  timestep=t.to(dtype), encoder_attention_mask=text_mask)
    elif family == "flux":
        n = (lh // 2) * (lw // 2)
        rows, cols = torch.meshgrid(torch.arange(lh // 2), torch.arange(lw // 2), indexing="ij")
        img_ids = torch.stack([torch.zeros_like(rows), rows, cols], dim=-1).reshape(n, 3).float()
        kw = dict(hidden_states=randn(batch, n, config["in_channels"]),
                  encoder_hidden_states=randn(batch, text_tokens, config["joint_attention_dim"]),
                  pooled_projections=randn(batch, config["pooled_projection_dim"]), timestep=(t / 1000).to(dtype),
                  img_ids=img_ids.to(device=device, dtype=dtype),
                  txt_ids=torch.zeros(text_tokens, 3, device=device, dtype=dtype))
        if config.get("guidance_embeds"):
            kw["guidance"] = torch.full((batch,), guidance or 3.5, device=device, dtype=torch.float32)
    elif family == "sd3":
        kw = dict(hidden_states=randn(batch, config["in_channels"], lh, lw),
                  encoder_hidden_states=randn(batch, text_tokens, config["joint_attention_dim"]),
                  pooled_projections=randn(batch, config["pooled_projection_dim"]), timestep=t.to(dtype))
    else:  # pragma: no cover - SUPPORTED_MODELS, arch_video and ARCHS hold no other family
        raise ValueError(f"unknown family {family!r}")
    kw["return_dict"] = False
    return kw


def _crop_region(grid: tuple[int, int], base_width: int, base_height: int):
    """The (top-left, bottom-right) region of the base grid that a (h, w) grid covers when fitted into it
    keeping its aspect ratio and centred: how the CogVideoX pipeline crops its rotary coordinates."""
    h, w = grid
    if h / w > base_height / base_width:
        rh, rw = base_height, int(round(base_height / h * w))
    else:
        rw, rh = base_width, int(round(base_width / w * h))
    top, left = int(round((base_height - rh) / 2.0)), int(round((base_width - rw) / 2.0))
    return (top, left), (top + rh, left + rw)


def _cogvideox_rope(config: dict, lh: int, lw: int, lf: int, device: torch.device):
    import inspect

    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    p, p_t = config["patch_size"], config.get("patch_size_t")
    gh, gw = lh // p, lw // p
    base_w, base_h = config["sample_width"] // p, config["sample_height"] // p
    if p_t is None:  # CogVideoX 1.0
        return get_3d_rotary_pos_embed(embed_dim=config["attention_head_dim"],
                                       crops_coords=_crop_region((gh, gw), base_w, base_h), grid_size=(gh, gw),
                                       temporal_size=lf, device=device)
    if "grid_type" not in inspect.signature(get_3d_rotary_pos_embed).parameters:
        raise RuntimeError("CogVideoX1.5 rotary embeddings need diffusers >= 0.32 (get_3d_rotary_pos_embed "
                           "with grid_type='slice')")
    return get_3d_rotary_pos_embed(embed_dim=config["attention_head_dim"], crops_coords=None, grid_size=(gh, gw),
                                   temporal_size=math.ceil(lf / p_t), grid_type="slice", max_size=(base_h, base_w),
                                   device=device)
