#!/usr/bin/env bash
# dfo launch's pre-launch facts in ONE round trip, in "@section NAME" blocks (parsed by
# orchestrator.plan.launch_facts): the launch probe, the config's paths that are missing,
# what the deployed env's python reads (orchestrator.remote.launch_facts: cache-key inputs,
# checkpoints by manifest, a resume glob), and with "check": the env's stamp, its recorded
# verification while that still holds, deploy's state probe (whose `uv pip freeze` is left
# out while the recorded verification holds) and, when it does not hold, the env probe; with
# a model.init_from directory, that directory's config.json (plan/scripts/init_from.sh).
# $1 launch-probe script, $2 state script, $3 env-probe source, $4 root, $5 run.lock,
# $6 target env dir, $7 python spec, $8 wheel path, $9 "check" or "nocheck", $10 the
# init_from script, $11 the init_from directory ("": none), $12 N,
# then N paths the config names, then M and M commands (your own trainer's argv[0]: a path,
# or a name looked up on PATH with the deployed env's bin first, as the supervisor runs it),
# then the arguments of orchestrator.remote.launch_facts.
lp=$1; st=$2; probe=$3; root=$4; lock=$5; env=$6; py=$7; wheel=$8; check=$9; ifs=${10}
ifd=${11}; n=${12}
shift 12
echo "@section launch"
sh -c "$lp" dfo-probe "$root" "$lock"
if [ -n "$ifd" ]; then
  echo "@section init_from"
  sh -c "$ifs" dfo-init-from "$ifd"
fi
echo "@section missing"
i=0
while [ "$i" -lt "$n" ]; do
  [ -e "$1" ] || printf '%s\n' "$1"
  shift; i=$((i+1))
done
echo "@section commands"
m=$1; shift
i=0
while [ "$i" -lt "$m" ]; do
  case "$1" in
    */*) { [ -f "$1" ] && [ -x "$1" ]; } || printf '%s\n' "$1" ;;
    *) PATH="$root/envs/current/bin:$PATH" command -v -- "$1" >/dev/null 2>&1 \
         || printf '%s\n' "$1" ;;
  esac
  shift; i=$((i+1))
done
cur="$root/envs/current"
if [ -x "$cur/bin/python" ]; then
  echo "@section facts"
  "$cur/bin/python" -m orchestrator.remote.launch_facts "$@" 2>&1
fi
if [ "$check" != check ]; then echo "@section end"; exit 0; fi
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
if [ "$hold" != 1 ] && [ -n "$probe" ] && [ -f "$cur/fingerprint.json" ] \
    && [ -x "$cur/bin/python" ]; then
  echo "@section probe"
  env PYTHONDONTWRITEBYTECODE=1 CUDA_MODULE_LOADING=LAZY "$cur/bin/python" -c "$probe" 2>&1
fi
echo "@section end"
