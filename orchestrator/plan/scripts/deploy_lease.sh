#!/usr/bin/env bash
# Take (or renew) the deploy lease: flock on the deploy lock, then write "TOKEN INFO" to
# the owner file unless a live lease of another deploy holds it.
# $1 lock, $2 owner file, $3 token, $4 info, $5 stale seconds, $6 takeover token ("-": none),
# $7 seconds to wait for the flock. Prints @acquired, or @busy/@held + owner and exits 75, or
# @unwritable (the lock cannot be opened for writing; the shell's own line on stderr) and exits 1.
lock=$1; owner=$2; token=$3; info=$4; stale=$5; takeover=$6; wait=$7
# a lock that cannot be opened for writing (a read-only filesystem): say so, never @busy
mkdir -p "$(dirname "$lock")" || { echo "@unwritable"; exit 1; }
exec 9>>"$lock" || { echo "@unwritable"; exit 1; }
flock -w "$wait" 9 || { printf '@busy\t%s\n' "$(head -n1 "$owner" 2>/dev/null)"; exit 75; }
if [ -s "$owner" ]; then
  cur=$(head -n1 "$owner"); age=$(( $(date +%s) - $(stat -c %Y "$owner") ))
  tok=${cur%% *}
  if [ "$tok" != "$token" ] && [ "$tok" != "$takeover" ] && [ "$age" -lt "$stale" ]; then
    printf '@held\t%s\n' "$cur"; exit 75
  fi
fi
{ printf '%s %s\n' "$token" "$info" > "$owner.tmp.$$" && mv -f "$owner.tmp.$$" "$owner"; } || exit 1
echo "@acquired"
