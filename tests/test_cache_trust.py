"""Snapshots you can trust: only regular files and directories in a snapshot
(at creation, push, restore and --status), provenance in the manifest, and adopting a
snapshot another host built only as an explicit act (--trust-other-hosts or hosts.yaml's
cache.trusted_sources).

Pure parts are tested directly; the rest runs through the ``local`` transport on a
deployed-looking root (tests/helpers/cache_env.py) with a hand-made cache dir (dfo treats
cache contents as opaque bytes, so no compile is needed here)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from dfo_contract.cache_records import Adoption, FileDigest, Manifest, Provenance
from dfo_contract.codec import encode
from orchestrator.engine.compile_cache import CacheManager, _hash_local
from orchestrator.common.errors import CacheError
from orchestrator.plan import provenance as pv
from orchestrator.plan import snapshot as sn
from orchestrator.config.host_tree import HostTree
from orchestrator.remote import cache_tool
from orchestrator.transport.local import LocalTransport

from tests.helpers.cache_env import CFG, typed, make_env

H = hashlib.sha256(b"x").hexdigest()


# --------------------------------------------------------------------------- tar members (pure)

def _tar(path: Path, members: list[tuple[str, str, str | bytes]]) -> Path:
    """A tar with (name, kind, data/linkname) members, kind in dir/file/sym/lnk/fifo/chr."""
    with tarfile.open(path, "w") as tf:
        for name, kind, data in members:
            ti = tarfile.TarInfo(name)
            ti.mtime = 1700000000
            if kind == "dir":
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                tf.addfile(ti)
            elif kind == "file":
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
            else:
                ti.type = {"sym": tarfile.SYMTYPE, "lnk": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE,
                           "chr": tarfile.CHRTYPE}[kind]
                ti.linkname = data if isinstance(data, str) else ""
                tf.addfile(ti)
    return path


GOOD = [("inductor", "dir", ""), ("inductor/a", "file", b"aaa"), ("triton", "dir", ""),
        ("mega", "dir", ""), ("mega/artifacts.bin", "file", b"m")]


@pytest.mark.parametrize("bad,needle", [
    (("inductor/xx", "sym", "/elsewhere"), "inductor/xx is a symlink (to /elsewhere)"),
    (("inductor/h", "lnk", "/etc/passwd"), "inductor/h is a hard link"),
    (("inductor/f", "fifo", ""), "inductor/f is a fifo"),
    (("inductor/d", "chr", ""), "inductor/d is a device"),
    (("/etc/evil", "file", b"x"), "/etc/evil has an absolute name"),
    (("inductor/../../evil", "file", b"x"), "'..'"),
    (("other/x", "file", b"x"), "other/x is not under"),
])
def test_forbidden_members_are_refused_before_anything_is_written(tmp_path, bad, needle):
    tar = _tar(tmp_path / "s.tar", [*GOOD, bad, ("inductor/z", "file", b"after")])
    scan = cache_tool.scan_tar(str(tar))
    assert needle in scan["refused"] and "\n" not in scan["refused"]
    dest = tmp_path / "gen"
    dest.mkdir()
    out = cache_tool.unpack(str(tar), str(dest))
    assert needle in out["refused"]
    assert list(dest.iterdir()) == []  # checked first, extracted never
    with pytest.raises(CacheError, match="refused: member .*regular files and directories"):
        sn.check_members(out["refused"], "s.tar")


def test_unpack_extracts_files_and_dirs_only_inside_the_target(tmp_path):
    tar = _tar(tmp_path / "s.tar", GOOD)
    assert cache_tool.scan_tar(str(tar)) == {"members": 5}
    dest = tmp_path / "gen"
    dest.mkdir()
    out = cache_tool.unpack(str(tar), str(dest))
    assert set(out["files"]) == {"inductor/a", "mega/artifacts.bin"} and out["other"] == []
    assert (dest / "inductor" / "a").read_bytes() == b"aaa"
    # a name twice (the second would overwrite the first, or write through it): refused
    twice = _tar(tmp_path / "t.tar", [*GOOD, ("inductor/a", "file", b"again")])
    d2 = tmp_path / "gen2"
    d2.mkdir()
    assert "appears twice" in cache_tool.unpack(str(twice), str(d2))["refused"]


def test_truncated_tar_is_not_readable(tmp_path):
    tar = _tar(tmp_path / "s.tar", [*GOOD, ("inductor/big", "file", os.urandom(40000))])
    data = tar.read_bytes()
    tar.write_bytes(data[:3000])
    assert "not a readable tar" in cache_tool.scan_tar(str(tar))["refused"]


def test_check_files_refuses_links_beside_the_files():
    m = _manifest({"inductor/a": FileDigest(sha256=H, size=1)})
    sn.check_files(m, {"inductor/a": FileDigest(sha256=H, size=1)}, "s")
    with pytest.raises(CacheError, match="inductor/xx: not a regular file"):
        sn.check_files(m, {"inductor/a": FileDigest(sha256=H, size=1)}, "s", other=["inductor/xx"])


# --------------------------------------------------------------------------- provenance (pure)

PROV = Provenance(host="gpu1", machine="gpu1-ct", env="cpu-000000000000", cache_key="cpu-x",
                  python="3.11.7", torch="2.13.0+cpu", dfo="0.1.0",
                  created_utc="2026-12-01T00:00:00Z")


def _manifest(files=None, *, provenance: Provenance | None = None) -> Manifest:
    return sn.build_manifest("cpu-0123456789abcdef", {"a": "b"},
                             files or {"mega/artifacts.bin": FileDigest(sha256=H, size=1)},
                             tar_sha256=H, tar_size=10, created=1.0, torch="t",
                             provenance=provenance)


def test_trust_rules():
    m = _manifest(provenance=PROV)
    here = pv.Trust(host="gpu1", machine="gpu1-ct")
    assert pv.check_trust(m, here, "s") == "built here"
    # same inventory name, another machine (someone else's `local`): not trusted
    with pytest.raises(CacheError):
        pv.check_trust(m, pv.Trust(host="gpu1", machine="laptop"), "s")
    other = pv.Trust(host="pve", machine="ct200")
    with pytest.raises(CacheError) as e:
        pv.check_trust(m, other, "snap.tar")
    msg = str(e.value)
    assert "snap.tar was built on gpu1 (machine gpu1-ct), not on pve" in msg
    assert "--trust-other-hosts" in msg and "hosts.pve.cache.trusted_sources" in msg
    assert "\n" not in msg and e.value.exit_code == 8
    assert pv.check_trust(m, pv.Trust(host="pve", trusted_sources=("gpu1",)), "s") == "trusted source gpu1"
    assert pv.check_trust(m, pv.Trust(host="pve", trusted_sources=("gpu1-ct",)), "s") == "trusted source gpu1"
    assert pv.check_trust(m, pv.Trust(host="pve", trust_other_hosts=True), "s") == "--trust-other-hosts"
    # no provenance (a dfo that records none): not trusted
    with pytest.raises(CacheError, match="records no builder"):
        pv.check_trust(_manifest(), other, "s")
    # an incoming "adopted" is never believed; a stored one is
    forged = replace(m, adopted=Adoption(host="pve", machine="ct200"))
    with pytest.raises(CacheError):
        pv.check_trust(forged, other, "s")
    assert pv.check_trust(forged, other, "s", stored=True) == "adopted here"
    rec = pv.adoption_record(forged, pv.Trust(host="pve", machine="ct200", trust_other_hosts=True),
                             "--trust-other-hosts", 0.0)
    assert rec.adopted and rec.adopted.source == "gpu1 (machine gpu1-ct)" \
        and rec.adopted.how == "--trust-other-hosts"
    assert "adopted" not in pv.adoption_record(forged, here, "built here", 0.0).to_json()


def test_manifest_carries_provenance_and_rejects_a_bad_one():
    m = _manifest(provenance=PROV)
    assert sn.parse_manifest(sn.manifest_bytes(m), "m").provenance == PROV
    bad = json.loads(sn.manifest_bytes(m))
    bad["provenance"] = {"host": ["x"]}
    with pytest.raises(CacheError, match="'provenance'"):
        sn.parse_manifest(json.dumps(bad), "m")


# --------------------------------------------------------------------------- hosts.yaml key

def test_hosts_yaml_trusted_sources(tmp_path):
    from orchestrator.config.inventory import load_inventory
    from orchestrator.common.errors import ConfigError

    f = tmp_path / "hosts.yaml"
    f.write_text("hosts:\n  a:\n    transport: local\n    root: /tmp/x\n"
                 "    cache: {trusted_sources: [gpu1, gpu2.lan]}\n")
    assert load_inventory(str(f)).get("a").cache_trusted_sources == ("gpu1", "gpu2.lan")
    for body, needle in [
        ("    cache: {trusted: [gpu1]}\n", "hosts.yaml:5: hosts.a.cache.trusted: unknown key"),
        ("    cache:\n      trusted_sources: [gpu1, '../x']\n",
         "hosts.yaml:6: hosts.a.cache.trusted_sources[1]: expected a host name"),
        ("    cache: [gpu1]\n", "hosts.yaml:5: hosts.a.cache: expected a mapping"),
    ]:
        f.write_text("hosts:\n  a:\n    transport: local\n    root: /tmp/x\n" + body)
        with pytest.raises(ConfigError) as e:
            load_inventory(str(f))
        assert needle in str(e.value), str(e.value)


# --------------------------------------------------------------------------- through a host root

def _fake_cache(d: Path) -> Path:
    for rel, data in {"inductor/fxgraph/ab/x.py": b"print(1)\n", "inductor/o.so": b"\x7fELF" + bytes(60),
                      "triton/k.json": b"{}", "mega/artifacts.bin": b"mega"}.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
    return d


@pytest.fixture()
def host(tmp_path):
    root = tmp_path / "root"
    make_env(root)
    mgr = CacheManager(LocalTransport(), HostTree(str(root)), host="a")
    key = mgr.key(typed(CFG))
    m = mgr.adopt(str(_fake_cache(tmp_path / "made")), key)
    return root, mgr, key, m


def _second(tmp_path, name="b", **kw) -> CacheManager:
    root2 = tmp_path / "root2"
    make_env(root2)
    return CacheManager(LocalTransport(), HostTree(str(root2)), host=name, **kw)


def _with_symlink(tar: Path, man: Path, target: str) -> None:
    """A hostile snapshot: the same files plus `inductor/xx -> TARGET`, the tar's checksum
    recomputed into the manifest (so every checksum check passes)."""
    with tarfile.open(tar, "a") as tf:
        ti = tarfile.TarInfo("inductor/xx")
        ti.type, ti.linkname = tarfile.SYMTYPE, target
        tf.addfile(ti)
    mm = json.loads(man.read_text())
    mm["tar"].update(encode(_hash_local(tar)))
    man.write_text(json.dumps(mm))


def test_provenance_is_recorded(host):
    root, mgr, key, m = host
    prov = m.provenance
    assert prov and prov.host == "a" and prov.machine == socket.gethostname()
    assert prov.env == "cpu-000000000000" and prov.cache_key == key.key
    assert prov.torch == key.components["torch.__version__"] and prov.python.startswith("3.")
    assert prov.dfo and prov.created_utc.endswith("Z")


def test_push_with_a_symlink_outside_is_refused(host, tmp_path):
    root, mgr, key, m = host
    p = sn.paths(mgr.tree, key.key)
    live = os.readlink(p.live)
    tar, man = mgr.pull(key.key, tmp_path / "dl")
    elsewhere = tmp_path / "elsewhere"
    _with_symlink(tar, man, str(elsewhere))
    with pytest.raises(CacheError) as e:
        mgr.push(tar, key)
    assert "inductor/xx is a symlink (to " + str(elsewhere) in str(e.value) and e.value.exit_code == 8
    assert os.readlink(p.live) == live
    assert not [x for x in Path(p.tar).parent.iterdir() if x.name.startswith(".")]  # not uploaded
    assert not elsewhere.exists()


def test_store_with_a_symlink_is_refused_on_restore_and_flagged_by_status(host, tmp_path, capsys):
    root, mgr, key, m = host
    p = sn.paths(mgr.tree, key.key)
    live = os.readlink(p.live)
    _with_symlink(Path(p.tar), Path(p.manifest), str(tmp_path / "elsewhere"))
    with pytest.raises(CacheError, match="inductor/xx is a symlink"):
        mgr.restore_from_store(key)
    assert os.readlink(p.live) == live and not (tmp_path / "elsewhere").exists()
    assert [x.name for x in Path(root, "cache", ".gens").iterdir()] == [os.path.basename(live)]
    entries, _ = mgr.status(verify=True)
    assert "inductor/xx is a symlink" in entries[0].problem


def test_a_cache_dir_with_a_symlink_is_not_snapshotted(host, tmp_path):
    root, mgr, key, m = host
    src = _fake_cache(tmp_path / "made2")
    (src / "inductor" / "xx").symlink_to(tmp_path)
    before = Path(sn.paths(mgr.tree, key.key).manifest).read_bytes()
    with pytest.raises(CacheError, match="cannot snapshot .*inductor/xx is a symlink or special file"):
        mgr.adopt(str(src), key)
    assert Path(sn.paths(mgr.tree, key.key).manifest).read_bytes() == before


def test_another_hosts_snapshot_needs_an_explicit_adoption(host, tmp_path):
    root, mgr, key, m = host
    tar, man = mgr.pull(key.key, tmp_path / "dl")
    b = _second(tmp_path)
    kb = b.key(typed(CFG))
    assert kb.key == key.key
    with pytest.raises(CacheError) as e:
        b.push(tar, kb)
    msg = str(e.value)
    assert f"was built on a (machine {socket.gethostname()}), not on b" in msg and "--trust-other-hosts" in msg
    assert not Path(sn.paths(b.tree, kb.key).tar).exists()
    stored = b.push(tar, kb, trust_other_hosts=True)
    assert stored.adopted and stored.adopted.host == "b" and stored.adopted.how == "--trust-other-hosts"
    on_disk = json.loads(Path(sn.paths(b.tree, kb.key).manifest).read_text())
    assert on_disk["adopted"]["from"].startswith("a") and on_disk["provenance"]["host"] == "a"
    # adopted once: the store's copy restores without the flag
    b.restore_from_store(kb)
    # another host's snapshot copied into the store by hand (not adopted) is refused
    Path(sn.paths(b.tree, kb.key).manifest).write_bytes(man.read_bytes())
    with pytest.raises(CacheError, match="was built on a .*not on b"):
        b.restore_from_store(kb)
    b.restore_from_store(kb, trust_other_hosts=True)
    # a trusted source needs no flag
    c = CacheManager(b.transport, b.tree, host="b", trusted_sources=("a",))
    adopted = c.push(tar, kb).adopted
    assert adopted and adopted.how == "trusted source a"


@pytest.mark.parametrize("damage", ["sha256", "truncated", "manifest", "member", "no tar"])
def test_status_flags_a_corrupt_stored_snapshot(host, tmp_path, damage):
    root, mgr, key, m = host
    p = sn.paths(mgr.tree, key.key)
    entries, _ = mgr.status(verify=True)
    assert entries[0].problem is None and entries[0].built_by.startswith("a")
    tar, man = Path(p.tar), Path(p.manifest)
    data = bytearray(tar.read_bytes())
    if damage == "sha256":
        data[len(data) // 3] ^= 0x20
        tar.write_bytes(bytes(data))
        needle = "is corrupt"
    elif damage == "truncated":
        tar.write_bytes(bytes(data[:1024]))
        needle = "truncated"
    elif damage == "manifest":
        man.write_text('{"format": 1, "key": ')
        needle = "manifest unreadable"
    elif damage == "member":
        _with_symlink(tar, man, "/elsewhere")
        needle = "inductor/xx is a symlink"
    else:
        tar.unlink()
        needle = "tar file is missing"
    entries, _ = mgr.status(verify=True)
    assert needle in (entries[0].problem or ""), entries[0]
    # without verification (prune's listing) the tar is not read (an unreadable manifest
    # shows either way)
    if damage != "manifest":
        assert mgr.status()[0][0].problem is None


def test_cli_status_exits_8_naming_the_bad_snapshot_and_push_needs_trust(host, tmp_path, capsys,
                                                                        monkeypatch):
    from orchestrator.cli import main

    from orchestrator.config.runconfig import load_layers

    monkeypatch.setenv("COLUMNS", "200")
    root, mgr, _, _ = host
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("data: {path: /x.jsonl, max_seq_len: 64, num_anchors: 4}\n")
    key = mgr.key(load_layers(cfg).config)  # the key the CLI computes for this config
    mgr.adopt(str(_fake_cache(tmp_path / "made-cli")), key)
    b = _second(tmp_path)
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"default: a\nhosts:\n  a: {{transport: local, root: {root}}}\n"
                     f"  b: {{transport: local, root: {b.tree.root}}}\n"
                     f"  c: {{transport: local, root: {b.tree.root}, cache: {{trusted_sources: [a]}}}}\n")
    capsys.readouterr()
    assert main(["--hosts", str(hosts), "warm-cache", "--status"]) == 0
    out = capsys.readouterr().out
    assert "2 stored snapshot(s) verified" in out and key.key in out and "BAD" not in out
    tar, man = mgr.pull(key.key, tmp_path / "dl")
    # the CLI: refused without the flag (one line), taken with it, and by a host that trusts a
    assert main(["--hosts", str(hosts), "warm-cache", "--host", "b", "--config", str(cfg),
                 "--push", str(tar)]) == 8
    err = capsys.readouterr().err
    assert "was built on a" in err and "--trust-other-hosts" in err and len(err.strip().splitlines()) == 1
    assert main(["--hosts", str(hosts), "warm-cache", "--host", "c", "--config", str(cfg),
                 "--push", str(tar), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["action"] == "pushed"
    assert main(["--hosts", str(hosts), "warm-cache", "--host", "b", "--config", str(cfg),
                 "--push", str(tar), "--trust-other-hosts", "--json"]) == 0
    capsys.readouterr()
    # a damaged store: --status shows it and exits 8 with one line naming it
    p = sn.paths(mgr.tree, key.key)
    with open(p.tar, "r+b") as f:
        f.truncate(2048)
    assert main(["--hosts", str(hosts), "warm-cache", "--status"]) == 8
    cap = capsys.readouterr()
    assert f"BAD {key.key}: snapshot {key.key}.tar is truncated" in cap.out
    assert f"1 stored snapshot(s) on a fail verification: {key.key}: snapshot {key.key}.tar is truncated" \
        in cap.err and len(cap.err.strip().splitlines()) == 1
    assert main(["--hosts", str(hosts), "warm-cache", "--status", "--json"]) == 8
    js = json.loads(capsys.readouterr().out)
    assert "truncated" in next(k for k in js["keys"] if k["key"] == key.key)["problem"]
