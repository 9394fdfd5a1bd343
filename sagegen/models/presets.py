"""Model presets: hub ids and the generation defaults each model's authors recommend.

Every full-size preset cites where its defaults come from. The built-in ``tiny-*`` presets are random-weight
pipelines built in code (`sagegen.models.tiny`), for tests and demos on a CPU.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

FAMILIES = ("cogvideox", "hunyuanvideo", "mochi", "flux", "sd3", "wan", "ltx", "qwenimage", "hunyuanvideo15")
# families whose full-size pipeline `--random-weights` can build (sagegen.models.random_weights)
RANDOM_WEIGHT_FAMILIES = frozenset({"cogvideox", "hunyuanvideo", "mochi", "flux", "sd3", "wan"})


@dataclass(frozen=True)
class Preset:
    name: str
    family: str                      # one of FAMILIES
    kind: str                        # "video" | "image"
    pipeline: str                    # diffusers pipeline class
    hub_id: str | None               # None for the built-in tiny models
    height: int
    width: int
    steps: int
    guidance: float
    dtype: str                       # recommended torch dtype ("bfloat16" | "float16" | "float32")
    frames: int | None = None        # video models only
    fps: int | None = None           # video models only
    frame_step: int = 1              # frames fit the VAE when they are k * frame_step + 1
    size_multiple: int = 16          # height and width must be multiples of this (VAE scale x patch size)
    max_sequence_length: int | None = None
    variant: str | None = None       # weight file variant on the hub (e.g. "bf16")
    gated: bool = False              # the hub repo needs a licence acceptance and a token
    alt_hub_ids: tuple[str, ...] = ()  # other names the same weights are cached under (renamed orgs)
    aliases: tuple[str, ...] = ()
    source: str = ""                 # where the defaults come from
    notes: str = ""
    call_kwargs: dict[str, Any] = field(default_factory=dict)  # extra pipeline-call arguments
    guidance_arg: str | None = "guidance_scale"  # the call argument that takes `guidance` (None: not passed)
    min_steps: int = 1               # fewer denoising steps break the pipeline's scheduler

    @property
    def tiny(self) -> bool:
        return self.hub_id is None

    @property
    def is_video(self) -> bool:
        return self.kind == "video"

    def hub_ids(self) -> tuple[str, ...]:
        return ((self.hub_id,) if self.hub_id else ()) + self.alt_hub_ids

    def defaults(self) -> dict[str, Any]:
        return {"height": self.height, "width": self.width, "frames": self.frames, "steps": self.steps,
                "guidance": self.guidance, "fps": self.fps, "dtype": self.dtype}


_COGVIDEOX_SRC = ("CogVideoX model cards (huggingface.co/THUDM/CogVideoX-2b, -5b): 720x480, 49 frames (6 s at "
                  "8 fps), 50 steps, guidance 6; FP16 recommended for 2B, BF16 for 5B; diffusers CogVideoXPipeline "
                  "defaults steps=50, guidance_scale=6")

PRESETS: dict[str, Preset] = {}


def _add(p: Preset) -> None:
    PRESETS[p.name] = p


# --- CogVideoX ---------------------------------------------------------------------------------------------
_add(Preset("cogvideox-2b", "cogvideox", "video", "CogVideoXPipeline", "THUDM/CogVideoX-2b",
            height=480, width=720, frames=49, fps=8, steps=50, guidance=6.0, dtype="float16", frame_step=4,
            alt_hub_ids=("zai-org/CogVideoX-2b",), aliases=("cogvideox",),
            source=_COGVIDEOX_SRC))
_add(Preset("cogvideox-5b", "cogvideox", "video", "CogVideoXPipeline", "THUDM/CogVideoX-5b",
            height=480, width=720, frames=49, fps=8, steps=50, guidance=6.0, dtype="bfloat16", frame_step=4,
            alt_hub_ids=("zai-org/CogVideoX-5b",), source=_COGVIDEOX_SRC))
# The CogVideoX1.5 pipeline's own default size is transformer.config.sample_height/width x 8 (the 1.5
# transformer config stores 300, i.e. 2400x2400), which is unusable: always pass the recommended 1360x768.
_add(Preset("cogvideox1.5-5b", "cogvideox", "video", "CogVideoXPipeline", "THUDM/CogVideoX1.5-5B",
            height=768, width=1360, frames=81, fps=16, steps=50, guidance=6.0, dtype="bfloat16", frame_step=16,
            alt_hub_ids=("zai-org/CogVideoX1.5-5B",),
            aliases=("cogvideox1.5",),
            source="CogVideoX1.5-5B model card (huggingface.co/zai-org/CogVideoX1.5-5B): 1360x768, frames 16N+1 "
                   "(default 81), 16 fps, BF16; CogVideo repo README (5-10 s at 16 fps); 50 steps, guidance 6",
            notes="the pipeline's own default resolution (from the transformer config) is not usable; the "
                  "preset always passes 1360x768"))

# --- HunyuanVideo ------------------------------------------------------------------------------------------
_add(Preset("hunyuanvideo", "hunyuanvideo", "video", "HunyuanVideoPipeline", "hunyuanvideo-community/HunyuanVideo",
            height=720, width=1280, frames=129, fps=24, steps=50, guidance=6.0, dtype="bfloat16", frame_step=4,
            aliases=("hunyuan",),
            source="tencent/HunyuanVideo README (720p 1280x720, 129 frames, 50 steps, embedded guidance 6.0, "
                   "flow shift 7.0) and diffusers HunyuanVideoPipeline defaults (720x1280, 129 frames, 50 steps, "
                   "guidance_scale=6.0); 24 fps as in the model card's export_to_video example",
            notes="13B transformer + 8B Llama text encoder: needs ~60 GB at 720p, or --offload model "
                  "--vae-tiling on smaller GPUs"))

# --- Mochi -------------------------------------------------------------------------------------------------
# MochiPipeline's linear-quadratic sigma schedule puts half the steps on each part and divides by both halves'
# lengths: one step is a ZeroDivisionError inside diffusers (pipeline_mochi.linear_quadratic_schedule).
_MOCHI_MIN_STEPS = 2
_add(Preset("mochi-1", "mochi", "video", "MochiPipeline", "genmo/mochi-1-preview",
            height=480, width=848, frames=84, fps=30, steps=64, guidance=4.5, dtype="bfloat16", frame_step=6,
            variant="bf16", aliases=("mochi", "mochi-1-preview"), min_steps=_MOCHI_MIN_STEPS,
            source="genmo/mochi-1-preview model card and diffusers Mochi docs (variant='bf16', num_frames=84, "
                   "export at fps=30); diffusers MochiPipeline defaults 848x480, 64 steps, guidance_scale=4.5",
            notes="84 frames decode to 79 (the VAE keeps 6k+1 frames)"))

# --- FLUX.1 ------------------------------------------------------------------------------------------------
_add(Preset("flux.1-schnell", "flux", "image", "FluxPipeline", "black-forest-labs/FLUX.1-schnell",
            height=1024, width=1024, steps=4, guidance=0.0, dtype="bfloat16", max_sequence_length=256,
            aliases=("flux", "flux-schnell"),
            source="diffusers Flux docs (timestep-distilled FLUX.1-schnell: guidance_scale=0, max_sequence_length "
                   "<= 256, few steps: 4) and the FLUX.1-schnell model card (1024x1024, 4 steps)"))
_add(Preset("flux.1-dev", "flux", "image", "FluxPipeline", "black-forest-labs/FLUX.1-dev",
            height=1024, width=1024, steps=50, guidance=3.5, dtype="bfloat16", max_sequence_length=512,
            gated=True, aliases=("flux-dev",),
            source="FLUX.1-dev model card and diffusers Flux docs (guidance-distilled: 1024x1024, "
                   "guidance_scale=3.5, 50 steps, max_sequence_length=512)"))

# --- Stable Diffusion 3.5 ----------------------------------------------------------------------------------
_add(Preset("sd3.5-large", "sd3", "image", "StableDiffusion3Pipeline", "stabilityai/stable-diffusion-3.5-large",
            height=1024, width=1024, steps=28, guidance=3.5, dtype="bfloat16", gated=True,
            aliases=("sd3.5", "sd3"),
            source="stabilityai/stable-diffusion-3.5-large model card diffusers example (28 steps, "
                   "guidance_scale=3.5, bfloat16, 1024x1024)"))
_add(Preset("sd3.5-large-turbo", "sd3", "image", "StableDiffusion3Pipeline",
            "stabilityai/stable-diffusion-3.5-large-turbo",
            height=1024, width=1024, steps=4, guidance=0.0, dtype="bfloat16", gated=True,
            aliases=("sd3.5-turbo",),
            source="stable-diffusion-3.5-large-turbo model card and Stability's official Space (4 steps, "
                   "guidance_scale=0.0, 1024x1024)"))
_add(Preset("sd3.5-medium", "sd3", "image", "StableDiffusion3Pipeline", "stabilityai/stable-diffusion-3.5-medium",
            height=1024, width=1024, steps=40, guidance=4.5, dtype="bfloat16", gated=True,
            source="stabilityai/stable-diffusion-3.5-medium model card diffusers example (40 steps, "
                   "guidance_scale=4.5, bfloat16)"))

# --- Wan 2.1 / 2.2 -----------------------------------------------------------------------------------------
# Sizes: multiples of 16 (8x VAE x 2x2 patches; TI2V-5B's VAE is 16x, so 32); frames 4k+1. The pipeline pads
# the UMT5 prompt to 512 tokens (WanPipeline max_sequence_length=512) and runs CFG as two transformer calls.
_WAN_DOC = ("diffusers WanPipeline (pipelines/wan/pipeline_wan.py, 0.42.1): call defaults 480x832, 81 frames, "
            "50 steps, guidance_scale=5.0; its example loads Wan2.1-T2V-14B at 720x1280, 81 frames, guidance 5.0, "
            "bf16 transformer with an fp32 VAE, flow_shift 5.0 for 720p / 3.0 for 480p, exported at 16 fps")
_add(Preset("wan2.1-t2v-1.3b", "wan", "video", "WanPipeline", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
            height=480, width=832, frames=81, fps=16, steps=50, guidance=5.0, dtype="bfloat16", frame_step=4,
            max_sequence_length=512, aliases=("wan", "wan2.1", "wan2.1-1.3b"),
            source=_WAN_DOC + "; Wan2.1-T2V-1.3B model card: 480p (832x480) only"))
_add(Preset("wan2.1-t2v-14b", "wan", "video", "WanPipeline", "Wan-AI/Wan2.1-T2V-14B-Diffusers",
            height=720, width=1280, frames=81, fps=16, steps=50, guidance=5.0, dtype="bfloat16", frame_step=4,
            max_sequence_length=512, aliases=("wan2.1-14b",), source=_WAN_DOC))
_add(Preset("wan2.2-t2v-a14b", "wan", "video", "WanPipeline", "Wan-AI/Wan2.2-T2V-A14B-Diffusers",
            height=720, width=1280, frames=81, fps=16, steps=40, guidance=4.0, dtype="bfloat16", frame_step=4,
            max_sequence_length=512, aliases=("wan2.2", "wan2.2-a14b"), call_kwargs={"guidance_scale_2": 3.0},
            source="diffusers Wan docs, Wan2.2 T2V example (Wan-AI/Wan2.2-T2V-A14B-Diffusers: 720x1280, 81 "
                   "frames, 40 steps, guidance_scale=4.0 for the high-noise expert, guidance_scale_2=3.0 for the "
                   "low-noise one; boundary_ratio 0.875 from the repo's model_index.json); 16 fps as its "
                   "export_to_video example",
            notes="two 14B experts (transformer, transformer_2): ~57 GB of bf16 weights"))
_add(Preset("wan2.2-ti2v-5b", "wan", "video", "WanPipeline", "Wan-AI/Wan2.2-TI2V-5B-Diffusers",
            height=704, width=1280, frames=121, fps=24, steps=50, guidance=5.0, dtype="bfloat16", frame_step=4,
            size_multiple=32, max_sequence_length=512, aliases=("wan2.2-5b",),
            source="Wan2.2-TI2V-5B model card and diffusers Wan docs (720p = 1280x704, 121 frames at 24 fps, "
                   "50 steps, guidance_scale=5.0; 16x VAE with expand_timesteps)"))

# --- LTX-Video, Qwen-Image, HunyuanVideo-1.5 -----------------------------------------------------------------
_add(Preset("ltx-video", "ltx", "video", "LTXPipeline", "Lightricks/LTX-Video",
            height=512, width=704, frames=161, fps=25, steps=50, guidance=3.0, dtype="bfloat16", frame_step=8,
            size_multiple=32, max_sequence_length=128, aliases=("ltx", "ltxv"),
            source="diffusers LTXPipeline call defaults (pipelines/ltx/pipeline_ltx.py, 0.42.1): 512x704, 161 "
                   "frames, 50 steps, guidance_scale=3, frame_rate=25, max_sequence_length=128; 32x VAE, 8x in time"))
_add(Preset("qwen-image", "qwenimage", "image", "QwenImagePipeline", "Qwen/Qwen-Image",
            height=1328, width=1328, steps=50, guidance=4.0, dtype="bfloat16", guidance_arg="true_cfg_scale",
            aliases=("qwenimage",),
            source="Qwen/Qwen-Image model card (1:1 at 1328x1328, num_inference_steps=50, true_cfg_scale=4.0, "
                   "negative_prompt ' ', bfloat16)",
            notes="classifier-free guidance (two transformer calls per step) only runs with a negative prompt: "
                  "pass --negative-prompt ' ' as the model card does"))
_add(Preset("hunyuanvideo-1.5", "hunyuanvideo15", "video", "HunyuanVideo15Pipeline",
            "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-720p_t2v",
            height=720, width=1280, frames=121, fps=24, steps=50, guidance=6.0, dtype="bfloat16", frame_step=4,
            guidance_arg=None, aliases=("hunyuanvideo15", "hunyuanvideo-1.5-720p"),
            source="diffusers HunyuanVideo15Pipeline (0.42.1): 121 frames, 50 steps, default size from the "
                   "transformer's target_size 960 at 16:9 = 1280x720; guidance 6.0 as Tencent's 720p t2v setting "
                   "(LightX2V's HunyuanVideo-1.5 example); 24 fps",
            notes="guidance comes from the repo's guider config (the pipeline has no guidance_scale argument); "
                  "--guidance is not passed"))

# --- built-in tiny random-weight pipelines (sagegen.models.tiny) -------------------------------------------
# Sizes are small enough for a CPU in seconds; frame/size constraints follow the tiny VAEs.
_TINY_SRC = "built-in tiny pipeline with random weights (sagegen.models.tiny), for tests and demos"
_add(Preset("tiny-cogvideox", "cogvideox", "video", "CogVideoXPipeline", None,
            height=32, width=32, frames=9, fps=8, steps=4, guidance=6.0, dtype="bfloat16", frame_step=4,
            aliases=("tiny",), source=_TINY_SRC))
_add(Preset("tiny-hunyuanvideo", "hunyuanvideo", "video", "HunyuanVideoPipeline", None,
            height=32, width=32, frames=9, fps=24, steps=4, guidance=6.0, dtype="bfloat16", frame_step=4,
            aliases=("tiny-hunyuan",), source=_TINY_SRC))
_add(Preset("tiny-mochi", "mochi", "video", "MochiPipeline", None,
            height=32, width=32, frames=7, fps=30, steps=4, guidance=4.5, dtype="bfloat16", frame_step=6,
            min_steps=_MOCHI_MIN_STEPS, source=_TINY_SRC))
_add(Preset("tiny-flux", "flux", "image", "FluxPipeline", None,
            height=64, width=64, steps=4, guidance=3.5, dtype="bfloat16", source=_TINY_SRC))
_add(Preset("tiny-sd3", "sd3", "image", "StableDiffusion3Pipeline", None,
            height=64, width=64, steps=4, guidance=4.5, dtype="bfloat16", aliases=("tiny-sd3.5",),
            source=_TINY_SRC))
# (sagegen.models.tiny_video; the name after "tiny-" is its kind)
_TINY_VIDEO_SRC = "built-in tiny pipeline with random weights (sagegen.models.tiny_video), for tests and demos"
_add(Preset("tiny-wan2.1", "wan", "video", "WanPipeline", None, height=32, width=32, frames=9, fps=16, steps=4,
            guidance=5.0, dtype="bfloat16", frame_step=4, aliases=("tiny-wan",), source=_TINY_VIDEO_SRC))
_add(Preset("tiny-wan2.2-a14b", "wan", "video", "WanPipeline", None, height=32, width=32, frames=9, fps=16,
            steps=4, guidance=4.0, dtype="bfloat16", frame_step=4, call_kwargs={"guidance_scale_2": 3.0},
            source=_TINY_VIDEO_SRC + " (two experts, as Wan2.2-T2V-A14B)"))
_add(Preset("tiny-wan2.2-ti2v", "wan", "video", "WanPipeline", None, height=64, width=64, frames=9, fps=24,
            steps=4, guidance=5.0, dtype="bfloat16", frame_step=4, size_multiple=32,
            source=_TINY_VIDEO_SRC + " (48-channel 16x VAE, per-token timesteps, as Wan2.2-TI2V-5B)"))
_add(Preset("tiny-ltx-video", "ltx", "video", "LTXPipeline", None, height=32, width=32, frames=9, fps=25, steps=4,
            guidance=3.0, dtype="bfloat16", frame_step=4, aliases=("tiny-ltx",),
            source=_TINY_VIDEO_SRC + " (LTX-Video's classes, a 4x VAE)"))
_add(Preset("tiny-qwen-image", "qwenimage", "image", "QwenImagePipeline", None, height=32, width=32, steps=4,
            guidance=4.0, dtype="bfloat16", size_multiple=8, guidance_arg="true_cfg_scale",
            source=_TINY_VIDEO_SRC + " (Qwen-Image's classes with a tiny Qwen2.5-VL text encoder, a 4x VAE)"))
_add(Preset("tiny-hunyuanvideo-1.5", "hunyuanvideo15", "video", "HunyuanVideo15Pipeline", None, height=32, width=32,
            frames=9, fps=24, steps=4, guidance=6.0, dtype="bfloat16", frame_step=4, guidance_arg=None,
            aliases=("tiny-hunyuanvideo15",),
            source=_TINY_VIDEO_SRC + " (HunyuanVideo-1.5's classes, tiny Qwen2.5-VL and ByT5 encoders, a 16x VAE; "
                   "guidance 6 set in its guider)"))


def _key(name: str) -> str:
    """Lenient matching: case, dots, dashes and underscores do not matter (flux1-dev = FLUX.1-dev)."""
    return "".join(c for c in name.strip().lower() if c not in "._- ")


_LOOKUP: dict[str, str] = {}
for _p in PRESETS.values():
    for _n in (_p.name, *_p.aliases, *_p.hub_ids()):
        _LOOKUP.setdefault(_key(_n), _p.name)


class UnknownModel(ValueError):
    """A model name that is no preset, alias or known hub id."""


def resolve(name: str) -> Preset:
    """The preset for a name, alias (``cogvideox``) or hub id (``THUDM/CogVideoX-2b``), case-insensitive."""
    key = _key(name)
    if key in _LOOKUP:
        return PRESETS[_LOOKUP[key]]
    close = difflib.get_close_matches(key, list(_LOOKUP), n=3, cutoff=0.7)
    similar = dict.fromkeys(PRESETS[_LOOKUP[c]].name for c in close)
    hint = f"did you mean {' or '.join(map(repr, similar))}? " if similar else ""
    raise UnknownModel(f"unknown model {name!r}; {hint}choose one of: {', '.join(PRESETS)} "
                       "(see `sagegen models`)")


def names() -> list[str]:
    return list(PRESETS)


def tiny_presets() -> list[Preset]:
    return [p for p in PRESETS.values() if p.tiny]


def check_shape(preset: Preset, *, height: int, width: int, frames: int | None,
                steps: int | None = None) -> tuple[list[str], list[str]]:
    """(errors, warnings) about a requested size for this model, each naming the option and a fix.

    Height and width that the VAE and patch size cannot take are errors, and so are fewer steps than the
    pipeline's scheduler can take; a frame count that is not ``k * frame_step + 1`` is only a warning (the
    pipelines round it, so fewer frames come out).
    """
    errors, warnings = [], []
    if steps is not None and steps < preset.min_steps:
        errors.append(f"--steps {steps}: {preset.name}'s pipeline ({preset.pipeline}) needs at least "
                      f"{preset.min_steps} denoising steps")
    m = preset.size_multiple
    for opt, v in (("--height", height), ("--width", width)):
        if v <= 0 or v % m:
            lo, hi = max(m, v // m * m), max(m, (v // m + 1) * m)
            errors.append(f"{opt} {v} must be a positive multiple of {m} for {preset.name} (try {lo} or {hi})")
    if preset.is_video and frames is not None:
        s = preset.frame_step
        if frames < 1:
            errors.append(f"--frames {frames} must be at least 1")
        elif (frames - 1) % s and frames != preset.frames:  # the authors' own default is left alone
            lo = (frames - 1) // s * s + 1
            warnings.append(f"--frames {frames} is not {s}k+1 for {preset.name}'s VAE; about {lo} frames will "
                            f"come out (use {lo} or {lo + s} to choose exactly)")
    return errors, warnings
