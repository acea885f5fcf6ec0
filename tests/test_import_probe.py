"""bench/import_probe.py: the ``-X importtime`` parser on recorded lines (awkward names, the
header, depth by indentation), and the probe for real in this interpreter."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

from tests.supervisor_env import REPO

_spec = importlib.util.spec_from_file_location("import_probe", REPO / "bench" / "import_probe.py")
ip = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ip)

RECORDED = """\
import time: self [us] | cumulative | imported package
import time:       120 |        120 |   _io
import time:      1000 |       1500 |     transformers.models.qwen3.modeling_qwen3
import time:       900 |       2400 |   transformers.generation.candidate_generator
import time:      4000 |       6400 | transformers
import time:         7 |          7 | émoji_pkg.ünïcode
some unrelated stderr line | with | bars | too
import time: not | a number | here
"""


def test_parse_reads_self_cumulative_depth_and_name():
    rows = ip.parse(RECORDED)
    assert rows == [(120, 120, 1, "_io"),
                    (1000, 1500, 2, "transformers.models.qwen3.modeling_qwen3"),
                    (900, 2400, 1, "transformers.generation.candidate_generator"),
                    (4000, 6400, 0, "transformers"),
                    (7, 7, 0, "émoji_pkg.ünïcode")]


def test_the_probe_runs_in_this_interpreter(tmp_path):
    out = tmp_path / "p.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "import_probe.py"), "--top", "5",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    assert rep["torch_s"] > 0 and rep["total_s"] >= rep["torch_s"]
    assert len(rep["top_cumulative"]) == 5 and rep["distributions"] > 0
    assert r.stdout.startswith("total ")
