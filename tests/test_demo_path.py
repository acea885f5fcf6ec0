"""The README's commands as typed in a new shell after ``bash scripts/demo.sh``: the script
links this checkout's dfo onto PATH (``/usr/local/bin/dfo`` as root), so ``dfo ...`` is
found in a fresh login shell in a real terminal (tmux, 80 columns).

The script runs in a mount namespace of its own whose ``/usr/local/bin`` is a bind mount of
a temporary directory: the link it makes is real, in the directory a root shell's PATH
names, yet no other process on this machine sees it. ``--host nosuch`` ends the demo right
after the link is made (exit 2, an unknown host), so no env is deployed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    """The lines of the README's first code block that start with ``dfo``."""
    text = (REPO / "README.md").read_text()
    block = text.split("```\n", 2)[1]
    return [ln.split("#")[0].strip() for ln in block.splitlines() if ln.startswith("dfo ")]


def _rc(screen: str, tag: str) -> int:
    return int(re.findall(rf"^{tag}=(\d+)", screen, re.M)[-1])


class NsTmux:
    """A tmux server started inside a private mount namespace in which ``/usr/local/bin``
    is ``bindir``; each window is a fresh login shell (``env -i``, ``bash -l``)."""

    def __init__(self, bindir: Path, home: Path):
        self.sock = f"dfo-test-{uuid.uuid4().hex[:8]}"
        self.home = home
        shell = (f"env -i HOME={home} TERM=xterm-256color LANG=C.UTF-8 "
                 "PS1=ready\\$' ' bash --norc -l")
        inner = (f"mount --bind {bindir} /usr/local/bin && exec tmux -L {self.sock} "
                 f"-f /dev/null new-session -d -s t -x 80 -y 40 \"{shell}\"")
        subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", inner],
                       check=True, timeout=60)
        self.window = "t:0"
        self.shell = shell

    def _tmux(self, *args) -> str:
        return subprocess.run(["tmux", "-L", self.sock, *args], check=True,
                              capture_output=True, text=True, timeout=30).stdout

    def new_shell(self) -> None:
        out = self._tmux("new-window", "-P", "-F", "#{window_index}", "-t", "t", self.shell)
        self.window = f"t:{out.strip()}"

    def type(self, line: str) -> None:
        self._tmux("send-keys", "-t", self.window, "-l", line)
        self._tmux("send-keys", "-t", self.window, "Enter")

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-J", "-t", self.window)

    def run(self, line: str, tag: str, timeout: float = 120) -> tuple[int, str]:
        """Type ``line``, then ``echo TAG=$?``; (its exit status, the screen)."""
        self.type(f"clear; {line}; echo {tag}=$?")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.screen()
            if re.search(rf"^{tag}=\d+", s, re.M):
                return _rc(s, tag), s
            time.sleep(0.2)
        raise AssertionError(f"no {tag}= line within {timeout}s:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.sock, "kill-server"], capture_output=True, timeout=30)


@pytest.fixture
def ns_tmux(tmp_path):
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("tmux"):
        if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on"):
            pytest.fail("needs root, unshare and tmux", pytrace=False)
        pytest.skip("needs root, unshare and tmux")
    if not (REPO / ".venv" / "bin" / "dfo").exists():
        pytest.skip(f"no {REPO}/.venv/bin/dfo (scripts/test.sh makes it)")
    bindir, home = tmp_path / "usr-local-bin", tmp_path / "home"
    bindir.mkdir()
    home.mkdir()
    t = NsTmux(bindir, home)
    yield t, bindir
    t.close()


def test_after_the_demo_script_the_readme_commands_are_found_in_a_new_shell(ns_tmux):
    t, bindir = ns_tmux
    rc, s = t.run("dfo --help >/dev/null", "before")
    assert rc == 127, s                                      # nothing named dfo before
    rc, s = t.run(f"cd {REPO} && bash scripts/demo.sh --host nosuch", "demo")
    assert rc == 2 and f"== dfo linked at /usr/local/bin/dfo (-> {REPO}/.venv/bin/dfo)" in s, s
    assert "is not on PATH" not in s
    assert os.readlink(bindir / "dfo") == f"{REPO}/.venv/bin/dfo"

    t.new_shell()
    cmds = _readme_commands()
    assert cmds and all(c.startswith("dfo ") for c in cmds)
    rc, s = t.run("cd; type -P dfo", "where")
    assert rc == 0 and "/usr/local/bin/dfo" in s, s
    # the block's commands as typed: each finds dfo and answers as dfo (not `command not
    # found`); `--help` after the command keeps them from acting on a host
    for i, c in enumerate(cmds):
        words = c.split()
        rc, s = t.run(f"{words[0]} {words[1]} --help >/dev/null", f"cmd{i}")
        assert rc == 0 and "command not found" not in s, (c, s)
    rc, s = t.run("dfo hosts list --json | grep -c '\"name\": \"local\"'", "hosts")
    assert rc == 0 and re.search(r"^1\nhosts=0$", s, re.M), s


def test_the_demos_next_steps_name_dfo_as_a_new_shell_finds_it(monkeypatch, tmp_path):
    import sys

    from orchestrator.cli.demo import next_commands

    own = os.path.join(sys.prefix, "bin", "dfo")
    if not os.path.exists(own):
        pytest.skip(f"no dfo in {sys.prefix}/bin")
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")          # dfo not on PATH
    assert all(cmd.startswith(f"{own} ") for cmd, _ in next_commands("local"))
    os.symlink(own, tmp_path / "dfo")                              # the demo's link
    assert all(cmd.startswith("dfo ") for cmd, _ in next_commands("local"))
