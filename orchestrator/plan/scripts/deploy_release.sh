#!/usr/bin/env bash
# Give the deploy lease back: remove the owner file if this deploy ($3) still holds it.
# $1 lock, $2 owner file, $3 token. Always exits 0.
lock=$1; owner=$2; token=$3
exec 9>>"$lock"
flock -w 10 9 || exit 0
cur=$(head -n1 "$owner" 2>/dev/null)
[ "${cur%% *}" = "$token" ] && rm -f "$owner"
exit 0
