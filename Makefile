# Everything runs from a project-local virtual environment created from nothing and reused while current.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The stamp names a hash of pyproject.toml: editing the dependencies rebuilds the environment.
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)

.PHONY: venv test test-fast test-diffusers demo bench lint clean

venv: $(STAMP)

# --no-cache-dir: the CUDA build of torch that torchvision needs is ~5.6 GB; a second copy in pip's cache has
# filled CI's disk before.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-cache-dir -e '.[eval,test]'
	rm -f $(VENV)/.installed-*
	touch $@

# The whole suite; on a machine without CUDA the Triton kernels run under TRITON_INTERPRET=1 (conftest.py).
# JOBS pytest-xdist workers (the interpreter runs on one core each; `make test JOBS=0` runs in one process), and
# the slowest tests listed at the end, so a CI log shows where the time goes.
JOBS ?= 2
XDIST = $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist worksteal)
test: $(STAMP)
	$(PY) -m pytest -q $(XDIST) --durations=25 tests

test-fast: $(STAMP)
	$(PY) -m pytest -q $(XDIST) -m "not slow" tests

# sagegen against other diffusers versions (tests/diffusers_versions.py; each installed under .diffusers/, beside
# .venv): routes, output vs stock and exact unpatch for the tiny pipelines and models, and the backend's status.
DIFFUSERS_VERSIONS ?=
test-diffusers: $(STAMP)
	$(PY) tests/diffusers_versions.py $(DIFFUSERS_VERSIONS)

# Kernel accuracy on this machine, then compare -> eval -> report on the tiny random-weight CogVideoX.
demo: $(STAMP)
	$(PY) -m sagegen.demo

# The kernel benchmark (needs a CUDA GPU): JSON and plot under bench/results/, named by date.
bench: $(STAMP)
	$(PY) bench/bench_attention.py --out bench/results/attention-local-$$(date +%F).json \
		--plot bench/results/attention-local-$$(date +%F).png

# pyflakes' checks (unused imports, undefined names) and line length (E501: 120, from pyproject.toml) through
# ruff, which honours `# noqa` re-exports.
lint: $(STAMP)
	$(PY) -m pip install -q --no-cache-dir 'ruff>=0.6'
	$(VENV)/bin/ruff check --no-cache --select F,E501 sagegen tests bench

clean:
	rm -rf $(VENV) .pytest_cache .diffusers
