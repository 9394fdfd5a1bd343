"""`python bench/bench_model_step.py MODEL ...` = `sagegen bench MODEL ...` (see sagegen/jobs/stepbench/bench.py)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from sagegen.jobs.stepbench.bench import main  # noqa: E402

if __name__ == "__main__":
    main()
