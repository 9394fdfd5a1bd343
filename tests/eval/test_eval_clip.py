"""CLIPSIM / CLIP-T / CLIPScore on a tiny random-weight open_clip model, the EvalCrafter preprocessing, and
offline resolution of --clip-model."""

import numpy as np
import pytest
import torch

from sagegen.eval import clip as C
from sagegen.testing.metric_standins import write_tiny_clip
from sagegen.eval.weights import BadOption, WeightsMissing, resolve_clip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = write_tiny_clip(tmp_path_factory.mktemp("clip") / "tiny")
    return C.load_clip(resolve_clip(f"local-dir:{folder}"))


@pytest.fixture(scope="module")
def frames():
    return np.random.default_rng(0).integers(0, 256, (5, 48, 80, 3), dtype=np.uint8)


def test_linear_resize_known_answer():
    # cv2.INTER_LINEAR, half-pixel centres: [0, 255] -> 4 samples at src x = 0(clamped), .25, .75, 1(clamped)
    row = np.array([0, 255], np.uint8)
    img = np.stack([np.stack([row] * 3, -1)] * 2)[None]  # 1x2x2x3
    out = C.resize_uint8_linear(img, (2, 4))
    assert out[0, 0, :, 0].tolist() == [0, 64, 191, 255]
    assert out.dtype == np.uint8


def _capture(clip_model, monkeypatch):
    seen = []
    orig = clip_model.model.encode_image

    def spy(x, *a, **k):
        seen.append(x.detach().clone())
        return orig(x, *a, **k)

    monkeypatch.setattr(clip_model.model, "encode_image", spy)
    return seen


def test_evalcrafter_feeds_raw_pixels_squashed(tiny, frames, monkeypatch):
    seen = _capture(tiny, monkeypatch)
    C.clipsim(tiny, frames, "a red ball", "evalcrafter")
    x = torch.cat(seen)
    assert x.shape == (5, 3, 32, 32)  # squashed to the model's square input, no crop
    want = torch.from_numpy(C.resize_uint8_linear(frames, (32, 32))).permute(0, 3, 1, 2).float()
    assert torch.equal(x, want)  # raw 0..255, unnormalised, uint8-rounded (cv2 semantics)
    seen.clear()
    C.clipt(tiny, frames, "evalcrafter")
    y = torch.cat(seen)
    assert y.max() > 200 and not torch.equal(y, y.round())  # float bilinear, not rounded
    seen.clear()
    C.clipsim(tiny, frames, "a red ball", "standard")
    z = torch.cat(seen)
    assert z.abs().max() < 3  # mean/std normalised


def test_clipsim_is_mean_frame_prompt_cosine(tiny, frames):
    with torch.no_grad():
        x = C.standard_input(tiny, frames)
        img = tiny.model.encode_image(x)
        txt = tiny.model.encode_text(tiny.tokenizer(["a red ball"]))
        cos = torch.nn.functional.cosine_similarity(img, txt.expand_as(img), dim=1)
    assert C.clipsim(tiny, frames, "a red ball", "standard") == pytest.approx(float(cos.mean()), abs=1e-5)
    assert C.clipsim(tiny, frames, "a red ball", "evalcrafter") != pytest.approx(float(cos.mean()), abs=1e-4)


def test_clipt_known_answers(tiny, frames):
    still = np.repeat(frames[:1], 4, axis=0)
    assert C.clipt(tiny, still, "evalcrafter") == pytest.approx(1.0, abs=1e-5)
    with torch.no_grad():
        f = tiny.model.encode_image(C.evalcrafter_clipt_input(frames, (32, 32)))
        f = f / f.norm(dim=-1, keepdim=True)
    want = float((f[:-1] * f[1:]).sum(1).mean())
    assert C.clipt(tiny, frames, "evalcrafter") == pytest.approx(want, abs=1e-5)
    with pytest.raises(ValueError, match="two frames"):
        C.clipt(tiny, frames[:1], "standard")
    with pytest.raises(ValueError, match="--clip-mode"):
        C.clipsim(tiny, frames, "x", "fancy")


def test_clipscore_scale_and_clamp(tiny, frames):
    s = C.frame_text_similarities(tiny, frames[:1], "a red ball", "standard")[0]
    assert C.clipscore(tiny, frames[0], "a red ball") == pytest.approx(100 * max(s, 0.0), abs=1e-4)


def test_resolve_clip_specs(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.delenv("SAGEGEN_CLIP_MODEL", raising=False)
    with pytest.raises(WeightsMissing, match="ViT-B-32/openai not found offline.*--clip-model"):
        resolve_clip(None)
    with pytest.raises(BadOption, match="--clip-model: unknown open_clip model 'ViT-Q-99'"):
        resolve_clip("ViT-Q-99/openai")
    with pytest.raises(BadOption, match="no pretrained tag 'nope'"):
        resolve_clip("ViT-B-32/nope")
    empty = write_tiny_clip(tmp_path / "noweights", weights=False)
    with pytest.raises(WeightsMissing, match="no weights file"):
        resolve_clip(f"local-dir:{empty}")
    with pytest.raises(WeightsMissing, match="not found"):
        resolve_clip(f"local-dir:{tmp_path / 'absent'}")
    ckpt = tmp_path / "ckpt.bin"
    ckpt.write_bytes(b"PK\x03\x04 a torch.save zip")  # only the first bytes are looked at here
    src = resolve_clip(str(ckpt))
    assert src.arch == "ViT-B-32-quickgelu" and src.checkpoint == str(ckpt)
    assert resolve_clip(f"ViT-B-16:{ckpt}").arch == "ViT-B-16"
    # a pretrained tag found in the (offline) Hugging Face cache layout
    snap = tmp_path / "hf" / "models--timm--vit_base_patch32_clip_224.openai"
    (snap / "refs").mkdir(parents=True)
    (snap / "refs" / "main").write_text("abc123")
    (snap / "snapshots" / "abc123").mkdir(parents=True)
    (snap / "snapshots" / "abc123" / "open_clip_model.safetensors").write_bytes(b"x")
    src = resolve_clip("ViT-B-32/openai")
    assert src.checkpoint.endswith("open_clip_model.safetensors")
    assert src.force_quick_gelu and src.is_evalcrafter_model and src.label == "ViT-B-32/openai"


def _fake_hf_cache_with(tmp_path, state: dict) -> None:
    """The default NAME/TAG, ViT-B-32/openai, as huggingface_hub lays it out in an offline cache."""
    from safetensors.torch import save_file

    repo = tmp_path / "hf" / "models--timm--vit_base_patch32_clip_224.openai"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123abcd")
    snap = repo / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(snap / "open_clip_model.safetensors"))


