"""`sagegen bench`: one denoising step of a full-size transformer with random weights, stock against
sagegen, eager, compiled, with CUDA graphs and against torchao. `bench` runs it, `args` parses its options
without torch, `measure` times and compares, the others build variants."""
