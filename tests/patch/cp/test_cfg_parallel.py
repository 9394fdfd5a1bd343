"""CFG parallelism (`sagegen.patch.cp.cfg`): the guidance branches of a real tiny pipeline on 2 gloo processes
(and, on 4, with Ulysses 2 inside each branch) against the same pipeline in one process; the checks made before
any weights load."""

import pytest

from tests.support import cfg_parallel
from sagegen.patch.cp.cfg import CfgParallelError, check_cfg, style_of


@pytest.mark.parametrize("kind", ["wan2.1", "qwen-image", "wan2.2-a14b"])
def test_two_call_guidance_split_is_bit_identical_to_one_process(tmp_path, kind):
    """Wan and Qwen-Image run their branches as two calls: each rank runs one of them as one process would.
    Wan2.2-A14B switches experts between steps; a step's two calls go to the same expert."""
    res = cfg_parallel.run(tmp_path, kind)
    assert res["nan"] == 0 and res["same_on_every_rank"], res
    assert res["style"] == "two_calls" and res["gathers"] == cfg_parallel.STEPS and not res["context_parallel"]
    assert res["equal"], res


@pytest.mark.parametrize("kind", ["cogvideox", "sd3"])
def test_batched_guidance_split_matches_one_process(tmp_path, kind):
    """CogVideoX and SD3.5 batch [uncond, cond]: each rank runs half the batch. The same values as one process up
    to the order of sums in kernels that tile differently at half the batch."""
    res = cfg_parallel.run(tmp_path, kind)
    assert res["nan"] == 0 and res["same_on_every_rank"], res
    assert res["style"] == "batched" and res["gathers"] == cfg_parallel.STEPS
    assert res["rel_l1"] < 1e-3, res


def test_cfg_times_ulysses_on_four_processes(tmp_path):
    """cfg=2 x ulysses=2: each branch's sequence split over its two ranks with diffusers' context parallelism
    (sagegen's backend), the branches exchanged once per step. Ulysses runs every head over the whole sequence,
    so only the layers around attention round differently (see test_cp_models)."""
    res = cfg_parallel.run(tmp_path, "wan2.1", ulysses=2)
    assert res["nan"] == 0 and res["same_on_every_rank"], res
    assert res["context_parallel"] and res["gathers"] == cfg_parallel.STEPS, res
    assert res["rel_l1"] < 2e-2, res


def test_styles_of_the_pipelines():
    assert style_of("CogVideoXPipeline") == style_of("StableDiffusion3Pipeline") == "batched"
    assert style_of("WanPipeline") == style_of("QwenImagePipeline") == "two_calls"
    assert style_of("SomethingElse") is None


@pytest.mark.parametrize("kwargs,match", [
    (dict(pipeline_class="FluxPipeline", cfg=2, world=2, guidance=3.5), "guidance distillation"),
    (dict(pipeline_class="HunyuanVideoPipeline", cfg=2, world=2, guidance=6.0), "embedded guidance"),
    (dict(pipeline_class="WanPipeline", cfg=2, world=2, guidance=1.0), r"guidance 1.0 runs no unconditional"),
    (dict(pipeline_class="WanPipeline", cfg=2, world=3, guidance=5.0), "even number of processes, got 3"),
    (dict(pipeline_class="WanPipeline", cfg=4, world=4, guidance=5.0), "cfg=4: .* use cfg=2"),
    (dict(pipeline_class="StableDiffusionXLPipeline", cfg=2, world=2, guidance=5.0), "no known classifier-free"),
])
def test_clear_errors_before_weights_load(kwargs, match):
    with pytest.raises(CfgParallelError, match=match):
        check_cfg(**kwargs)


def test_true_cfg_on_an_embedded_guidance_model_is_allowed_when_asked():
    assert check_cfg("FluxPipeline", cfg=2, world=2, guidance=None, true_cfg=True) == "two_calls"
