"""Lab self-tests: the real sshd node and the pct stand-in, driven with the
OpenSSH client (the way a person on a Proxmox node would)."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.lab.client import ssh

pytestmark = pytest.mark.lab

AWKWARD = [
    "fil () &&-@_e.txt",
    "$(touch /tmp/pwned)",
    "`touch /tmp/pwned`",
    "line1\nline2\n",
    "it's \"quoted\" \\ back",
    "; rm -rf / #",
    "*.py ?[a-z]",
    "ünïcödé ✓ 日本",
    "",
    " leading and trailing ",
    "-n",
    "--",
    "$HOME ${PATH} %s %n",
    "\t\r",
]

ECHO_ARGV = ["python3", "-c",
             "import os,sys; sys.stdout.buffer.write(b'\\0'.join(os.fsencode(a) for a in sys.argv[1:]))"]


def test_ssh_runs_a_command_on_the_node(sshd_only):
    p = ssh(sshd_only, ["id", "-u"])
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode().strip() == "0"


def test_known_hosts_has_bracketed_port_and_strict_checking_passes(sshd_only):
    line = open(sshd_only.known_hosts).read().strip()
    assert line.startswith(f"[127.0.0.1]:{sshd_only.ssh_port} ssh-ed25519 ")
    assert line.endswith(sshd_only.host_public_key)


def test_wrong_host_key_is_refused_by_strict_client(sshd_only, tmp_path):
    bogus = tmp_path / "known_hosts"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    other = (tmp_path / "k.pub").read_text().split()
    bogus.write_text(f"[127.0.0.1]:{sshd_only.ssh_port} {other[0]} {other[1]}\n")
    p = subprocess.run(["ssh", "-F", sshd_only.ssh_config, "-o", f"UserKnownHostsFile={bogus}",
                        "dfo-lab-node", "true"], capture_output=True, timeout=30)
    assert p.returncode == 255
    assert b"HOST IDENTIFICATION HAS CHANGED" in p.stderr


def test_password_login_is_refused(sshd_only):
    p = subprocess.run(["ssh", "-F", sshd_only.ssh_config, "-o", "PubkeyAuthentication=no",
                        "-o", "PreferredAuthentications=password,keyboard-interactive",
                        "dfo-lab-node", "true"], capture_output=True, timeout=30)
    assert p.returncode == 255
    assert b"Permission denied" in p.stderr


def test_pct_is_on_the_session_path(sshd_only):
    p = ssh(sshd_only, ["command", "-v", "pct"])
    assert p.stdout.decode().strip() == os.path.join(sshd_only.bin_dir, "pct")


def test_pct_status_running(lab):
    p = ssh(lab, ["pct", "status", str(lab.vmid)])
    assert p.returncode == 0, p.stderr
    assert p.stdout == b"status: running\n"


def test_pct_unknown_vmid_fails_like_proxmox(lab):
    p = ssh(lab, ["pct", "status", "999"])
    assert p.returncode == 2
    node = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    assert p.stderr.decode().strip() == f"Configuration file 'nodes/{node}/lxc/999.conf' does not exist"
    p = ssh(lab, ["pct", "exec", "999", "--", "true"])
    assert p.returncode == 2


def test_pct_bad_vmid_and_missing_command(lab):
    assert ssh(lab, ["pct", "status", "abc"]).returncode == 255
    p = ssh(lab, ["pct", "exec", str(lab.vmid)])
    assert p.returncode == 255 and b"missing command" in p.stderr


def test_pct_exec_passes_awkward_argv_byte_for_byte(lab):
    p = ssh(lab, ["pct", "exec", str(lab.vmid), "--", *ECHO_ARGV, *AWKWARD])
    assert p.returncode == 0, p.stderr
    assert p.stdout.split(b"\0") == [a.encode() for a in AWKWARD]
    # and nothing was evaluated on the way, on the node or in the container
    assert not os.path.exists("/tmp/pwned")
    q = ssh(lab, ["pct", "exec", str(lab.vmid), "--", "test", "-e", "/tmp/pwned"])
    assert q.returncode == 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
                        max_size=20), max_size=5))
def test_pct_exec_argv_property(lab, args):
    p = ssh(lab, ["pct", "exec", str(lab.vmid), "--", *ECHO_ARGV, *args])
    assert p.returncode == 0, p.stderr
    got = p.stdout.split(b"\0") if args else []
    if args == [""]:
        got = [b""]
    assert got == [a.encode() for a in args]


@pytest.mark.parametrize("code", [0, 1, 42, 255])
def test_pct_exec_passes_the_exit_code(lab, code):
    p = ssh(lab, ["pct", "exec", str(lab.vmid), "--", "sh", "-c", f"exit {code}"])
    assert p.returncode == code


def test_pct_exec_keep_env(lab):
    kept = ssh(lab, ["pct", "exec", str(lab.vmid), "--", "env"]).stdout.decode()
    assert "SSH_CONNECTION=" in kept  # default keep-env 1: the node session's env goes in
    cleared = ssh(lab, ["pct", "exec", str(lab.vmid), "--keep-env", "0", "--", "env"]).stdout.decode()
    assert sorted(cleared.split()) == ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                       "container=lxc"]


def test_pct_exec_streams_stdin(lab):
    data = os.urandom(200_000)
    p = ssh(lab, ["pct", "exec", str(lab.vmid), "--", "sha256sum"], input_=data)
    assert p.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()


def test_push_and_pull_keep_content_and_mode(lab, tmp_path):
    vmid = str(lab.vmid)
    src = tmp_path / "src.bin"
    data = bytes(range(256)) * 400 + os.urandom(1000)
    src.write_bytes(data)
    src.chmod(0o640)
    dest = "/tmp/fil () &&-@_e.txt"
    ssh(lab, ["pct", "exec", vmid, "--", "rm", "-f", dest])
    p = ssh(lab, ["pct", "push", vmid, str(src), dest, "--perms", "0750"])
    assert p.returncode == 0, p.stderr
    st_ = ssh(lab, ["pct", "exec", vmid, "--", "stat", "-c", "%a %s %U", dest]).stdout.decode().split()
    assert st_ == ["750", str(len(data)), "root"]
    # lxc-attach never got the host file as its stdio: its mode is untouched
    assert (src.stat().st_mode & 0o777) == 0o640
    # an existing file keeps its mode when no --perms is given
    ssh(lab, ["pct", "exec", vmid, "--", "chmod", "600", dest])
    assert ssh(lab, ["pct", "push", vmid, str(src), dest]).returncode == 0
    assert ssh(lab, ["pct", "exec", vmid, "--", "stat", "-c", "%a", dest]).stdout == b"600\n"
    back = tmp_path / "back new.bin"
    p = ssh(lab, ["pct", "pull", vmid, dest, str(back), "--perms", "0604"])
    assert p.returncode == 0, p.stderr
    assert back.read_bytes() == data
    assert (back.stat().st_mode & 0o777) == 0o604
    ssh(lab, ["pct", "exec", vmid, "--", "rm", "-f", dest])


def test_push_new_file_gets_default_mode_and_owner(lab, tmp_path):
    vmid = str(lab.vmid)
    src = tmp_path / "x"
    src.write_bytes(b"hello\n")
    dest = "/tmp/dfo-lab-push-default"
    ssh(lab, ["pct", "exec", vmid, "--", "rm", "-f", dest])
    assert ssh(lab, ["pct", "push", vmid, str(src), dest, "--user", "nobody", "--group", "0"]).returncode == 0
    out = ssh(lab, ["pct", "exec", vmid, "--", "stat", "-c", "%a %U %g", dest]).stdout.decode().split()
    assert out == ["644", "nobody", "0"]
    ssh(lab, ["pct", "exec", vmid, "--", "rm", "-f", dest])


def test_push_pull_errors(lab, tmp_path):
    vmid = str(lab.vmid)
    p = ssh(lab, ["pct", "push", vmid, str(tmp_path / "missing"), "/tmp/x"])
    assert p.returncode != 0 and b"failed to open" in p.stderr
    p = ssh(lab, ["pct", "pull", vmid, "/nonexistent/file", str(tmp_path / "y")])
    assert p.returncode != 0 and b"failed to open /nonexistent/file" in p.stderr
    p = ssh(lab, ["pct", "push", vmid, "/etc/hostname", "/tmp/x", "--perms", "9z"])
    assert p.returncode == 255 and b"invalid mode" in p.stderr
