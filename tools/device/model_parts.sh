#!/usr/bin/env bash
# A real model larger than one device call's carry (64 MiB in all, the tracked tree's ~33 MiB included) taken to
# the device machine in parts, one call each while the machine stays warm (it lets go after 30 s idle):
#   here:   bash tools/device/model_parts.sh split FILE        -> .carry/p1 .. .carry/pN (30 MiB each) and its sha256
#   device: a first call carries [".whl"] alone (the wheels and a part do not fit together: gpu_run.sh installs
#           them, and a warm machine keeps them); then call k carries [".carry/pk"] and runs
#           bash tools/device/model_parts.sh keep               (moves the part to /tmp/parts, out of the next copy)
#           and the last one: bash tools/device/model_parts.sh join /tmp/m/NAME.gguf   (checks the sha256)
set -euo pipefail
case ${1:-} in
  split)
    rm -rf .carry && mkdir -p .carry/tmp
    split -b 30M -d -a 2 "$2" .carry/tmp/part.
    i=1
    for part in .carry/tmp/part.*; do mkdir -p .carry/p$i; mv "$part" .carry/p$i/part; i=$((i + 1)); done
    rmdir .carry/tmp
    sha256sum "$2" | cut -d' ' -f1 > .carry/p1/sha256
    ls -la .carry/p* ;;
  keep)
    mkdir -p /tmp/parts
    for dir in .carry/p*; do [ -f "$dir/part" ] && cp "$dir/part" "/tmp/parts/$(basename "$dir")"; done
    [ -f .carry/p1/sha256 ] && cp .carry/p1/sha256 /tmp/parts/sha256
    ls -la /tmp/parts ;;
  join)
    mkdir -p "$(dirname "$2")"
    cat $(ls /tmp/parts/p* | sort -V) > "$2"
    [ "$(sha256sum "$2" | cut -d' ' -f1)" = "$(cat /tmp/parts/sha256)" ] && echo "joined $2: sha256 matches" \
      || { echo "JOIN FAILED: sha256 differs"; rm -f "$2"; exit 1; } ;;
  *) echo "usage: model_parts.sh split FILE | keep | join OUT" >&2; exit 2 ;;
esac
