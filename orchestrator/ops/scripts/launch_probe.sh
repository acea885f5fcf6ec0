#!/bin/sh
# dfo launch's probe, one round trip: init system, tools, env, and run.lock ("key=value" lines).
# $1 root, $2 run.lock path. Parsed by orchestrator.ops.probes.parse_launch_probe.
root=$1; lock=$2
if [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ] && command -v systemd-run >/dev/null 2>&1; then echo systemd=1; else echo systemd=0; fi
if command -v setsid >/dev/null 2>&1; then echo setsid=1; else echo setsid=0; fi
if [ -x "$root/envs/current/bin/python" ]; then echo env=1; else echo env=0; fi
if [ -e "$lock" ]; then
  if flock -n -E 99 "$lock" true 2>/dev/null; then echo lock=free; else echo lock=held; fi
  printf 'lock_owner=%s\n' "$(head -c 200 "$lock" | tr -cd 'A-Za-z0-9._-')"
else
  echo lock=free
fi
