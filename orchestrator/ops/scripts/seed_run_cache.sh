#!/bin/sh
# Give a run its own copy of the live compile cache: copy to "$2/.cache.tmp", rename to
# "$2/cache", stamp last use ("$3"). With no live cache ("$1") the run starts with empty dirs.
# A full copy (cp -a), never hard links: an in-place write through a link would change it.
set -e; live="$1"; run="$2"; used="$3"
rm -rf "$run/.cache.tmp"
if [ -d "$live/" ]; then
  cp -a "$live/." "$run/.cache.tmp"
  mkdir -p "$(dirname "$used")"; touch "$used"
else
  mkdir -p "$run/.cache.tmp/inductor" "$run/.cache.tmp/triton"
fi
rm -rf "$run/cache"; mv "$run/.cache.tmp" "$run/cache"
