#!/usr/bin/env bash
# Produce the directory the compat run reads (COLO_SHIM_NEMO_RL_TREES): one `git archive` of
# nemo_rl/ per NeMo-RL release. Never commit the result.
#   usage: tests/compat/fetch_trees.sh DEST [CLONE]
#   then:  COLO_SHIM_NEMO_RL_TREES=DEST python -m pytest -q -p no:cacheprovider tests/compat
# CLONE is an existing clone of https://github.com/NVIDIA-NeMo/RL (cloned into DEST/.repo if absent).
# "main" is pinned to the commit the results in docs/compat.md were taken from.
set -euo pipefail
dest=${1:?usage: fetch_trees.sh DEST [CLONE]}
repo=${2:-$dest/.repo}
main_commit=${COLO_SHIM_NEMO_RL_MAIN:-7ea279abf}
mkdir -p "$dest"
if [ ! -d "$repo" ]; then
  git clone --bare --filter=blob:none https://github.com/NVIDIA-NeMo/RL.git "$repo"
fi
# main-pre3322: main at the commit before PR #3322 (finalize_async_save without the offloads calling it)
for tag in v0.3.1 v0.4.0 v0.5.0 v0.6.0 v0.7.0 main main-pre3322; do
  ref=$tag
  [ "$tag" = main ] && ref=$main_commit
  [ "$tag" = main-pre3322 ] && ref=16662da37
  rm -rf "${dest:?}/$tag"
  mkdir -p "$dest/$tag"
  git -C "$repo" archive "$ref" nemo_rl | tar -x -C "$dest/$tag"
  echo "$tag <- $(git -C "$repo" rev-parse --short "$ref^{commit}")"
done
