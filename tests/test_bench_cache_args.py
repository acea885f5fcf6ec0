"""bench/bench_cache.py --variants: refused combinations fail at once (argparse, exit 2),
before anything is built or compiled."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.trainer import REPO


@pytest.mark.parametrize("args, why", [
    (["--variants", "restored"], "restored needs cold"),
    (["--variants", "cold,restored+precompile"], "restored+precompile needs cold+precompile"),
    (["--variants", "cold,warm"], "unknown variant 'warm'"),
    (["--variants", "cold+precompile", "--precompile-cold", "seeded"], "seeded needs the cold variant"),
])
def test_variants_refused(args, why):
    r = subprocess.run([sys.executable, "bench/bench_cache.py", *args], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and why in r.stderr, r.stderr[-2000:]
