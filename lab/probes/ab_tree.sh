#!/usr/bin/env bash
# The `sagegen` package of commit $1 under .ab/$1/ (ignored by git), for an A/B in one device call
# (lab/probes/gpu_host_run.sh TREES=...; carry ".ab"). Usage: bash lab/probes/ab_tree.sh 610e59c
set -euo pipefail
rev=${1:?usage: ab_tree.sh REV}
dest=.ab/$rev
rm -rf "$dest" && mkdir -p "$dest"
git archive "$rev" sagegen | tar -x -C "$dest"
grep -qxF '/.ab/' .git/info/exclude 2>/dev/null || echo '/.ab/' >> .git/info/exclude
echo "$dest/sagegen ($(git rev-parse --short "$rev"))"
