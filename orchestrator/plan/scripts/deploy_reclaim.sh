#!/usr/bin/env bash
# What dfo's own leftovers under the root hold, asked only when free space looks short:
# uv's cache (reused: uv hardlinks from it, so what it holds needs no new space) and the
# half-built envs and .trash dirs a failed deploy left (removed before the new env is built).
# One du over all of them counts each hardlinked file once, in the cache, where it stays.
# $1 root, $2.. the half-built env names the deploy removes (deploy_clean.sh: with them, any
# .trash dir). Prints "KEY<TAB>VALUE" lines (uv_cache_kb, partial_kb, partial NAME), "end<TAB>ok".
root=$1; shift
cache="$root/uv-cache"
args=()
[ -d "$cache" ] && args+=("$cache")
gone=()
for n in "$@"; do gone+=("$root/envs/$n"); done
[ "$#" -gt 0 ] && gone+=("$root"/envs/.trash.*)
for x in "${gone[@]}"; do
  [ -d "$x" ] || continue
  [ -L "$x" ] && continue
  [ -f "$x/.dfo-complete" ] && continue
  args+=("$x")
  printf 'partial\t%s\n' "$(basename "$x")"
done
if [ "${#args[@]}" -gt 0 ]; then
  du -sk -- "${args[@]}" 2>/dev/null | awk -F'\t' -v c="$cache" \
    '$2 == c {u += $1; next} {p += $1} END {printf "uv_cache_kb\t%d\npartial_kb\t%d\n", u, p}'
else
  printf 'uv_cache_kb\t0\npartial_kb\t0\n'
fi
printf 'end\tok\n'
