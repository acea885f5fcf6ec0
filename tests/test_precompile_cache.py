"""``compile.precompile``: dynamo's precompile cache across processes (real torch, CPU).

A toy step (matmul, autocast-off region, custom autograd.Function: what the drafter step
holds) compiled through a ``trainer.compile.registry.CompileRegistry`` in a worker thread, in
fresh processes sharing one TORCHINDUCTOR_CACHE_DIR: the first traces and saves a checksummed entry; the second
LOADS it (dynamo_cache_hit, no dynamo tracing at all: no ``compile_attempt_0`` time); a
truncated entry, or one without its checksum file (half-written), is removed before
anything compiles and never loaded (dynamo_cache_miss, a fresh trace, the same result)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.toy_step import TOY_STEP_SRC
from tests.helpers.trainer import REPO

SCRIPT = r'''
import json, sys, threading, torch
from trainer.compile import precompile
from trainer.compile.registry import CompileRegistry
from trainer.compile.gate import compile_times_snapshot, counters_snapshot

''' + TOY_STEP_SRC + r'''

C = CompileRegistry()
C.cache.configure(precompile=True)
chk = precompile.verify_precompile_entries()
out = {"kept": chk.kept, "dropped": chk.dropped}
def run():  # a worker thread (dynamo config is per-thread on torch >= 2.12)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, generator=g)
    w = torch.randn(16, 16, generator=g, requires_grad=True)
    loss = C.call("toy_step", step, x, w)
    loss.backward()
    out["loss"] = float(loss)
    out["grad"] = float(w.grad.abs().sum())
th = threading.Thread(target=run); th.start(); th.join()
out["counters"] = counters_snapshot()
out["times"] = compile_times_snapshot()
if sys.argv[1] == "save":
    out["save"] = precompile.save_precompile_entries()
print("RESULT " + json.dumps(out))
'''


def _run(cache: str, op: str = "load") -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", SCRIPT, op], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=500)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.mark.timeout(900)
def test_second_process_loads_saved_entry_and_corrupt_entry_is_dropped(tmp_path):
    cache = str(tmp_path / "inductor")
    first = _run(cache, "save")
    assert first["counters"]["dynamo_cache_miss"] == 1 and first["counters"]["dynamo_cache_hit"] == 0
    assert first["times"].get("compile_attempt_0", 0) > 0          # dynamo traced
    (key,) = first["save"]["saved"]
    d = os.path.join(cache, "dynamo", key)
    assert sorted(os.listdir(d)) == ["entry", "entry.sha256"]

    second = _run(cache)
    assert second["kept"] == [key] and second["dropped"] == {}
    assert second["counters"]["dynamo_cache_hit"] == 1
    assert second["counters"]["dynamo_cache_miss"] == 0
    assert "compile_attempt_0" not in second["times"]               # no dynamo tracing
    assert second["times"].get("precompile_load_guards", 0) > 0
    assert (second["loss"], second["grad"]) == (first["loss"], first["grad"])

    # truncate the entry (a half-copied or damaged file): removed before compiling, not used
    entry = os.path.join(d, "entry")
    data = open(entry, "rb").read()
    with open(entry, "wb") as f:
        f.write(data[: len(data) // 2])
    third = _run(cache)
    assert list(third["dropped"]) == [key] and "checksum" in third["dropped"][key]
    assert third["counters"]["dynamo_cache_hit"] == 0 and third["counters"]["dynamo_cache_error"] == 0
    assert third["counters"]["dynamo_cache_miss"] == 1
    assert third["times"].get("compile_attempt_0", 0) > 0           # traced afresh
    assert (third["loss"], third["grad"]) == (first["loss"], first["grad"])


def test_verify_keeps_only_complete_checksummed_entries(tmp_path):
    from dfo_contract.fsio import sha256_file
    from trainer.compile.precompile import verify_precompile_entries

    root = tmp_path / "dynamo"
    for name in ("good", "nosum", "altered", "noentry"):
        (root / name).mkdir(parents=True)
    for name in ("good", "nosum", "altered"):
        (root / name / "entry").write_bytes(b"pickled entry " + name.encode())
    good = root / "good" / "entry"
    (root / "good" / "entry.sha256").write_text(f"{sha256_file(good)} {good.stat().st_size}\n")
    alt = root / "altered" / "entry"
    (root / "altered" / "entry.sha256").write_text(f"{sha256_file(alt)} {alt.stat().st_size}\n")
    alt.write_bytes(b"pickled entry ALTERED")
    (root / "noentry" / ".123.456.tmp").write_bytes(b"half")   # torch's temp, never renamed

    chk = verify_precompile_entries(str(root))
    assert chk.kept == ["good"]
    assert set(chk.dropped) == {"nosum", "altered", "noentry"}
    assert "half-written" in chk.dropped["nosum"] and "checksum" in chk.dropped["altered"]
    assert sorted(os.listdir(root)) == ["good"]
    assert verify_precompile_entries(str(tmp_path / "absent")).kept == []


@pytest.mark.slow
def test_training_saves_checksummed_entries_and_a_second_run_keeps_them(tmp_path):
    """``train`` honours compile.precompile as ``trainer warmup`` does: a bad entry is dropped
    before compiling, the run's entries are saved with their checksums after the first step."""
    from tests.helpers.trainer import make_synth, make_target, run_trainer, tiny_overrides

    target = make_target(str(tmp_path / "target"))
    data = make_synth(str(tmp_path / "d.jsonl"), num=32)
    cache = tmp_path / "ind"
    bogus = cache / "dynamo" / "bogus"
    bogus.mkdir(parents=True)
    (bogus / "entry").write_bytes(b"half-written")  # no checksum file: never loaded
    env = {"TORCHINDUCTOR_CACHE_DIR": str(cache)}
    sets = {"train.max_steps": 2, "checkpoint.every": 0, "compile.enabled": "true",
            "compile.precompile": "true"}
    r = run_trainer(["train", *tiny_overrides(target, data, str(tmp_path / "run"), **sets)],
                    env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not bogus.exists() and "dropped cache entry bogus" in r.stderr
    sums = list((cache / "dynamo").glob("*/entry.sha256"))
    assert sums, sorted(p.name for p in (cache / "dynamo").iterdir())
    for s in sums:
        digest, size = s.read_text().split()
        assert int(size) == (s.parent / "entry").stat().st_size
    r2 = run_trainer(["train", *tiny_overrides(target, data, str(tmp_path / "run2"), **sets)],
                     env=env, timeout=600)
    assert r2.returncode == 0, r2.stderr[-2000:]
    assert "dropped cache entry" not in r2.stderr
