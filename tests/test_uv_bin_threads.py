"""The deploys of a group's hosts run in threads, each asking for the local uv binary
(``orchestrator.engine.deploy.local_uv``). In a fresh interpreter, eight threads released at
once by a barrier ask together; every one gets the same uv, ten interpreters in a row."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.trainer import REPO

PROG = """
import sys, threading
from orchestrator.engine.deploy import local_uv
b = threading.Barrier(8)
got, errs = [], []
def ask():
    b.wait()
    try:
        got.append(local_uv()[0])
    except Exception as e:
        errs.append(repr(e))
ts = [threading.Thread(target=ask) for _ in range(8)]
for t in ts: t.start()
for t in ts: t.join()
print(errs or sorted(set(got)))
sys.exit(1 if errs or len(set(got)) != 1 else 0)
"""


def test_threads_that_ask_for_uv_at_once_all_get_it():
    for _ in range(10):
        r = subprocess.run([sys.executable, "-c", PROG], cwd=REPO, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
