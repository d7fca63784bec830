#!/usr/bin/env bash
# Kernel work waiting for its device check, kept on main as patches (a kernel change lands only after a GPU ran
# its checks, and a branch does not outlive the session that made it): tools/device/pending/*.patch, applied in
# name order to the device's copy of the tree. The tree as main has it is kept first at .device/base (the
# "before" of a before/after run: its engine and the tools that drive it). On the device machine only; the files a
# patch added, which a warm machine keeps between calls beside a fresh copy of the tracked ones, are removed before
# it is applied again.
#   bash tools/device/apply_pending.sh && PARTS=fusions bash tools/device/pending_round.sh
# PENDING=03 applies only the patches whose names start so (one patch's checks without the others').
set -euo pipefail
cd "$(dirname "$0")/../.."
shopt -s nullglob
patches=(tools/device/pending/${PENDING:-}*.patch)
if [ ${#patches[@]} -eq 0 ]; then echo "no pending patches"; exit 0; fi
if git apply --reverse --check "${patches[@]}" 2>/dev/null; then  # this copy has them already (the same call again)
  echo "pending patches applied already: ${patches[*]}"
  exit 0
fi
rm -rf .device/base && mkdir -p .device/base
for p in "${patches[@]}"; do  # files a patch adds, left by an earlier call on this machine, go first
  for added in $(git apply --numstat --summary "$p" | sed -n 's/^ create mode [0-7]* //p'); do rm -f "$added"; done
done
cp -r bench engine protocol serve tools pyproject.toml .device/base/  # main's tree: a patch may change a tool too
for p in "${patches[@]}"; do
  git apply --whitespace=nowarn "$p"
  echo "applied $p ($(git apply --numstat "$p" | awk '{print $3}' | sort -u | wc -l) files)"
done
