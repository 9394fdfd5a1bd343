"""The tiny offline pipelines: real diffusers classes, real tokenizers, deterministic weights, text prompts."""

from __future__ import annotations

import pytest
import torch

from tests.support.patching import run, tiny_pipeline
from sagegen.models import tiny
from sagegen.models import _tiny_tokenizers as toks

PIPELINES = {"cogvideox": "CogVideoXPipeline", "hunyuanvideo": "HunyuanVideoPipeline", "mochi": "MochiPipeline",
             "flux": "FluxPipeline", "sd3": "StableDiffusion3Pipeline"}


@pytest.mark.parametrize("family", tiny.TINY_FAMILIES)
def test_pipeline_generates_from_a_text_prompt(family, seed):
    pipe = tiny_pipeline(family)
    assert type(pipe).__name__ == PIPELINES[family]
    assert type(pipe.transformer).__name__ == tiny._TRANSFORMER_CLASSES[family]
    call = {**tiny.TINY_CALL_DEFAULTS[family], "num_inference_steps": 2}
    out = pipe(prompt="a small red fox in the snow", generator=torch.Generator().manual_seed(seed),
               output_type="pt", **call)
    media = out.frames if hasattr(out, "frames") else out.images
    if "num_frames" in call:
        assert media.shape[:2] == (1, call["num_frames"]) and media.shape[-2:] == (call["height"], call["width"])
    else:
        assert media.shape == (1, 3, call["height"], call["width"])
    assert torch.isfinite(media).all() and media.std() > 0.01
    # different prompts give different outputs (the tokenizers and text encoders carry the text through)
    a = run(pipe, family, seed, prompt="a small red fox in the snow", num_inference_steps=2)
    b = run(pipe, family, seed, prompt="a blue boat on the ocean at night", num_inference_steps=2)
    assert not torch.allclose(a, b)


def test_weights_are_deterministic_in_the_seed():
    a, b, c = (tiny.build_tiny_transformer("sd3", seed=s) for s in (3, 3, 4))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    state = torch.random.get_rng_state()
    tiny.build_tiny_transformer("flux", seed=1)
    assert torch.equal(torch.random.get_rng_state(), state), "building must not disturb the global RNG"


def test_tiny_transformers_use_kernel_head_dims_and_the_medium_dual_attention():
    for family in tiny.TINY_FAMILIES:
        assert tiny.tiny_transformer_config(family)["attention_head_dim"] == 64
    sd3 = tiny_pipeline("sd3").transformer
    assert sd3.transformer_blocks[0].attn2 is not None  # SD3.5-medium's image-only attention
    assert getattr(sd3.transformer_blocks[1], "attn2", None) is None  # SD3.5-large style layer


def test_bfloat16_pipeline_builds_in_that_dtype():
    pipe = tiny.build_tiny_pipeline("cogvideox", dtype=torch.bfloat16)
    dtypes = {p.dtype for c in pipe.components.values() if isinstance(c, torch.nn.Module) for p in c.parameters()}
    assert dtypes == {torch.bfloat16}


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"family='wan'.*cogvideox.*sd3"):
        tiny.build_tiny_pipeline("wan")
    with pytest.raises(ValueError, match="dtype"):
        tiny.build_tiny_pipeline("flux", dtype=torch.float64)
    with pytest.raises(TypeError, match="seed"):
        tiny.build_tiny_pipeline("flux", seed="0")


def test_tokenizers_are_the_pipeline_classes_and_behave_like_the_real_ones():
    clip, t5, llama = toks.clip_tokenizer(), toks.t5_tokenizer(), toks.llama_tokenizer()
    assert type(clip).__name__ in ("CLIPTokenizer", "CLIPTokenizerFast")
    assert type(t5).__name__ in ("T5Tokenizer", "T5TokenizerFast")
    assert type(llama).__name__ in ("LlamaTokenizer", "LlamaTokenizerFast")
    ids = clip("A Cat")["input_ids"]
    assert clip.convert_ids_to_tokens(ids)[0] == toks.CLIP_BOS and ids[-1] == clip.eos_token_id
    assert ids == clip("a cat")["input_ids"] and len(ids) == 4  # lower-cased, whole words
    ids = t5("a cat")["input_ids"]
    assert len(ids) == 3 and ids[-1] == t5.eos_token_id == 1 and t5.pad_token_id == 0
    ids = llama("a cat")["input_ids"]
    assert ids[0] == llama.bos_token_id and len(ids) == 3
    # any text tokenizes, and distinct prompts give distinct ids
    for tk in (clip, t5, llama):
        assert tk("zebra xylophone!")["input_ids"] != tk("zebra xylophones!")["input_ids"]
        padded = tk(["a cat", "a dog on the beach"], padding="max_length", max_length=12, return_tensors="pt")
        assert padded.attention_mask[0].tolist()[:2] == [1, 1] and padded.attention_mask[0, -1] == 0


def test_hunyuan_template_prefix_is_crop_start_tokens():
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

    llama = toks.llama_tokenizer()
    prefix = DEFAULT_PROMPT_TEMPLATE["template"].split("{}")[0]
    assert len(llama(prefix)["input_ids"]) == DEFAULT_PROMPT_TEMPLATE["crop_start"] == 95
    # so the pipeline keeps exactly the prompt and <|eot_id|> after cropping
    pipe = tiny_pipeline("hunyuanvideo")
    embeds, mask = pipe._get_llama_prompt_embeds("a cat", DEFAULT_PROMPT_TEMPLATE, device=torch.device("cpu"))
    assert int(mask.sum()) == 3 and mask.shape[1] == 256
