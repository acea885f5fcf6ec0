#!/usr/bin/env bash
# Switch envs/current atomically (a symlink made under a temporary name, then mv -T), under
# flock -n on run.lock so no run can start meanwhile; then retire older envs.
# $1 envs dir, $2 new current (a dir name in envs/), $3 new previous ("" keeps it),
# $4 run.lock path, "$5"... env dir names to retire once switched (never current or
# previous): renamed to .trash.* under run.lock, deleted after it is released.
# Refuses (exit 75, "@runlock<TAB>base64 owner") while a run holds run.lock.
envs=$1; new=$2; prev=$3; runlock=$4
shift 4
[ -f "$envs/$new/.dfo-complete" ] || { echo "dfo: $envs/$new is not a complete env" >&2; exit 1; }
mkdir -p "$(dirname "$runlock")" || exit 1
exec 8>>"$runlock"
if ! flock -n 8; then printf '@runlock\t%s\n' "$(head -c 4096 "$runlock" | base64 -w0)"; exit 75; fi
if [ -n "$prev" ]; then
  { ln -sfn "$prev" "$envs/.previous.tmp.$$" && mv -T -f "$envs/.previous.tmp.$$" "$envs/previous"; } || exit 1
fi
{ ln -sfn "$new" "$envs/.current.tmp.$$" && mv -T -f "$envs/.current.tmp.$$" "$envs/current"; } || exit 1
echo "@switched"
cur=$(readlink "$envs/current"); old=$(readlink "$envs/previous" 2>/dev/null)
trash=()
for n in "$@"; do
  case "$n" in ''|*/*|.*) continue ;; esac
  [ "$n" = "$cur" ] || [ "$n" = "$old" ] || [ -L "$envs/$n" ] || [ ! -d "$envs/$n" ] && continue
  mv -T -f "$envs/$n" "$envs/.trash.$n.$$" && trash+=("$envs/.trash.$n.$$") \
    && printf '@retired\t%s\n' "$n"
done
exec 8>&-
[ "${#trash[@]}" -eq 0 ] || rm -rf -- "${trash[@]}"
exit 0
