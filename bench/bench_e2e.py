"""`python bench/bench_e2e.py MODEL ...`: time to video per variant (sagegen/jobs/e2ebench.py; options:
sagegen/cli/e2e_bench.py)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from sagegen.cli.e2e_bench import main  # noqa: E402

if __name__ == "__main__":
    main()
