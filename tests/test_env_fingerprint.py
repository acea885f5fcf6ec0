"""The env fingerprint's record (``dfo_contract.env_fingerprint``): fingerprint.json as deploy
writes it reads back and writes back byte for byte; the probe's reply reads into it; the
comparisons and the cache key's components read it by attribute (pure, no torch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dfo_contract.env_fingerprint import FINGERPRINT_FIELDS, EnvFingerprint, GpuDevice
from dfo_contract.errors import ContractError
from orchestrator.common.errors import DeployError
from orchestrator.plan import cache_key as ck
from orchestrator.plan import fingerprint as fpm
from orchestrator.plan import group_check as gc

FIXTURES = Path(__file__).parent / "fixtures" / "fingerprint"
NAMES = ("gpu", "errors", "smoke_failed")


def _read(name: str) -> tuple[bytes, EnvFingerprint]:
    data = (FIXTURES / f"{name}.json").read_bytes()
    return data, fpm.parse_fingerprint(data)


@pytest.mark.parametrize("name", NAMES)
def test_stored_fingerprint_round_trips_byte_for_byte(name):
    data, fp = _read(name)
    assert fpm.fingerprint_json(fp) == data
    assert list(json.loads(data))[:len(FINGERPRINT_FIELDS)] == list(FINGERPRINT_FIELDS)
    assert not fp.extra


@pytest.mark.parametrize("name", NAMES)
def test_the_probe_reply_builds_the_stored_bytes(name):
    """A probe reply (the stored object without profile and lock_hash, the probe's own key
    order) gives the stored fingerprint.json again."""
    data, fp = _read(name)
    reply = {k: v for k, v in json.loads(data).items() if k not in ("profile", "lock_hash")}
    reply = {"python": reply.pop("python"), "errors": reply.pop("errors", {}), **reply}
    probe = fpm.parse_probe("noise\n" + fpm.PROBE_MARK + json.dumps(reply) + "\n")
    assert probe.profile == "" and "profile" not in probe.to_json()
    assert fpm.fingerprint_json(fpm.build_fingerprint(probe, profile=fp.profile,
                                                      lock_hash=fp.lock_hash)) == data


def test_errors_and_devices_read_as_typed_values():
    _, fp = _read("errors")
    assert fp.torch is None and fp.devices == [] and fp.trainer_import is False
    assert fp.error("torch") == "ModuleNotFoundError: No module named 'torch'"
    assert fp.error("transformers") == ""
    _, gpu = _read("gpu")
    assert gpu.devices[1] == GpuDevice(index=1, name="NVIDIA H200", capability="9.0")
    assert "errors" not in gpu.to_json() and gpu.errors == {}


def test_a_probe_without_the_torch_fields_takes_their_defaults():
    """The probe leaves out what torch did not answer: the record has None and no device."""
    fp = fpm.parse_probe(fpm.PROBE_MARK + json.dumps(
        {"python": "3.11.2", "errors": {"torch": "ImportError: x"}, "dfo": "0.1.0", "torch": None,
         "trainer_import": True}))
    assert fp.cuda_available is None and fp.device_count is None and fp.devices == []
    out = json.loads(fpm.fingerprint_json(fp.of_env(profile="cpu", lock_hash="a")))
    assert list(out) == [*FINGERPRINT_FIELDS, "errors"] and out["devices"] == []


def test_unknown_keys_are_kept_and_stay_in_the_cache_key():
    _, fp = _read("gpu")
    obj = {**fp.to_json(), "numpy": "2.4.6"}
    more = EnvFingerprint.from_json(obj)
    assert more.extra == {"numpy": "2.4.6"} and more.to_json()["numpy"] == "2.4.6"
    assert ck.fingerprint_components(more)["fingerprint.numpy"] == "2.4.6"


@pytest.mark.parametrize("data,msg", [
    (b"{not json", "Expecting property name"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"profile": "cpu", "device_count": "two"}', "'device_count' is str 'two', expected int"),
    (b'{"devices": [{"index": 0}]}', "lacks its 'name' field"),
])
def test_a_damaged_fingerprint_is_one_line(data, msg):
    with pytest.raises(ValueError, match=msg) as e:
        fpm.parse_fingerprint(data)
    assert "\n" not in str(e.value)


def test_a_mistyped_probe_reply_is_a_deploy_error():
    with pytest.raises(DeployError, match="the env probe's result's 'trainer_import' is str") as e:
        fpm.parse_probe(fpm.PROBE_MARK + json.dumps({"trainer_import": "yes"}))
    assert "\n" not in str(e.value)
    with pytest.raises(ContractError):
        EnvFingerprint.from_json({"devices": "none"})


def test_compare_reads_names_from_the_profile():
    _, fp = _read("smoke_failed")
    expect = {"torch": "2.11.*", "torch_cuda": "13.0", "device_count": {"min": 2},
              "device_names": "*H200", "gpu_smoke": "ok", "profile": "cu128"}
    assert [str(m) for m in fpm.compare(fp, expect)] == [
        "torch.version.cuda: expected 13.0, got 12.8",
        "torch.cuda.device_count(): expected min 2, got 1",
        "torch.cuda.get_device_name(): expected *H200, got [NVIDIA H100 80GB HBM3]",
        "flex_attention compile (forward+backward) on cuda:0: expected ok, got "
        "RuntimeError: triton failed"]
    _, errs = _read("errors")
    (m,) = fpm.compare(errs, {"trainer_import": True})
    assert m.note == "ImportError: cannot import name 'x' from 'trainer'"


def test_changes_and_group_differences_by_field_name():
    _, a = _read("gpu")
    _, b = _read("smoke_failed")
    assert [m.field for m in fpm.fingerprint_changes(a, b)] == ["device_count", "devices",
                                                                "gpu_smoke"]
    assert fpm.fingerprint_changes(a, a) == []
    _, c = _read("errors")
    (d,) = gc.env_differences("g", ["h0", "h1"], {"h0": a, "h1": c})
    assert d.host == "h1" and d.what.startswith("torch none vs 2.11.0+cu128; torch CUDA none vs 12.8;")


def test_the_cache_key_components_of_the_stored_fingerprint():
    _, fp = _read("gpu")
    assert ck.fingerprint_components(fp) == {
        "profile": "cu128", "lock_hash": "ab" * 32, "python": "3.11.9",
        "torch.__version__": "2.11.0+cu128",
        "torch.version.git_version": "70d99e998b4955e0049d13a98d77ae1b14db1f45",
        "torch.version.cuda": "12.8", "triton": "3.5.0", "torch.cuda.is_available()": "true",
        "torch.cuda.device_count()": "2",
        "devices": "0:NVIDIA H200 (9.0), 1:NVIDIA H200 (9.0)", "transformers": "5.6.0",
        "trainer_import": "true"}
    assert ck.drafter_gpus(fp, ["cuda:1", "cuda:4", "cpu"]) == \
        "cuda:1=NVIDIA H200 (9.0), cuda:4=unknown, cpu"


@pytest.mark.parametrize("content", ["{not json", "[1]", '{"device_count": "two"}'])
def test_the_cache_store_names_a_damaged_fingerprint_in_one_line(tmp_path, content):
    from orchestrator.config.host_tree import HostTree
    from orchestrator.engine.cache_store import CacheStore
    from orchestrator.transport.local import LocalTransport

    tree = HostTree(str(tmp_path))
    store = CacheStore(LocalTransport(), tree, "h")
    with pytest.raises(DeployError, match="no deployed env on h"):
        store.fingerprint()
    env = tmp_path / "envs" / "cpu-a"
    env.mkdir(parents=True)
    (tmp_path / "envs" / "current").symlink_to("cpu-a")
    (env / "fingerprint.json").write_text(content)
    with pytest.raises(DeployError) as e:
        store.fingerprint()
    assert str(e.value) == (f"{tree.current_env}/fingerprint.json on h is not valid JSON "
                            "(redeploy with `dfo deploy`)")
    (env / "fingerprint.json").write_bytes((FIXTURES / "gpu.json").read_bytes())
    assert store.fingerprint() == _read("gpu")[1]


def test_the_complete_marker_is_a_record_in_deploys_key_order():
    from dfo_contract.env_fingerprint import EnvComplete

    m = EnvComplete(profile="cpu", lock_hash="h" * 64, dfo="0.1.0", wheel="/r/wheels/x.whl",
                    wheel_sha256="w" * 64, source_digest="s", created="2026-12-07T01:00:00+00:00")
    assert list(m.to_json()) == ["profile", "lock_hash", "dfo", "wheel", "wheel_sha256",
                                 "source_digest", "created"]
    assert EnvComplete.from_json(json.loads(json.dumps(m.to_json()))) == m
    odd = EnvComplete.from_json({"lock_hash": 7, "profile": "cpu", "by": "hand"})
    assert odd.lock_hash == "" and odd.profile == "cpu" and odd.extra == {"by": "hand"}
