#!/usr/bin/env bash
# dfo deploy's state probe: everything the plan needs, one "KEY<TAB>VALUE" line each,
# ending with "end<TAB>ok". Parsed by orchestrator.plan.deploy_plan.parse_state.
# $1 root, $2 target env dir, $3 python spec (a path or a version like 3.11), $4 wheel path,
# $5 "nofreeze" to leave out `uv pip freeze` (launch: the env's recorded verification holds).
root=$1; env=$2; py=$3; wheel=$4
uv="$root/bin/uv"
b64() { base64 -w0 2>/dev/null; }
emit() { printf '%s\t%s\n' "$1" "$2"; }
emit arch "$(uname -m)"
if [ -x "$uv" ]; then emit uv "$("$uv" --version 2>/dev/null | head -n1)"; else emit uv ""; fi
emit current "$(readlink "$root/envs/current" 2>/dev/null)"
emit previous "$(readlink "$root/envs/previous" 2>/dev/null)"
if [ -f "$env/.dfo-complete" ]; then emit target complete
elif [ -e "$env" ]; then emit target incomplete
else emit target absent; fi
cur="$root/envs/current"
if [ -L "$cur" ]; then
  [ -f "$cur/.dfo-complete" ] && emit current_marker "$(b64 < "$cur/.dfo-complete")"
  [ -f "$cur/fingerprint.json" ] && emit current_fingerprint "$(b64 < "$cur/fingerprint.json")"
  if [ "$5" != nofreeze ] && [ -x "$uv" ] && [ -x "$cur/bin/python" ]; then
    emit current_freeze "$("$uv" pip freeze --python "$cur/bin/python" 2>&1 | b64)"
  fi
fi
case "$py" in
  /*) if [ -x "$py" ]; then p=$py; else p=; fi ;;
  *) p=$(command -v "python$py" 2>/dev/null)
     if [ -z "$p" ] && [ -x "$uv" ]; then
       p=$(UV_PYTHON_DOWNLOADS=never "$uv" python find "$py" 2>/dev/null | head -n1)
     fi ;;
esac
emit python "$p"
d=$root; while [ ! -e "$d" ] && [ "$d" != / ]; do d=$(dirname "$d"); done
emit df_kb "$(df -Pk "$d" 2>/dev/null | awk 'NR==2 {print $4}')"
if [ -f "$wheel" ]; then emit wheel present; else emit wheel absent; fi
if [ -f "$root/locks/run.lock" ]; then
  if flock -n "$root/locks/run.lock" true 2>/dev/null; then emit run_lock free
  else emit run_lock held; emit run_lock_owner "$(head -c 4096 "$root/locks/run.lock" | b64)"; fi
fi
own="$root/locks/deploy.owner"
if [ -s "$own" ]; then
  emit deploy_owner "$(head -n1 "$own" | b64)"
  emit deploy_owner_age "$(( $(date +%s) - $(stat -c %Y "$own") ))"
fi
for x in "$root"/envs/*; do
  [ -d "$x" ] || continue
  [ -L "$x" ] && continue
  n=$(basename "$x")
  if [ -f "$x/.dfo-complete" ]; then emit env "complete $n"; else emit env "incomplete $n"; fi
done
emit end ok
