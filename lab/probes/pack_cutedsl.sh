#!/usr/bin/env bash
# Pack CuTe DSL (nvidia-cutlass-dsl 4.8.1: the meta wheel, libs-base, libs-core (the Python front end), libs-cu12)
# with cuda-bindings and protobuf for the device's CPython 3.12, plus NVIDIA's Hopper FMHA example (read from a
# CUTLASS checkout, run as upstream's own script, never copied into sagegen) for the issue-58 design probe.
#   lab/probes/pack_cutedsl.sh [CUTLASS_GIT_DIR] [OUTDIR=.big/cute]
# The compiler extension alone is ~190 MB (55 MB with zstd -19), over one call's 64 MiB carry, so the result is
# split into parts of at most 50 MB. Carry each part in its own call, back to back (the device keeps /tmp only
# while warm, 30 s after a call):  bash .big/cute/pN/stash.sh .big/cute/pN ; after the last one,
# `source /tmp/cutedsl/env.sh` puts the package on PYTHONPATH and FMHA_EXAMPLE at the example's path.
set -euo pipefail
GITDIR=${1:-/work/.mirror/NVIDIA+cutlass/repo}
OUT=${2:-.big/cute}
work=$(mktemp -d)
pip_dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64 -d "$1" "${@:2}"; }
pip_dl "$work/dl" nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 \
  nvidia-cutlass-dsl-libs-cu12==4.8.1 cuda-bindings==12.9.6 protobuf==7.36.2
mkdir -p "$work/pkg/site" "$work/pkg/example/helpers"
for w in "$work"/dl/*.whl; do (cd "$work/pkg/site" && unzip -q -o "$w"); done
if [ -d "$GITDIR" ]; then
  git -C "$GITDIR" show HEAD:examples/python/CuTeDSL/cute/hopper/kernel/attention/fmha.py > "$work/pkg/example/fmha.py"
  git -C "$GITDIR" show HEAD:examples/python/CuTeDSL/helpers/fmha_helpers.py > "$work/pkg/example/helpers/fmha_helpers.py"
  touch "$work/pkg/example/helpers/__init__.py"
fi
(cd "$work/pkg" && tar -cf - .) | zstd -q -T0 -19 > "$work/pkg.tar.zst"
rm -rf "$OUT" && mkdir -p "$OUT"
(cd "$work" && split -b 50000000 -d pkg.tar.zst part)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$work/zs" zstandard
n=$(ls "$work"/part* | wc -l)
sha=$(sha256sum "$work/pkg.tar.zst" | cut -d' ' -f1)
i=0
for p in "$work"/part*; do
  mkdir -p "$OUT/p$i" && mv "$p" "$OUT/p$i/"
  [ $i -eq $((n - 1)) ] && cp "$work"/zs/zstandard-*.whl "$OUT/p$i/"  # the last part unpacks: the lighter one
  cat > "$OUT/p$i/stash.sh" <<STASH
#!/usr/bin/env bash
# Keep this part in /tmp/cutedsl; after the last of $n parts, check, unpack and write /tmp/cutedsl/env.sh.
set -euo pipefail
[ -f /tmp/cutedsl/env.sh ] && { echo "already unpacked"; exit 0; }
mkdir -p /tmp/cutedsl && cp "\$1"/* /tmp/cutedsl/
have=\$(ls /tmp/cutedsl/part* | wc -l)
if [ "\$have" -lt $n ]; then echo "stashed part $i (\$have of $n: the next call must come now)"; exit 0; fi

cd /tmp/cutedsl && cat part* > pkg.tar.zst && echo "$sha  pkg.tar.zst" | sha256sum -c - >/dev/null
python3 -m pip install -q --no-index --no-deps --target /tmp/cutedsl/zs /tmp/cutedsl/zstandard-*.whl
PYTHONPATH=/tmp/cutedsl/zs python3 -c "
import tarfile, zstandard
with open('pkg.tar.zst', 'rb') as f, zstandard.ZstdDecompressor().stream_reader(f) as r:
    tarfile.open(fileobj=r, mode='r|').extractall('pkg')"
rm -f pkg.tar.zst part*
S=/tmp/cutedsl/pkg/site
echo "export PYTHONPATH=\$S:\$S/nvidia_cutlass_dsl/dsl_packages:\\\${PYTHONPATH:-} FMHA_EXAMPLE=/tmp/cutedsl/pkg/example/fmha.py" > env.sh
echo "unpacked CuTe DSL 4.8.1 into \$S; source /tmp/cutedsl/env.sh"
STASH
  i=$((i+1))
done
ls -la "$OUT"/p*
