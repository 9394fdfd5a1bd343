#!/usr/bin/env bash
# The whole GPU test suite (`pytest -m gpu tests`) in one device call. Run ON THE DEVICE from the repo root.
#
#   1. here (CPU machine, network):  bash bench/gpu_wheels.sh        # wheels pinned by requirements/dev.lock -> .whl/
#   2. the device tool's `run`:      command "bash bench/gpu_tests.sh", carry [".whl"], kind nvidia-h200, timeout_s 600
#
# Installs .whl/*.whl into /tmp/site (the device has no diffusers and cannot fetch), prints the GPU and versions, runs
# pytest under `timeout 540` (SIGINT first, so pytest still prints its summary of what ran; SIGKILL 20 s later), and
# writes under $OUT:
#   gpu-tests.log           the whole pytest output
#   gpu-tests-progress.txt  one line per test as it ends (when, outcome, seconds, node id), from a small plugin made
#                           in /tmp: -q names no files, so a run cut short still says what ran
#   gpu-tests.json          device, versions, date, counts, wall time, exit code, counts per test file
# Without $OUT (a local run) they go to out/gpu-tests/. Exit status: pytest's (124 when the timeout struck).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/gpu-tests}
mkdir -p "$OUT"
LOG=$OUT/gpu-tests.log
PROGRESS=$OUT/gpu-tests-progress.txt
TIMEOUT_S=${GPU_TESTS_TIMEOUT_S:-540}
PYTEST_ARGS=(-q -p no:cacheprovider -p gpu_tests_progress -m gpu --durations=20 -rfE tests)

# GPU_TESTS_REUSE_SITE=1: a later call on the same warm machine reuses /tmp/site (the carry limit leaves no room
# for .whl beside a part of another Triton: ../shared/device/pack-wheel.sh); PYTHONPATH set before (that Triton's
# env.sh) is kept, after /tmp/site.
if [[ ${GPU_TESTS_REUSE_SITE:-0} == 1 && -d /tmp/site ]]; then
  echo "reusing /tmp/site"
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "error: installing .whl/*.whl failed (run bench/gpu_wheels.sh here, carry .whl)"; exit 2; }
fi
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "GPU: ${gpu:-none}"
python3 - <<'PY'
import importlib
for name in ("torch", "triton", "diffusers", "transformers", "huggingface_hub", "typer", "pytest"):
    try:
        print(f"{name} {importlib.import_module(name).__version__}")
    except Exception as e:  # reported here; the tests say the rest
        print(f"{name} MISSING ({type(e).__name__}: {e})")
PY

: >"$PROGRESS"
mkdir -p /tmp/gpu_tests_plugin
cat >/tmp/gpu_tests_plugin/gpu_tests_progress.py <<'PY'
import os

_out = open(os.environ["GPU_TESTS_PROGRESS"], "a", buffering=1)


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        _out.write(f"{report.when} {report.outcome} {report.duration:.2f} {report.nodeid}\n")
PY
export GPU_TESTS_PROGRESS=$PROGRESS PYTHONPATH=$PYTHONPATH:/tmp/gpu_tests_plugin

start=$(date +%s)
timeout -s INT -k 20 "$TIMEOUT_S" python3 -m pytest "${PYTEST_ARGS[@]}" 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
wall=$(( $(date +%s) - start ))
echo "pytest exit code $rc after ${wall} s"

GPU_NAME="$gpu" RC="$rc" WALL="$wall" TIMEOUT_S="$TIMEOUT_S" LOG="$LOG" PROGRESS="$PROGRESS" \
  ARGS="${PYTEST_ARGS[*]}" python3 - <<'PY' >"$OUT/gpu-tests.json"
import datetime, importlib, json, os, re


def version(name):
    try:
        return importlib.import_module(name).__version__
    except Exception as e:
        return f"missing: {type(e).__name__}"


text = open(os.environ["LOG"], errors="replace").read()
# pytest's last summary line, e.g. "== 3 failed, 120 passed, 4 skipped, 900 deselected in 312.4s ==".
summary = [l for l in text.splitlines() if re.search(r"\d+ (passed|failed|errors?|skipped|deselected)|no tests ran", l)
           and re.search(r" in [\d.]+s", l)]
counts = dict.fromkeys(("passed", "failed", "errors", "skipped", "xfailed", "xpassed", "deselected"), 0)
if summary:
    for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)", summary[-1]):
        counts["errors" if word.startswith("error") else word] = int(n)
# Per file, from the progress plugin: "call passed 1.23 tests/kernels/test_gpu.py::test_x[...]" (setup and teardown lines
# only when not passed: a skip or an error there).
per_file = {}
for line in open(os.environ["PROGRESS"], errors="replace"):
    parts = line.rstrip("\n").split(" ", 3)
    if len(parts) < 4:
        continue
    when, outcome, _secs, nodeid = parts
    word = "errors" if outcome == "failed" and when != "call" else outcome
    c = per_file.setdefault(nodeid.split("::")[0], {"passed": 0, "failed": 0, "errors": 0, "skipped": 0})
    c[word] = c.get(word, 0) + 1
if not summary:  # cut short before pytest's summary: count what the plugin saw
    for c in per_file.values():
        for k, n in c.items():
            counts[k] = counts.get(k, 0) + n
rc = int(os.environ["RC"])
print(json.dumps({
    "device": os.environ.get("GPU_NAME") or None,
    "torch": version("torch"), "triton": version("triton"), "diffusers": version("diffusers"),
    "transformers": version("transformers"), "huggingface_hub": version("huggingface_hub"),
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "command": "python3 -m pytest " + os.environ["ARGS"],
    "exit_code": rc, "timed_out": rc in (124, 137) or "KeyboardInterrupt" in text,
    "timeout_s": int(os.environ["TIMEOUT_S"]), "wall_s": int(os.environ["WALL"]),
    "summary": summary[-1].strip("= ") if summary else None,
    **counts, "counts_from": "pytest summary" if summary else "progress plugin (no summary)",
    "per_file": per_file,
}, indent=1))
PY
cat "$OUT/gpu-tests.json"
exit "$rc"
