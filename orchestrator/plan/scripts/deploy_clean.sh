#!/usr/bin/env bash
# Remove half-built envs ("$@"): rename each out of the way first (one atomic step), then
# delete; a crash during the delete leaves only a .trash dir, never a half env name.
# A complete env (.dfo-complete present) is never removed.
for d in "$@"; do
  [ -e "$d" ] || continue
  [ -f "$d/.dfo-complete" ] && continue
  t="$(dirname "$d")/.trash.$(basename "$d").$$"
  mv -T -f "$d" "$t" && rm -rf -- "$t"
done
for t in "$(dirname "$1")"/.trash.*; do [ -e "$t" ] && rm -rf -- "$t"; done
exit 0
