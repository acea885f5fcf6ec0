"""hosts.yaml loading and validation: every bad input is one line with file:line, exit 2."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.common.errors import ConfigError
from orchestrator.config.inventory import EMBEDDED_DEFAULT, load_inventory, parse_inventory

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """No real ~/.ssh/config, ./hosts.yaml or $DFO_HOSTS leaks into these tests."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("DFO_HOSTS", raising=False)
    monkeypatch.chdir(tmp_path)
    return home


def write(tmp_path: Path, text: str, name: str = "hosts.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def load_error(tmp_path, text) -> str:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as ei:
        load_inventory(str(p))
    msg = str(ei.value)
    assert "\n" not in msg
    return msg


def cli_error(tmp_path, capsys, text, argv=("hosts", "list")) -> str:
    p = write(tmp_path, text)
    rc = main(["--hosts", str(p), *argv])
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert "Traceback" not in err and "Traceback" not in out
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


PVE = """\
default: pve
hosts:
  pve:
    transport: proxmox
    ssh: {host: 192.0.2.10, user: root}
    vmid: 200
    root: /root/dfo
    profile: cu130
    gpus:
      target: [cuda:0, cuda:1]
      drafter: [cuda:2]
"""


# --------------------------------------------------------------------------- good files

def test_repo_hosts_yaml_and_embedded_default_load(tmp_path, _isolated):
    inv = load_inventory(str(REPO / "hosts.yaml"))
    assert inv.default == "local"
    h = inv.get(None)
    assert h.transport == "local" and h.root == str(_isolated / ".dfo")
    assert h.gpus.target == ("cpu",) and h.gpus.drafter == ("cpu",) and h.profile == "cpu-pypi"
    emb = load_inventory(None)
    assert emb.path is None and emb.get(None) == h.__class__(**{**h.__dict__, "source": emb.get(None).source})
    assert "local" in EMBEDDED_DEFAULT


def test_full_proxmox_host(tmp_path):
    p = write(tmp_path, PVE)
    inv = load_inventory(str(p))
    h = inv.get("pve")
    assert h.transport == "proxmox" and h.vmid == 200 and h.root == "/root/dfo"
    assert h.ssh.host == "192.0.2.10" and h.ssh.user == "root" and h.ssh.port == 22
    assert h.gpus.target == ("cuda:0", "cuda:1") and h.gpus.drafter == ("cuda:2",)
    assert h.tree.run_dir("r1") == "/root/dfo/runs/r1"
    assert h.source == f"{p}:3"
    assert h.describe() == "root@192.0.2.10 ct 200"


def test_search_order(tmp_path, monkeypatch, _isolated):
    # embedded default when nothing exists
    assert load_inventory(None).path is None
    # ~/.config/dfo/hosts.yaml
    cfg = _isolated / ".config" / "dfo"
    cfg.mkdir(parents=True)
    (cfg / "hosts.yaml").write_text(PVE)
    assert load_inventory(None).default == "pve"
    # ./hosts.yaml beats it
    write(tmp_path, "hosts:\n  here: {transport: local, root: /tmp/x}\n")
    assert load_inventory(None).default == "here"
    # $DFO_HOSTS beats that
    other = write(tmp_path, "hosts:\n  env: {transport: local, root: /tmp/y}\n", "other.yaml")
    monkeypatch.setenv("DFO_HOSTS", str(other))
    assert load_inventory(None).default == "env"
    # an explicit path beats everything
    expl = write(tmp_path, "hosts:\n  expl: {transport: local, root: /tmp/z}\n", "expl.yaml")
    assert load_inventory(str(expl)).default == "expl"


def test_missing_explicit_file(tmp_path, capsys):
    rc = main(["--hosts", str(tmp_path / "nope.yaml"), "hosts", "list"])
    assert rc == 2
    assert "does not exist" in capsys.readouterr().err


def test_default_is_first_host_when_not_given(tmp_path):
    p = write(tmp_path, "hosts:\n  b: {transport: local, root: /b}\n  a: {transport: local, root: /a}\n")
    assert load_inventory(str(p)).default == "b"


def test_ssh_string_form_and_ssh_config(tmp_path, _isolated):
    key = _isolated / ".ssh" / "id_lab"
    key.parent.mkdir()
    key.write_text("not really a key\n")
    (_isolated / ".ssh" / "config").write_text(textwrap.dedent(f"""\
        Host node1
          HostName 127.0.0.1
          Port 2222
          User admin
          IdentityFile {key}
          ProxyJump jumper@bastion:2200
          UserKnownHostsFile ~/.ssh/lab_known_hosts
          ConnectTimeout 4
        """))
    p = write(tmp_path, """\
        hosts:
          a: {transport: ssh, ssh: node1, root: /srv/dfo}
          b:
            transport: ssh
            ssh: {host: node1, user: other, port: 22, connect_timeout: 3}
            root: /srv/dfo
          c: {transport: ssh, ssh: "deploy@198.51.100.7:2022", root: /srv/dfo}
        """)
    inv = load_inventory(str(p))
    a = inv.get("a").ssh
    assert (a.host, a.port, a.user, a.identity_file) == ("127.0.0.1", 2222, "admin", str(key))
    assert a.proxy_jump == "jumper@bastion:2200" and a.connect_timeout == 4.0
    assert a.known_hosts == str(_isolated / ".ssh" / "lab_known_hosts")
    assert a.host_key_name == "[127.0.0.1]:2222"
    b = inv.get("b").ssh  # hosts.yaml wins over ~/.ssh/config
    assert (b.host, b.port, b.user, b.connect_timeout) == ("127.0.0.1", 22, "other", 3.0)
    assert b.host_key_name == "127.0.0.1"
    c = inv.get("c").ssh
    assert (c.host, c.port, c.user, c.identity_file) == ("198.51.100.7", 2022, "deploy", None)


def test_unknown_host_name_did_you_mean(tmp_path, capsys):
    p = write(tmp_path, PVE)
    rc = main(["--hosts", str(p), "hosts", "check", "pvee"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "unknown host 'pvee'" in err and "did you mean 'pve'" in err


def test_local_root_tilde_expanded(tmp_path, _isolated):
    p = write(tmp_path, "hosts:\n  l: {transport: local, root: ~/work/dfo}\n")
    assert load_inventory(str(p)).get("l").root == str(_isolated / "work" / "dfo")


# --------------------------------------------------------------------------- bad files

BAD = {
    "root_systemd_chars": (PVE.replace("root: /root/dfo", "root: /root/$HOME/dfo"),
                           r"hosts.yaml:7: hosts.pve.root: must not contain \$, %"),
    "index_url_credentials": (PVE.replace("    root: /root/dfo\n",
                                          "    root: /root/dfo\n    index_url: https://u:tok@pypi.example/simple\n"),
                              r"hosts.yaml:8: hosts.pve.index_url: credentials in the URL"),
    "unconstructible_value": (PVE.replace("root: /root/dfo", "root: !foo x"),
                              r"hosts.yaml:7: cannot read this value: .*quote it as a string"),
    "yaml_syntax": ("hosts:\n  pve:\n    transport: proxmox\n    vmid: [200\n",
                    r"hosts.yaml:\d+: YAML syntax error"),
    "unknown_key": (PVE.replace("    vmid: 200\n", "    vmdi: 200\n"),
                    r"hosts.yaml:6: hosts.pve.vmdi: unknown key \(did you mean 'vmid'\?\)"),
    "wrong_type": (PVE.replace("vmid: 200", "vmid: two hundred"),
                   r"hosts.yaml:6: hosts.pve.vmid: expected an integer, got 'two hundred'$"),
    "missing_ssh_host": (PVE.replace("ssh: {host: 192.0.2.10, user: root}", "ssh: {user: root}"),
                         r"hosts.yaml:5: hosts.pve.ssh.host: missing: a proxmox host needs"),
    "missing_ssh_block": (PVE.replace("    ssh: {host: 192.0.2.10, user: root}\n", ""),
                          r"hosts.yaml:3: hosts.pve.ssh.host: missing"),
    "unknown_default": (PVE.replace("default: pve", "default: pev"),
                        r"hosts.yaml:1: default: unknown host 'pev' \(did you mean 'pve'\?\)"),
    "duplicate_host": (PVE + "  pve:\n    transport: local\n    root: /x\n",
                       r"hosts.yaml:12: hosts.pve: duplicate key \(first defined at line 3"),
    "identity_missing": (PVE.replace("user: root}", "user: root, identity_file: ~/.ssh/nope}"),
                         r"hosts.yaml:5: hosts.pve.ssh.identity_file: ~/.ssh/nope does not exist"),
    "root_relative": (PVE.replace("root: /root/dfo", "root: dfo"),
                      r"hosts.yaml:7: hosts.pve.root: must be an absolute path on the remote side"),
    "root_tilde_remote": (PVE.replace("root: /root/dfo", "root: ~/dfo"),
                          r"hosts.yaml:7: hosts.pve.root: must be an absolute path .*'~' is not expanded"),
    "bad_transport": (PVE.replace("transport: proxmox", "transport: proxmx"),
                      r"hosts.yaml:4: hosts.pve.transport: expected one of .* \(did you mean 'proxmox'\?\)"),
    "bad_device": (PVE.replace("drafter: [cuda:2]", "drafter: [gpu2]"),
                   r"hosts.yaml:11: hosts.pve.gpus.drafter\[0\]: expected a device like cuda:0"),
    "port_range": (PVE.replace("user: root}", "user: root, port: 70000}"),
                   r"hosts.yaml:5: hosts.pve.ssh.port: expected an integer between 1 and 65535"),
    "unknown_top_key": ("defualt: pve\n" + PVE.split("\n", 1)[1],
                        r"hosts.yaml:1: defualt: unknown key \(did you mean 'default'\?\)"),
    "vmid_on_ssh": (PVE.replace("transport: proxmox", "transport: ssh"),
                    r"hosts.yaml:6: hosts.pve.vmid: only a proxmox host has a vmid"),
    "missing_vmid": (PVE.replace("    vmid: 200\n", ""),
                     r"hosts.yaml:3: hosts.pve.vmid: missing"),
    "no_hosts": ("default: x\n", r"hosts.yaml:1: hosts: missing"),
    "empty_file": ("", r"hosts.yaml: the file is empty"),
    "hosts_not_mapping": ("hosts: [a, b]\n", r"hosts.yaml:1: hosts: expected a mapping, got a list"),
    "duplicate_ssh_key": (PVE.replace("ssh: {host: 192.0.2.10, user: root}",
                                      "ssh: {host: 192.0.2.10, host: 192.0.2.11}"),
                          r"hosts.yaml:5: hosts.pve.ssh.host: duplicate key"),
    "bad_fallback_class": (PVE + "    fallbacks: {fx_race: [compile_gate]}\n",
                           r"hosts.yaml:12: hosts.pve.fallbacks.fx_race: unknown key \(did you mean 'fx_trace_race'\?\)"),
    "bad_fallback_step": (PVE + "    fallbacks:\n      oom: [compile_gaet]\n",
                          r"hosts.yaml:13: hosts.pve.fallbacks.oom: unknown fallback step 'compile_gaet'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_inventory_exit_2_one_line(case, tmp_path, capsys):
    import re

    text, pattern = BAD[case]
    line = cli_error(tmp_path, capsys, text)
    assert line.startswith("dfo: error: ")
    msg = line[len("dfo: error: "):]
    # the file is named as given (full path): strip the directory for the pattern
    msg = msg.replace(str(tmp_path) + os.sep, "")
    assert re.search(pattern, msg), msg


def test_parse_inventory_names_the_file_given():
    with pytest.raises(ConfigError, match=r"^where.yaml:2: hosts.x.root: missing"):
        parse_inventory("hosts:\n  x: {transport: local}\n", "where.yaml")


def test_good_fallbacks_kept(tmp_path):
    p = write(tmp_path, PVE + "    fallbacks:\n      oom: [halve_micro_batch]\n      fx_trace_race: compile_gate\n")
    h = load_inventory(str(p)).get("pve")
    assert h.fallbacks == {"oom": ("halve_micro_batch",), "fx_trace_race": ("compile_gate",)}
