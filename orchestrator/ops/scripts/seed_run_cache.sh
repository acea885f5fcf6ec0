#!/bin/sh
# Give a run its own copy of the live compile cache: copy to "$2/.cache.tmp", rename to
# "$2/cache", stamp last use ("$3"). With no live cache ("$1") the run starts with empty dirs.
# A full copy (cp -a), never hard links: an in-place write through a link would change it.
# On a restart ("$2/cache" exists: the supervisor re-seeds before a compile_gate retry) the
# entries the failed attempt completed are KEPT (torch and triton write each entry by
# rename, so a killed compile leaves only its temporary files, which are dropped here) and
# the live cache is laid over them: the retry hits what the failed attempt compiled.
set -e; live="$1"; run="$2"; used="$3"
rm -rf "$run/.cache.tmp"
mkdir -p "$run/.cache.tmp/inductor" "$run/.cache.tmp/triton"
if [ -d "$run/cache/" ]; then
  cp -a "$run/cache/." "$run/.cache.tmp"
  find "$run/.cache.tmp" -mindepth 1 \( -name '.*.tmp' -o -name 'tmp.pid_*' \) \
    -prune -exec rm -rf {} +
fi
if [ -d "$live/" ]; then
  cp -a "$live/." "$run/.cache.tmp"
  mkdir -p "$(dirname "$used")"; touch "$used"
fi
rm -rf "$run/cache"; mv "$run/.cache.tmp" "$run/cache"
