"""Argv rendering (orchestrator.transport.command): unit tests, plus a property test that runs
the rendered string through a real POSIX shell on this machine (what the remote login
shell does) and checks the argv arrives byte-for-byte and nothing is evaluated."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.transport import command as cmd

AWKWARD = ["fil () &&-@_e.txt", "$(touch /tmp/pwned)", "`id`", "a;b", "*", "~", "x\ny", "'\"",
           "A=1", "-n", "", " ", "ünï\u2603", "$HOME", "\\", "!", "#c", "a\tb", "%s", "--"]

#: the argv strategy: any unicode text but NUL (cannot be in argv) and lone surrogates
ARG = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)
ARGS = st.lists(st.one_of(ARG, st.sampled_from(AWKWARD)), max_size=6)

ECHO_ARGV = [sys.executable, "-c", "import sys,json;print(json.dumps(sys.argv[1:]))"]


def test_shell_join_splits_back():
    s = cmd.shell_join(["echo", *AWKWARD])
    assert shlex.split(s) == ["echo", *AWKWARD]


def test_assignment_word_is_quoted():
    assert cmd.shell_join(["A=1", "x"]) == "'A=1' x"
    assert cmd.quote("plain") == "plain"


def test_with_env_cwd_shape():
    assert cmd.with_env_cwd(["ls"]) == ["ls"]
    assert cmd.with_env_cwd(["ls", "-l"], {"A": "1 2"}, "/x y") == ["env", "-C", "/x y", "--", "A=1 2", "ls", "-l"]
    # argv[0] holding '=' would be taken by env for an assignment: exec it through sh "$@"
    assert cmd.with_env_cwd(["a=b"], {"K": "v"}) == ["env", "--", "K=v", "sh", "-c", 'exec "$@"', "sh", "a=b"]


@pytest.mark.parametrize("bad", [[], "ls -l", ["a\0b"], [1]])
def test_bad_argv_refused(bad):
    with pytest.raises((ValueError, TypeError)):
        cmd.check_argv(bad)


@pytest.mark.parametrize("bad", [{"1A": "x"}, {"A B": "x"}, {"A": "x\0"}])
def test_bad_env_refused(bad):
    with pytest.raises(ValueError):
        cmd.check_env(bad)


def test_pct_exec_clears_env_and_passes_argv_without_shell():
    argv = cmd.pct_exec(200, ["python3", "-c", "print(1)"], {"X": "$(id)"}, "/root")
    assert argv[:6] == ["pct", "exec", "200", "--keep-env", "0", "--"]
    assert argv[6:9] == ["env", "-C", "/root"]
    assert "X=$(id)" in argv and argv[-3:] == ["python3", "-c", "print(1)"]
    assert "PATH=" + cmd.CONTAINER_ENV["PATH"] in argv and "HOME=/root" in argv


def test_put_argv_is_constant_script_with_positional_values():
    argv = cmd.put_argv("/r/fil () &&-@_e.txt", 12, 0o755)
    assert argv[:3] == ["sh", "-c", cmd.PUT_SCRIPT]
    assert argv[3:] == ["sh", "/r/fil () &&-@_e.txt", "755", "12"]
    assert cmd.put_argv("/a", 0)[5] == ""


def _through_shell(argv: list[str], env=None, cwd=None) -> subprocess.CompletedProcess:
    """What sshd does with the string: ``$SHELL -c STRING``."""
    return subprocess.run(["bash", "-c", cmd.ssh_command(argv, env, cwd)], capture_output=True, timeout=30)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=ARGS)
def test_ssh_command_roundtrip_through_a_real_shell(args):
    p = _through_shell(ECHO_ARGV + args)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == args


def test_nothing_is_evaluated(tmp_path):
    marker = tmp_path / "pwned"
    args = [f"$(touch {marker})", f"`touch {marker}`", f"; touch {marker}", f"&& touch {marker}",
            f"| touch {marker}", f"\ntouch {marker}\n"]
    p = _through_shell(ECHO_ARGV + args, env={"E": f"$(touch {marker})"}, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == args
    assert not marker.exists()


def test_env_and_cwd_applied_without_a_shell(tmp_path):
    d = tmp_path / "fil () &&-@_e.txt"
    d.mkdir()
    code = "import os,json;print(json.dumps([os.getcwd(), os.environ['V1'], os.environ['V2']]))"
    p = _through_shell([sys.executable, "-c", code], env={"V1": "a b$(id)", "V2": "x=y"}, cwd=str(d))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [str(d), "a b$(id)", "x=y"]


def test_put_script_is_atomic_and_keeps_mode(tmp_path):
    dest = tmp_path / "sub dir" / "fil () &&-@_e.txt"
    data = b"\x00\x01binary\nline\xff" * 100
    p = subprocess.run(["bash", "-c", cmd.shell_join(cmd.put_argv(str(dest), len(data), 0o751))],
                       input=data, capture_output=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert dest.read_bytes() == data and (dest.stat().st_mode & 0o777) == 0o751
    # a short stream (a dropped connection) is never renamed into place
    p = subprocess.run(["bash", "-c", cmd.shell_join(cmd.put_argv(str(dest), len(data) + 5, 0o600))],
                       input=b"short", capture_output=True, timeout=30)
    assert p.returncode != 0 and b"not written" in p.stderr
    assert dest.read_bytes() == data
    assert sorted(x.name for x in dest.parent.iterdir()) == [dest.name]  # no temp file left
