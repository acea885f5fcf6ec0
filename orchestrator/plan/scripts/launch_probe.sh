#!/bin/sh
# dfo launch's probe, one round trip: init system, tools, env, and run.lock ("key=value" lines).
# $1 root, $2 run.lock path; $3 a run id and $4 seconds (optional): first wait, here, up to
# that long for that run's supervisor to hold run.lock. Parsed by
# orchestrator.plan.probes.parse_launch_probe.
root=$1; lock=$2; owner=${3:-}; wait_s=${4:-0}
held_by_owner() {
  [ -e "$lock" ] && ! flock -n -E 99 "$lock" true 2>/dev/null \
    && [ "$(head -c 200 "$lock" | tr -cd 'A-Za-z0-9._-')" = "$owner" ]
}
if [ -n "$owner" ]; then
  n=$((wait_s * 20))
  while [ "$n" -gt 0 ] && ! held_by_owner; do sleep 0.05; n=$((n - 1)); done
fi
if [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ] && command -v systemd-run >/dev/null 2>&1; then echo systemd=1; else echo systemd=0; fi
if command -v setsid >/dev/null 2>&1; then echo setsid=1; else echo setsid=0; fi
if [ -x "$root/envs/current/bin/python" ]; then echo env=1; else echo env=0; fi
if [ -e "$lock" ]; then
  if flock -n -E 99 "$lock" true 2>/dev/null; then echo lock=free; else echo lock=held; fi
  printf 'lock_owner=%s\n' "$(head -c 200 "$lock" | tr -cd 'A-Za-z0-9._-')"
else
  echo lock=free
fi
