#!/usr/bin/env bash
# Run HERE (a CPU machine with pip and network), from anywhere in the checkout: downloads into .whl/ the wheels
# the GPU suite needs on the device machine (python 3.12, manylinux x86_64), each at exactly the version pinned in
# requirements/dev.lock. The device has torch/Triton/numpy/pillow and an older Hugging Face stack, but no
# diffusers; nothing can be fetched there. bench/gpu_tests.sh installs these wheels there.
#
#   bash bench/gpu_wheels.sh          # then: device tool `run`, command `bash bench/gpu_tests.sh`, carry [".whl"]
#
# Left out: imageio-ffmpeg (its wheel is ~68 MB, over the 64 MiB the travelling tree may take); the GPU tests save
# PNGs only (tests/support/cp_abort_launch.py) and need no ffmpeg. numpy, pillow, torch, filelock, fsspec, pyyaml, tqdm,
# psutil, requests stay the device's own (binary ABI; the pins below only ask loose lower bounds of them).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
LOCK=requirements/dev.lock
DEST=.whl
MAX_MIB=55

PKGS=(
  # Hugging Face stack, one consistent set (transformers 5.x needs huggingface-hub 2.x, which needs httpx2)
  diffusers transformers huggingface-hub tokenizers safetensors accelerate hf-xet kernels tomlkit
  httpx2 httpcore2 h11 anyio truststore idna typing-extensions regex importlib-metadata zipp lazy-importer
  # CLI (typer 0.2x needs pydantic)
  typer click shellingham rich markdown-it-py mdurl pygments annotated-doc
  pydantic pydantic-core annotated-types typing-inspection
  imageio
  # test runner
  pytest pytest-timeout pluggy iniconfig packaging
)

# The wheels must not travel with the tree unless carried: .whl/ must be ignored.
if ! git check-ignore -q "$DEST/x.whl"; then
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  echo "/$DEST/" >>"$exclude"
fi

specs=()
for name in "${PKGS[@]}"; do
  pin=$(grep -iE "^${name}==" "$LOCK") || { echo "error: $name is not pinned in $LOCK" >&2; exit 1; }
  specs+=("$pin")
done

# Download into a fresh folder, then replace .whl/*.whl: two versions of one package stop the install there.
tmp=$(mktemp -d "${DEST}.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$tmp" "${specs[@]}"
n=$(ls "$tmp"/*.whl | wc -l)
[[ $n -eq ${#specs[@]} ]] || { echo "error: got $n wheels for ${#specs[@]} pins" >&2; exit 1; }
mkdir -p "$DEST"
rm -f "$DEST"/*.whl
mv "$tmp"/*.whl "$DEST"/

size_kib=$(du -sk "$DEST" | cut -f1)
ls -1 "$DEST"
echo "$n wheels, $((size_kib / 1024)) MiB in $DEST"
if (( size_kib > MAX_MIB * 1024 )); then
  echo "error: $DEST is over $MAX_MIB MiB; the travelling tree must stay under 64 MiB" >&2
  exit 1
fi
