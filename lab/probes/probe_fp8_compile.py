"""Probe (H100, Triton 3.6 showed it): a Flux smoke model patched with FP8 linears differs from its own eager run
when compiled with inductor (cos 0.956). Isolates the cause: GELU fusion, accumulation mode, attention patch,
the re-patch sequence of tests/linear/test_gpu_fp8.py. Prints one line per variant."""

import torch

import sagegen
from sagegen.linear import LinearPolicy
from sagegen.models import arch as archs


def cos(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return (a @ b / (a.norm() * b.norm())).item()


def build(name="flux.1-dev"):
    model = archs.build_transformer(name, dtype=torch.bfloat16, device="cuda", seed=0,
                                    config_overrides=archs.smoke_overrides(name))
    inputs = archs.example_inputs(name, batch=1, dtype=torch.bfloat16, device="cuda", seed=1, height=256, width=256)
    return model, inputs


def variant(label, model, inputs, **patch_kwargs):
    with torch.inference_mode():
        sagegen.patch(model, **patch_kwargs)
        eager = model(**inputs)[0]
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)(**inputs)[0]
        again = model(**inputs)[0]
    print(f"{label:40s} cos(compiled, eager)={cos(compiled, eager):.6f} "
          f"cos(eager again, eager)={cos(again, eager):.6f}",
          flush=True)
    sagegen.unpatch(model)
    torch._dynamo.reset()


def main():
    model, inputs = build()
    pol = dict(keep_blocks=(), min_rows=1)
    with torch.inference_mode():
        eager = model(**inputs)[0]
        compiled = torch.compile(model, fullgraph=True)(**inputs)[0]
    print(f"{'stock (no patch)':40s} cos(compiled, eager)={cos(compiled, eager):.6f}", flush=True)
    torch._dynamo.reset()
    variant("attention only", model, inputs)
    variant("fp8 unfused fast", model, inputs, linear="fp8", linear_policy=LinearPolicy(**pol))
    variant("fp8 fused fast", model, inputs, linear="fp8", linear_policy=LinearPolicy(**pol, fuse_gelu=True))
    variant("fp8 unfused precise", model, inputs, linear="fp8",
            linear_policy=LinearPolicy(**pol, fast_accum=False))
    variant("fp8 unfused, attention emulated", model, inputs, backend="reference", linear="fp8",
            linear_policy=LinearPolicy(**pol))


if __name__ == "__main__":
    main()
