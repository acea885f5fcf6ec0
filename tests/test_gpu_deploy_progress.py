"""Deploy's download/install progress from uv's output, and the env's size (pure parts)."""

from __future__ import annotations

from orchestrator.ops.uv_progress import UvProgress, human_bytes, parse_du_k

#: uv pip sync's output (uv prints these without a terminal too; the sizes of the gpu-cu130 lock)
UV_LINES = """\
Resolved 57 packages in 3ms
Downloading nvidia-cudnn-cu13 (349.9MiB)
Downloading torch (506.1MiB)
Downloading nvidia-cublas (423.1MiB)
 Downloaded nvidia-cublas
Downloading triton (179.5MiB)
 Downloaded torch
 Downloaded triton
 Downloaded nvidia-cudnn-cu13
Prepared 57 packages in 1m 02s
Installed 57 packages in 9.14s
 + torch==2.11.0
"""


def test_progress_summaries():
    p = UvProgress()
    shown = [s for s in (p.feed(ln) for ln in UV_LINES.splitlines()) if s]
    assert shown[0] == "Resolved 57 packages in 3ms"
    assert shown[4] == "downloading: 1 of 3 large files done, 423.1 MiB of 1.2 GiB; nvidia-cublas"
    assert shown[-3] == "downloading: 4 of 4 large files done, 1.4 GiB of 1.4 GiB; nvidia-cudnn-cu13"
    assert shown[-1] == "Installed 57 packages in 9.14s"
    assert p.feed(" + torch==2.11.0") is None


def test_env_size():
    assert parse_du_k("6291456\t/root/dfo/envs/gpu-cu130-5bf7d6027fc6\n") == 6 << 30
    assert parse_du_k("du: cannot access 'x'") is None
    assert human_bytes(6 << 30) == "6.0 GiB" and human_bytes(512) == "512 B"
