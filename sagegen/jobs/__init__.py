"""Jobs: the work the `sagegen` commands run, above the patcher and below the CLI.

`generate` (the loop behind run/compare), `ranks` (processes sharing prompts), `cp_pipeline` (context
parallelism for a loaded pipeline per variant), `calibrate` (sparse thresholds), `demo` (`make demo`) and
`stepbench` (`sagegen bench`: one denoising step of a full-size model; not the kernel benchmarks in bench/).
"""
