"""The compile cache's records (dfo_contract.cache_records) through the one codec: a
snapshot manifest as stored reads and writes back byte for byte, and this dfo writes the
same bytes for the same snapshot; the cache helper's replies read as records (a missing
field takes its default, an unknown one is ignored, an ``{"error"}`` or no JSON is one
CacheError line)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dfo_contract import codec
from dfo_contract.cache_records import (Adoption, CacheStatusReply, FileDigest, HashDirReply,
                                        HashFileReply, Manifest, ScanReply, ScrubReply,
                                        UnpackReply, WarmupInfo)
from dfo_contract.env_fingerprint import EnvFingerprint
from dfo_contract.errors import ContractError
from orchestrator.common.errors import CacheError
from orchestrator.plan import provenance as pv
from orchestrator.plan import snapshot as sn

FIXTURES = Path(__file__).parent / "fixtures" / "cache"
H1 = hashlib.sha256(b"fx").hexdigest()
H2 = hashlib.sha256(b"so").hexdigest()
H3 = hashlib.sha256(b"mega").hexdigest()
HT = hashlib.sha256(b"tar").hexdigest()
COMPS = {"torch.__version__": "2.13.0+cpu", "gpu": "cpu", "config.model.block_size": "16",
         "trainer.source": "a" * 64, "target.config": "none"}
FILES = {"inductor/fxgraph/ab/cdef": FileDigest(sha256=H1, size=1234),
         "triton/XYZ/kernel.so": FileDigest(sha256=H2, size=20480),
         "mega/artifacts.bin": FileDigest(sha256=H3, size=777)}


@pytest.mark.parametrize("name", ["built", "adopted", "adopted-empty"])
def test_a_stored_manifest_reads_and_writes_back_byte_for_byte(name):
    data = (FIXTURES / f"{name}.manifest.json").read_bytes()
    m = sn.parse_manifest(data, name)
    assert isinstance(m, Manifest) and m.key == "cpu-0123456789abcdef"
    assert sn.manifest_bytes(m) == data
    assert list(json.loads(data)) == list(m.to_json())


def test_this_dfo_writes_the_stored_bytes_for_the_same_snapshot():
    fp = EnvFingerprint(profile="cpu", lock_hash="f" * 64, python="3.11.2", torch="2.13.0+cpu")
    prov = pv.build_provenance(host="gpu1", machine="gpu1-ct", fingerprint=fp,
                               key="cpu-0123456789abcdef", created=1700000000.5, dfo="0.1.0")
    m = sn.build_manifest("cpu-0123456789abcdef", COMPS, FILES, tar_sha256=HT, tar_size=30720,
                          created=1700000000.5, torch="2.13.0+cpu", provenance=prov,
                          warmup=WarmupInfo(cold_s=12.345, warm_s=2.1, shapes=3,
                                            counters={"fxgraph_cache_miss": 4,
                                                      "fxgraph_cache_hit": 0},
                                            warm_counters={"fxgraph_cache_hit": 4}))
    assert sn.manifest_bytes(m) == (FIXTURES / "built.manifest.json").read_bytes()
    adopted = pv.adoption_record(m, pv.Trust(host="pve", trust_other_hosts=True),
                                 "--trust-other-hosts", 1700000100.0)
    assert adopted.adopted == Adoption(host="pve", machine=None, source="gpu1 (machine gpu1-ct)",
                                       how="--trust-other-hosts", at_utc="2023-11-14T22:15:00Z")
    assert sn.manifest_bytes(adopted) == (FIXTURES / "adopted.manifest.json").read_bytes()
    # what a host built itself is stored without an adoption
    assert pv.adoption_record(adopted, pv.Trust(host="gpu1", machine="gpu1-ct"), "built here",
                              0.0).adopted is None


def test_unknown_manifest_keys_are_kept_and_a_mistyped_one_is_one_line():
    obj = json.loads((FIXTURES / "built.manifest.json").read_bytes())
    obj["later"] = {"x": 1}
    obj["provenance"]["signed_by"] = "someone"
    m = sn.manifest_from_json(obj, "m")
    assert m.extra == {"later": {"x": 1}} and m.provenance and \
        m.provenance.extra == {"signed_by": "someone"}
    assert json.loads(sn.manifest_bytes(m)) == obj
    obj["created"] = "yesterday"
    with pytest.raises(CacheError) as e:
        sn.manifest_from_json(obj, "snap.manifest.json")
    assert "snapshot manifest snap.manifest.json is not valid: 'created' is str" in str(e.value)
    assert "\n" not in str(e.value)


def test_the_helpers_replies_are_records():
    def parse(op, reply, obj):
        return sn.parse_tool("noise\n" + json.dumps(obj) + "\n", f"cache helper {op}", reply)

    assert parse("hashfile", HashFileReply, {"sha256": HT, "size": 3}).digest == \
        FileDigest(sha256=HT, size=3)
    assert parse("hashfile", HashFileReply, {"missing": True}).digest is None
    d = parse("hashdir", HashDirReply, {"files": {"inductor/a": {"sha256": H1, "size": 1}},
                                        "later": 1})          # an unknown key: ignored
    assert d.files == {"inductor/a": FileDigest(sha256=H1, size=1)} and d.other == []
    u = parse("unpack", UnpackReply, {"refused": "member x is a fifo"})  # no files: defaults
    assert u.refused == "member x is a fifo" and u.files == {} and not u.missing
    assert parse("scrub", ScrubReply, {"dropped": [["inductor/x.so", "empty"]]}).dropped == \
        [("inductor/x.so", "empty")]
    assert ScanReply.from_json({"members": 5}) == ScanReply(members=5)
    with pytest.raises(CacheError) as e:  # a digest without its size is not a digest
        parse("hashdir", HashDirReply, {"files": {"inductor/a": {"sha256": H1}}})
    assert "cache helper hashdir" in str(e.value) and "'size'" in str(e.value)
    with pytest.raises(ContractError):
        codec.decode(ScrubReply, {"dropped": [["a", "b", "c"]]})


@pytest.mark.parametrize("output", ['{"error": "unknown op x"}\n', "Traceback ...\n{broken\n", ""])
def test_an_error_or_no_reply_is_the_helpers_cache_error(output):
    with pytest.raises(CacheError) as e:
        sn.parse_tool(output, "cache helper hashdir", HashDirReply)
    assert str(e.value).startswith("cache helper hashdir: the cache helper printed no result")
    assert e.value.hint == "is the env deployed? `dfo deploy`"


def test_status_reads_tolerant_and_a_snapshot_is_judged_by_the_manifest_parser(tmp_path):
    good = json.loads((FIXTURES / "built.manifest.json").read_bytes())
    raw = {"live": {"k": {"size": 5, "mtime": 1.0, "target": "/g", "link": True,
                          "damaged": [["inductor/a.so", "empty"]]}},
           "snapshots": {
               "cpu-0123456789abcdef": {"mtime": 2.0, "created": "soon", "provenance": "x",
                                        "manifest": good, "tar_size": 30720,
                                        "tar": {"sha256": HT, "size": 30720}, "refused": None},
               "bad": {"mtime": 3.0, "manifest": dict(good, tar={"sha256": HT}),
                       "tar": {"missing": True}},
               "torn": {"mtime": 4.0, "error": "JSONDecodeError", "tar_size": None}},
           "used": {}, "stale": [".gens/k-1"]}
    st = codec.decode(CacheStatusReply, raw)
    snap = st.snapshots["cpu-0123456789abcdef"]
    assert snap.created is None and snap.provenance is None      # mistyped: the default
    entries = {e.key: e for e in sn.entries_from_status(st)}
    assert entries["k"].live_damage == (("inductor/a.so", "empty"),)
    assert entries["cpu-0123456789abcdef"].problem is None
    assert entries["bad"].problem == ("snapshot manifest bad.manifest.json is not valid: "
                                      "'tar' lacks a sha256/size")
    assert entries["torn"].problem == "manifest unreadable (JSONDecodeError)"
    # the helper's own reply, as it prints it, reads the same way
    r = subprocess.run(sn.tool_argv(sys.executable, "status", str(tmp_path / "none")),
                       capture_output=True, text=True, check=True)
    assert sn.parse_tool(r.stdout, "cache status", CacheStatusReply) == CacheStatusReply()
