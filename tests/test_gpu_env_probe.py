"""The env probe's GPU smoke test and the gpu-cu130 expectations against a probe."""

from __future__ import annotations

import dataclasses
import subprocess

import pytest
import sys

from orchestrator.config.profiles import load_profile
from dfo_contract.env_fingerprint import EnvFingerprint
from orchestrator.plan.fingerprint import PROBE_SCRIPT, build_fingerprint, compare, parse_probe

#: what the probe printed on the H200 machine's own python3 (torch from PyPI, transformers 5.17.0)
H200_REPLY = {"python": "3.12.3", "torch": "2.11.0+cu130", "torch_git": "70d99e998b4955e0049d13a98d77ae1b14db1f45",
        "torch_cuda": "13.0", "triton": "3.6.0", "cuda_available": True, "device_count": 1,
        "devices": [{"index": 0, "name": "NVIDIA H200", "capability": "9.0"}], "transformers": "5.17.0",
        "trainer_import": True, "gpu_smoke": "ok", "errors": {}}
H200 = EnvFingerprint.from_json(H200_REPLY)


def test_h200_python_meets_gpu_cu130_but_for_transformers():
    mism = compare(H200, load_profile("gpu-cu130").expect)
    assert [str(m) for m in mism] == ["transformers.__version__: expected 5.6.0, got 5.17.0"]


def test_failed_smoke_is_named():
    bad = dataclasses.replace(H200, gpu_smoke="BackendCompilerFailed: triton: ptxas too old",
               errors={"gpu_smoke": "BackendCompilerFailed: triton: ptxas too old"})
    mism = [str(m) for m in compare(bad, load_profile("gpu-cu130").expect)]
    assert any(m.startswith("flex_attention compile (forward+backward) on cuda:0: expected ok, got "
                            "BackendCompilerFailed") for m in mism), mism


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(_cuda_available(), reason="this machine has CUDA: the smoke test runs here")
def test_probe_without_cuda_has_no_smoke_and_records_the_field():
    out = subprocess.run([sys.executable, "-c", PROBE_SCRIPT], capture_output=True, text=True, timeout=300)
    probe = parse_probe(out.stdout)
    assert probe.gpu_smoke is None and not probe.error("gpu_smoke")
    fp = build_fingerprint(probe, profile="cpu", lock_hash="f" * 64)
    # the cpu profile's expectations with this interpreter's own versions: the test is about
    # the smoke field, not about which torch or transformers the test env holds
    expect = dict(load_profile("cpu").expect, python=".".join((probe.python or "").split(".")[:2]),
                  torch=probe.torch, transformers=probe.transformers)
    assert "gpu_smoke" in fp.to_json() and not compare(fp, expect)
    assert [m.field for m in compare(fp, dict(expect, transformers="0.0.1"))] == ["transformers"]


def test_smoke_result_is_not_a_compile_cache_key_component():
    """The smoke test is a health check, not an input of compiled code: adding it to the
    fingerprint must not change any env's cache key."""
    from orchestrator.plan.cache_key import fingerprint_components

    fp = build_fingerprint(H200, profile="gpu-cu130", lock_hash="f" * 64)
    assert fp.gpu_smoke == "ok"
    comps = fingerprint_components(fp)
    assert not [k for k in comps if "smoke" in k]
    assert comps == fingerprint_components(dataclasses.replace(fp, gpu_smoke=None))
