#!/bin/sh
# Give a run its own copy of the live compile cache: copy to "$2/.cache.tmp", rename to
# "$2/cache", stamp last use ("$3"). With no live cache ("$1") the run starts with empty dirs.
# A full copy (cp -a), never hard links: an in-place write through a link would change it.
# On a restart ("$2/cache" exists: the supervisor re-seeds before a compile_gate retry) the
# entries the failed attempt completed are KEPT and the live cache is laid over them: the
# retry hits what the failed attempt compiled. Not every entry is written by rename: a killed
# compile leaves temporary files and may leave empty ones (an inductor .so of 0 bytes); both
# are dropped here (the supervisor also drops cut-short shared objects before any restart).
set -e; live="$1"; run="$2"; used="$3"
rm -rf "$run/.cache.tmp"
mkdir -p "$run/.cache.tmp/inductor" "$run/.cache.tmp/triton"
if [ -d "$run/cache/" ]; then
  cp -a "$run/cache/." "$run/.cache.tmp"
  find "$run/.cache.tmp" -mindepth 1 \( -name '.*.tmp' -o -name 'tmp.pid_*' \) \
    -prune -exec rm -rf {} +
  find "$run/.cache.tmp" -type f -size 0 -exec rm -f {} +
fi
if [ -d "$live/" ]; then
  cp -a "$live/." "$run/.cache.tmp"
  mkdir -p "$(dirname "$used")"; touch "$used"
fi
rm -rf "$run/cache"; mv "$run/.cache.tmp" "$run/cache"
