# Everything runs from a project-local virtual environment created from nothing, installed from the committed
# lock (requirements/dev.lock: every package pinned, so a build today and next month are the same) and reused
# while current. The package's own ranges in pyproject.toml stay open for users.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
LOCK := requirements/dev.lock
# The stamp names a hash of the lock and pyproject.toml: editing either rebuilds the environment.
STAMP := $(VENV)/.installed-$(shell cat $(LOCK) pyproject.toml | sha1sum | cut -c1-12)
# The resolver `make lock` runs (pinned: a newer uv may resolve the same inputs differently).
UV_VERSION := 0.13.9

.PHONY: venv lock test test-fast test-gpu test-diffusers test-latest demo bench lint clean

venv: $(STAMP)

# --no-cache-dir: the CUDA build of torch that torchvision needs is ~5.6 GB; a second copy in pip's cache has
# filled CI's disk before. `pip check`: the lock is consistent. The typer versions the CLI test runs beside .venv
# are exact pins, installed here so that the tests never reach the package index.
$(STAMP): $(LOCK) pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$$(grep '^pip==' $(LOCK))"
	$(PY) -m pip install -q --no-cache-dir -r $(LOCK)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -m pip check
	$(PY) tests/cli/test_cli_typer_versions.py --install
	rm -f $(VENV)/.installed-*
	touch $@

# Re-resolve today's registry into requirements/dev.lock and the diffusers stacks (requirements/diffusers/*.lock).
# Run it on purpose: to take new releases (after `make test-latest` shows they pass), or after editing the
# dependencies in pyproject.toml or requirements/tools.in. Commit the locks it writes.
lock:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q 'uv==$(UV_VERSION)'
	$(PY) requirements/lock.py --uv $(VENV)/bin/uv

# The CPU suite (every test not marked gpu; on a machine with CUDA the GPU tests run too, see test-gpu). Without
# CUDA the Triton kernels run under TRITON_INTERPRET=1 (conftest.py). JOBS pytest-xdist workers (the interpreter
# runs on one core each; `make test JOBS=0` runs in one process), and the slowest tests listed at the end, so a
# CI log shows where the time goes. The diffusers matrix has its own target (test-diffusers).
JOBS ?= 2
XDIST = $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist worksteal)
test: $(STAMP)
	$(PY) -m pytest -q $(XDIST) --durations=30 -m "not diffusers_matrix" tests

# The quick tier a developer runs constantly: no `slow` tests, no matrix (a few minutes on 2 cores).
test-fast: $(STAMP)
	$(PY) -m pytest -q $(XDIST) --durations=10 -m "not slow and not diffusers_matrix" tests

# The GPU suite, on a machine with CUDA (the device: docs/testing.md).
test-gpu: $(STAMP)
	$(PY) -m pytest -q --durations=20 -m gpu tests

# sagegen against every locked diffusers version (requirements/diffusers/<V>.lock; each installed under
# .diffusers/<V>, beside .venv, with the transformers and huggingface-hub of its era): routes, output vs stock and
# exact unpatch for the tiny pipelines and models, and the backend's status. `.ci/run` runs it after `make test`.
test-diffusers: $(STAMP)
	$(PY) tests/support/diffusers_versions.py --install-only
	$(PY) -m pytest -q $(XDIST) --durations=10 -m diffusers_matrix tests

# Drift, seen on purpose: the newest resolution of `.[eval,test,lora,cachedit]` in its own environment
# (.venv-latest), what moved against the lock, then the suite. Reads today's registry; nothing here changes the lock.
test-latest:
	rm -rf .venv-latest
	$(PYTHON) -m venv .venv-latest
	.venv-latest/bin/python -m pip install -q --upgrade 'pip>=24'
	.venv-latest/bin/python -m pip install -q --no-cache-dir -e '.[eval,test,lora,cachedit]' -r requirements/tools.in
	.venv-latest/bin/python requirements/drift.py --lock $(LOCK) --python .venv-latest/bin/python
	.venv-latest/bin/python tests/cli/test_cli_typer_versions.py --install
	SAGEGEN_UNLOCKED=1 .venv-latest/bin/python -m pytest -q $(XDIST) --durations=10 -m "not diffusers_matrix" tests \
		|| { echo "make test-latest: the suite FAILED on the newest resolution (drift above); the lock still passes"; exit 1; }
	@echo "make test-latest: the suite passes on the newest resolution; \`make lock\` would take it"

# Kernel accuracy on this machine, then compare -> eval -> report on the tiny random-weight CogVideoX.
demo: $(STAMP)
	$(PY) -m sagegen.jobs.demo

# The kernel benchmark (needs a CUDA GPU): JSON and plot under bench/results/, named by date.
bench: $(STAMP)
	$(PY) bench/bench_attention.py --out bench/results/attention-local-$$(date +%F).json \
		--plot bench/results/attention-local-$$(date +%F).png

# pyflakes' checks (unused imports, undefined names) and line length (E501: 120, from pyproject.toml) through
# ruff (locked in dev.lock), which honours `# noqa` re-exports.
lint: $(STAMP)
	$(VENV)/bin/ruff check --no-cache --select F,E501 sagegen tests bench requirements

clean:
	rm -rf $(VENV) .venv-latest .pytest_cache .diffusers .beside
