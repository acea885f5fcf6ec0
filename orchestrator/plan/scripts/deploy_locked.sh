#!/usr/bin/env bash
# Run a command ("$5"...) under the deploy flock, while this deploy ($3) holds the lease;
# a heartbeat touches the owner file every $4 seconds so the lease stays fresh.
# $1 lock, $2 owner file, $3 token, $4 heartbeat seconds. Exits 75 when the lease is lost.
lock=$1; owner=$2; token=$3; hb=$4; shift 4
exec 9>>"$lock"
flock -w 30 9 || { echo "dfo: the deploy lock $lock is busy" >&2; exit 75; }
cur=$(head -n1 "$owner" 2>/dev/null)
[ "${cur%% *}" = "$token" ] || { echo "dfo: this deploy no longer holds $owner (now: ${cur:-nobody})" >&2; exit 75; }
touch "$owner"
( exec 9>&-; while sleep "$hb"; do touch "$owner" 2>/dev/null || exit; done ) </dev/null >/dev/null 2>&1 &
beat=$!
"$@"
rc=$?
kill "$beat" 2>/dev/null
touch "$owner"
exit $rc
