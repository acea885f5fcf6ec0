#!/usr/bin/env bash
# dfo launch's pre-launch facts in ONE round trip, in "@section NAME" blocks (parsed by
# orchestrator.ops.launch_facts): the launch probe, the config's paths that are missing,
# the env's stamp, its recorded verification while that still holds, and deploy's state
# probe (whose `uv pip freeze` is left out while the recorded verification holds).
# $1 launch-probe script, $2 state script, $3 root, $4 run.lock, $5 target env dir,
# $6 python spec, $7 wheel path, $8 "check" or "nocheck", $9 the run's checkpoint dir,
# $10... paths the config names.
lp=$1; st=$2; root=$3; lock=$4; env=$5; py=$6; wheel=$7; check=$8; ck=$9; shift 9
echo "@section launch"
sh -c "$lp" dfo-probe "$root" "$lock"
# no checkpoint there: launch need not start Python to list them
if [ -n "$ck" ] && [ -z "$(find "$ck" -mindepth 1 -maxdepth 1 -print -quit 2>/dev/null)" ]; then
  echo checkpoints=none
fi
echo "@section missing"
for p in "$@"; do [ -e "$p" ] || printf '%s\n' "$p"; done
if [ "$check" != check ]; then echo "@section end"; exit 0; fi
cur="$root/envs/current"
rec="$cur/.dfo-verified"
# The stamp: everything the env probe's answer and `uv pip freeze` depend on that can be
# read without starting Python. Any change to it (a package installed, removed or swapped,
# a file or directory added, removed or renamed anywhere under site-packages, the
# interpreter, the marker, the recorded fingerprint, the GPUs or their driver) makes launch
# verify the env again. __pycache__ is left out: Python writes it while the env is in use.
# Taken after `at`, so a change racing it is newer than `at`.
at=$(date +%s.%N)
stamp=$( (
  cd "$cur" 2>/dev/null || { echo "no env"; exit 0; }
  echo "env $(pwd -P)"
  p=$(readlink -f bin/python); echo "python $p"; stat -L -c '%s %Y %i' "$p"
  sha256sum pyvenv.cfg fingerprint.json .dfo-complete
  for sp in lib/python*/site-packages; do
    find "$sp" -name __pycache__ -prune -o -printf '%P\n' | LC_ALL=C sort
    stat -c '%n %s %Y %i' "$sp"/*.dist-info "$sp"/*.dist-info/* "$sp"/*.pth "$sp"/*.egg-link
  done
  cat /proc/driver/nvidia/version; ls /proc/driver/nvidia/gpus; ls -d /dev/nvidia*
) 2>&1 | sha256sum | cut -d' ' -f1 )
echo "@section stamp"
printf 'stamp\t%s\nat\t%s\n' "$stamp" "$at"
hold=0
if [ -f "$rec" ] && IFS=' ' read -r rstamp rat < "$rec" && [ "$rstamp" = "$stamp" ]; then
  # and no file under site-packages was written, replaced or relinked since that
  # verification (its ctime; the stamp's sizes and names do not see an edit in place)
  if newer=$(find "$cur"/lib/python*/site-packages -name __pycache__ -prune -o \
               ! -type d -newerct "@$rat" -print -quit) \
      && [ -z "$newer" ]; then hold=1; else printf 'changed\t%s\n' "$newer"; fi
fi
printf 'holds\t%s\n' "$hold"
if [ "$hold" = 1 ]; then
  echo "@section verified"
  tail -n +2 "$rec"
fi
echo "@section state"
if [ "$hold" = 1 ]; then freeze=nofreeze; else freeze=freeze; fi
bash -c "$st" dfo-state "$root" "$env" "$py" "$wheel" "$freeze"
echo "@section end"
