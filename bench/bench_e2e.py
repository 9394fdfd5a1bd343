"""`python bench/bench_e2e.py MODEL ...`: time to video per variant (see sagegen/jobs/e2ebench.py)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from sagegen.jobs.e2ebench import main  # noqa: E402

if __name__ == "__main__":
    main()
