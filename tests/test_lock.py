"""The locked development environment (requirements/): the lock pins everything, this environment is what it
pins, each diffusers stack differs from it only where its era must, and the package's own ranges stay open."""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path

import pytest

from tests.support import diffusers_versions
lock = diffusers_versions.lock
ROOT = Path(__file__).resolve().parents[1]


def test_every_line_of_the_lock_is_an_exact_pin():
    lines = [ln.split("#")[0].strip() for ln in lock.DEV_LOCK.read_text().splitlines()]
    reqs = [ln for ln in lines if ln]
    assert len(reqs) > 50
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!-]+", r) for r in reqs), \
        [r for r in reqs if "==" not in r]
    pins = lock.read_pins(lock.DEV_LOCK)
    for package in ("torch", "triton", "diffusers", "transformers", "huggingface-hub", "pytest", "ruff"):
        assert package in pins, package


@pytest.mark.skipif(os.environ.get("SAGEGEN_UNLOCKED") == "1", reason="make test-latest: the newest resolution")
def test_this_environment_is_the_lock():
    """The suite runs on exactly what requirements/dev.lock pins (a missing or skipped install step shows here)."""
    pins = lock.read_pins(lock.DEV_LOCK)
    off = {}
    for name, version in pins.items():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = None
        if have != version:
            off[name] = (version, have)
    assert off == {}, off


def test_diffusers_stacks_hold_everything_but_their_era():
    dev = lock.read_pins(lock.DEV_LOCK)
    assert dev["diffusers"] == diffusers_versions.NEWEST
    for version in diffusers_versions.DEFAULT_VERSIONS[:-1]:
        stack = lock.read_pins(diffusers_versions.lock_path(version))
        assert stack["diffusers"] == version
        for package in ("torch", "triton", "numpy", "typer"):  # shared with .venv, never shadowed
            assert stack[package] == dev[package], (version, package)
        beside = {p.split("==")[0] for p in diffusers_versions.beside_pins(version)}
        assert "diffusers" in beside and "torch" not in beside


def test_the_package_ranges_stay_open():
    """Users resolve pyproject.toml's ranges; only development installs from the lock."""
    text = (ROOT / "pyproject.toml").read_text()
    deps = re.findall(r'^    "([^"]+)",', re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1), re.M)
    assert len(deps) > 5
    assert not [d for d in deps if "==" in d.split(";")[0]], deps


def test_drift_report_names_what_moved():
    import sys
    sys.path.insert(0, str(ROOT / "requirements"))
    from drift import drift

    rows = drift({"a": "1", "b": "2", "c": "3"}, {"a": "1", "b": "2.1", "d": "4"})
    assert rows == [{"package": "b", "lock": "2", "latest": "2.1", "change": "moved"},
                    {"package": "c", "lock": "3", "latest": None, "change": "gone"},
                    {"package": "d", "lock": None, "latest": "4", "change": "new"}]


def test_the_tests_cannot_reach_the_network():
    import socket

    with pytest.raises(OSError, match="the tests are offline"):
        socket.create_connection(("pypi.org", 443), timeout=5)
    assert os.environ["HF_HUB_OFFLINE"] == "1"


def test_a_python_the_tests_start_cannot_reach_the_network():
    import subprocess
    import sys

    code = ("import socket\ntry:\n    socket.create_connection(('93.184.216.34', 80), timeout=5)\n"
            "except OSError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "the tests are offline" in r.stdout, r.stdout + r.stderr


def test_the_documented_make_targets_exist_and_ci_runs_the_readme_commands():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, re.M))
    documented = set()
    for doc in ("README.md", "docs/testing.md"):
        documented |= set(re.findall(r"`?make ([a-z][a-z-]*)", (ROOT / doc).read_text()))
    assert documented and documented <= targets, documented - targets
    ci = (ROOT / ".ci" / "run").read_text()
    for command in ("make venv", "make test", "make test-diffusers"):
        assert re.search(rf"^step {command}$", ci, re.M), command
