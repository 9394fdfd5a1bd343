"""The run directory: the contract between generation, evaluation and the report.

`directory` (the layout and `RunDir`), `manifest` (what a run was made with), `integrity` (sample identity,
fingerprints, whole files, containment), `files` (atomic writes), `lock` (one writer at a time), `encode`
(MP4 via ffmpeg) and `reader` (a finished run read back for eval and report). docs/run-directory.md.
"""
