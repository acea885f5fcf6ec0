#!/usr/bin/env bash
# Switch envs/current atomically (a symlink made under a temporary name, then mv -T), under
# flock -n on run.lock so no run can start meanwhile.
# $1 envs dir, $2 new current (a dir name in envs/), $3 new previous ("" keeps it),
# $4 run.lock path. Refuses (exit 75, "@runlock<TAB>base64 owner") while a run holds run.lock.
envs=$1; new=$2; prev=$3; runlock=$4
[ -f "$envs/$new/.dfo-complete" ] || { echo "dfo: $envs/$new is not a complete env" >&2; exit 1; }
mkdir -p "$(dirname "$runlock")" || exit 1
exec 8>>"$runlock"
if ! flock -n 8; then printf '@runlock\t%s\n' "$(head -c 4096 "$runlock" | base64 -w0)"; exit 75; fi
if [ -n "$prev" ]; then
  { ln -sfn "$prev" "$envs/.previous.tmp.$$" && mv -T -f "$envs/.previous.tmp.$$" "$envs/previous"; } || exit 1
fi
{ ln -sfn "$new" "$envs/.current.tmp.$$" && mv -T -f "$envs/.current.tmp.$$" "$envs/current"; } || exit 1
echo "@switched"
