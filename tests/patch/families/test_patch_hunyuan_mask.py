"""HunyuanVideo with a batch of two prompts of different lengths: the text key-padding mask is honoured.

The transformer joins image and text tokens and masks each sample's padded text tokens as keys with a boolean
[B, 1, 1, N] mask; sageattn applies it per key inside the kernel. Checked at the attention call (against SDPA
with the mask, and against SDPA over each sample's unpadded tokens) and through the whole transformer.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import sagegen
from tests.support.patching import rel_l1, tiny_pipeline
from sagegen.models.tiny import TINY_CALL_DEFAULTS
from sagegen.patch import set_attention_override

PROMPTS = ["a cat", "a red car drives over a long bridge at night, cinematic, detailed"]
ATTN_RTOL = 0.06  # one sageattn call vs fp32 SDPA (the kernel's per-call error is ~0.02-0.04 at head dim 64)


@pytest.fixture(scope="module")
def captured():
    """The pipeline's real inputs: the transformer kwargs, and every main-block attention call (q, k, v, mask)."""
    pipe = tiny_pipeline("hunyuanvideo")
    transformer_kwargs, calls = {}, []

    def grab(module, args, kwargs):
        if not transformer_kwargs:
            transformer_kwargs.update(kwargs)

    def keep(q, k, v, mask, is_causal, scale):
        calls.append((q, k, v, mask))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)

    handle = pipe.transformer.register_forward_pre_hook(grab, with_kwargs=True)
    sagegen.patch(pipe)
    set_attention_override(pipe, keep)
    try:
        pipe(prompt=PROMPTS, generator=torch.Generator().manual_seed(0), output_type="latent",
             **{**TINY_CALL_DEFAULTS["hunyuanvideo"], "num_inference_steps": 1})
    finally:
        handle.remove()
        sagegen.unpatch(pipe)
    return pipe, transformer_kwargs, calls


def _key_padding_calls(calls):
    return [c for c in calls if c[3] is not None and c[3].shape[1:3] == (1, 1)]


def test_prompts_give_different_valid_lengths(captured):
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

    pipe, kwargs, calls = captured
    text_mask = kwargs["encoder_attention_mask"]
    lengths = text_mask.sum(dim=1).tolist()
    assert text_mask.shape[0] == 2 and lengths[0] < lengths[1]
    # The pipeline cropped the template (crop_start tokens): what is left is the prompt and <|eot_id|>.
    crop = DEFAULT_PROMPT_TEMPLATE["crop_start"]
    expected = [len(pipe.tokenizer(DEFAULT_PROMPT_TEMPLATE["template"].format(p))["input_ids"]) - crop
                for p in PROMPTS]
    assert lengths == expected
    main = _key_padding_calls(calls)
    assert len(main) == 2, "both main blocks (double and single stream) receive the key-padding mask"
    _, _, frames, height, width = kwargs["hidden_states"].shape
    n_img = frames * (height // 2) * (width // 2)  # patch 1 x 2 x 2
    for q, k, v, mask in main:
        assert mask.dtype == torch.bool and mask.shape == (2, 1, 1, k.shape[2])
        assert mask[:, 0, 0].sum(dim=1).tolist() == [n_img + n for n in lengths]
        assert (mask[:, 0, 0].int().diff(dim=1) <= 0).all(), "valid keys first, padding last"


def test_masked_sageattn_matches_sdpa_with_mask(captured, seed):
    _, _, calls = captured
    for q, k, v, mask in _key_padding_calls(calls)[:2]:
        # fresh random values on the real shapes and the real mask, plus the pipeline's own values
        for qq, kk, vv in ((q, k, v), tuple(torch.randn_like(t) * 2 for t in (q, k, v))):
            qq, kk, vv = (t.to(torch.bfloat16) for t in (qq, kk, vv))
            ref = F.scaled_dot_product_attention(qq.float(), kk.float(), vv.float(), attn_mask=mask)
            out = sagegen.sageattn(qq, kk, vv, attn_mask=mask, config=sagegen.DIFFUSION_CONFIG).float()
            assert rel_l1(out, ref) <= ATTN_RTOL
            # the same, per sample, over only its valid keys (what "masked" means), ...
            for b in range(2):
                n = int(mask[b, 0, 0].sum())
                alone = F.scaled_dot_product_attention(qq[b:b + 1].float(), kk[b:b + 1, :, :n].float(),
                                                       vv[b:b + 1, :, :n].float())
                assert rel_l1(out[b:b + 1], alone) <= ATTN_RTOL
            # ... and ignoring the mask is clearly wrong, so the check above has teeth.
            unmasked = sagegen.sageattn(qq, kk, vv, config=sagegen.DIFFUSION_CONFIG).float()
            assert rel_l1(unmasked[0:1], ref[0:1]) > 5 * rel_l1(out[0:1], ref[0:1])


def test_transformer_batch2_patched_matches_unpatched(captured):
    pipe, kwargs, _ = captured
    transformer = pipe.transformer
    with torch.no_grad():
        reference = transformer(**kwargs)[0]
        sagegen.patch(transformer)
        try:
            patched = transformer(**kwargs)[0]
            # the same patched model with the key mask dropped inside attention: must be far off
            set_attention_override(transformer, lambda q, k, v, m, c, s: sagegen.sageattn(
                q, k, v, config=sagegen.DIFFUSION_CONFIG))
            maskless = transformer(**kwargs)[0]
        finally:
            sagegen.unpatch(transformer)
    for b in range(2):
        err = rel_l1(patched[b], reference[b])
        assert err <= 0.05, (b, err)
        assert rel_l1(maskless[b], reference[b]) > 3 * err