def test_name_tag_loads_from_an_offline_cache(tmp_path, monkeypatch, frames):
    """Regression (issue 22, bug 3): every NAME/TAG failed in create_model_and_transforms with
    "got multiple values for keyword argument 'force_preprocess_cfg'". The real default spec goes through
    resolve_clip + load_clip; only ViT-B-32's size is shrunk (open_clip's registry entry swapped for the
    tiny config) so the random weights stay a few MB."""
    import open_clip
    import open_clip.factory as factory

    from sagegen.testing.metric_standins import TINY_CLIP_CFG

    monkeypatch.setitem(factory._MODEL_CONFIGS, "ViT-B-32", dict(TINY_CLIP_CFG, quick_gelu=False))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("SAGEGEN_CLIP_MODEL", raising=False)
    torch.manual_seed(1)
    ref = open_clip.create_model("ViT-B-32", force_quick_gelu=True)
    _fake_hf_cache_with(tmp_path, ref.state_dict())

    clip = C.load_clip(resolve_clip(None))  # the default: ViT-B-32/openai
    assert clip.label == "ViT-B-32/openai" and clip.is_evalcrafter_model and clip.image_size == (32, 32)
    # the cached random weights were loaded (not a fresh init), with the tag's QuickGELU
    got = clip.model.state_dict()
    assert all(torch.equal(got[k], v) for k, v in ref.state_dict().items())
    assert clip.model.visual.transformer.resblocks[0].mlp.gelu.__class__.__name__ == "QuickGELU"
    # the tag's preprocessing (OpenAI mean/std, bicubic, shortest-side resize + centre crop) is the one applied
    shown = repr(clip.preprocess)
    assert "interpolation=bicubic" in shown and "CenterCrop" in shown and "0.26862954" in shown
    x = C.standard_input(clip, frames[:1])
    assert x.shape == (1, 3, 32, 32) and x.min() < -1.0
    ref.eval()
    with torch.no_grad():
        want = ref.encode_image(x)
    want = want / want.norm(dim=-1, keepdim=True)
    assert torch.allclose(clip.encode_images(x), want, atol=1e-5)
    assert -1.0 <= C.clipsim(clip, frames, "a red ball", "evalcrafter") <= 1.0


def test_without_opencv_the_evalcrafter_resize_is_labelled_approximate(tmp_path, monkeypatch):
    from sagegen.eval.runner import EvalOptions, evaluate
    from sagegen.testing.run_dirs import make_synthetic_run

    run = make_synthetic_run(tmp_path / "r", prompts=["a", "b"], frames=2, height=32, width=32)
    clip_dir = write_tiny_clip(tmp_path / "clip")
    monkeypatch.setattr(C, "has_exact_resize", lambda: False)
    doc = evaluate(run, EvalOptions(metrics=["clipsim", "clipt"], clip_model=f"local-dir:{clip_dir}"),
                   log=lambda s: None)
    assert "approximated" in doc["metrics"]["clipsim"]["note"] and "opencv" in doc["metrics"]["clipsim"]["note"]
    assert "approximated" not in doc["metrics"]["clipt"]["note"]  # CLIP-T's resize is float bilinear: no OpenCV
    monkeypatch.setattr(C, "has_exact_resize", lambda: True)
    doc = evaluate(run, EvalOptions(metrics=["clipsim"], clip_model=f"local-dir:{clip_dir}", clip_mode="standard"),
                   log=lambda s: None)
    assert "approximated" not in doc["metrics"]["clipsim"].get("note", "")


def test_clipscore_names_its_convention_where_it_is_shown(tmp_path):
    """metrics.json, the eval table and the report all say which CLIPScore this is (torchmetrics', not
    Hessel's), since both go by the name."""
    from rich.console import Console

    from sagegen.eval.runner import EvalOptions, evaluate
    from sagegen.testing.run_dirs import make_synthetic_run
    from sagegen.eval.table import metrics_table
    from sagegen.report.builder import ReportOptions, build_report

    run = make_synthetic_run(tmp_path / "r", prompts=["a", "b"], kind="image", height=32, width=32)
    clip_dir = write_tiny_clip(tmp_path / "clip")
    doc = evaluate(run, EvalOptions(metrics=["clipscore"], clip_model=f"local-dir:{clip_dir}"), log=lambda s: None)
    note = doc["metrics"]["clipscore"]["note"]
    assert "torchmetrics" in note and "100·max(cos, 0)" in note and "not Hessel" in note and "A photo depicts" in note
    console = Console(width=400, record=True)
    console.print(metrics_table(doc))
    assert "torchmetrics' CLIPScore" in console.export_text()
    html = build_report(run, ReportOptions(mp4=False, contact=False), log=lambda s: None)["html"].read_text()
    assert "torchmetrics&#x27; CLIPScore" in html or "torchmetrics' CLIPScore" in html
