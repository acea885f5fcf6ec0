"""dfo logs: following by byte offset, across attempts and across killed followers.

Uses the local transport and the real follower (``python -m orchestrator.supervisor.follow``);
a writer process appends to the files while we follow. A "drop" is a real SIGKILL of the
follower process in the middle of a stream, exactly what a dead SSH connection looks like
from this side: the stream ends without the end record.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.engine.logs import LogFollower
from orchestrator.plan.timespec import parse_since
from orchestrator.config.host_tree import HostTree
from orchestrator.transport.local import LocalTransport

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    (r / "envs").mkdir(parents=True)
    (r / "runs" / "w").mkdir(parents=True)
    os.symlink(os.path.dirname(os.path.dirname(sys.executable)), r / "envs" / "current")
    return r


def expected_lines(run_dir: Path, name: str) -> list[str]:
    data = (run_dir / name).read_bytes().decode("utf-8", "replace")
    assert data.endswith("\n")
    return data[:-1].split("\n")


class KillingTransport(LocalTransport):
    """The real local transport; its stream's process is SIGKILLed after ``kill_after``
    lines, ``times`` times (as if the SSH connection serving it died)."""

    def __init__(self, kill_after: int, times: int, release: Path | None = None):
        super().__init__("local")
        self.kill_after, self.times, self.kills = kill_after, times, 0
        self.release = release   # made after the last kill: the writer may end the run

    def stream(self, argv, on_line, **kw):
        seen = [0]
        follower_pid = []
        marker = argv[argv.index("--run-dir") + 1]

        def cb(line):
            seen[0] += 1
            on_line(line)
            if self.kills < self.times and seen[0] == self.kill_after:
                for p in os.listdir("/proc"):
                    if p.isdigit():
                        try:
                            cl = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
                        except OSError:
                            continue
                        if b"orchestrator.supervisor.follow" in cl and marker.encode() in cl:
                            follower_pid.append(int(p))
                for p in follower_pid:
                    os.kill(p, signal.SIGKILL)
                self.kills += 1
                if self.kills == self.times and self.release is not None:
                    self.release.touch()
        return super().stream(argv, cb, **kw)


def follow_while_writing(root: Path, transport, n=60, delay=0.002, hold: Path | None = None,
                         **kw):
    run_dir = root / "runs" / "w"
    got: list = []
    writer = subprocess.Popen([sys.executable, str(REPO / "tests" / "logs_writer.py"),
                               str(run_dir), str(n), str(delay),
                               *([str(hold)] if hold else [])], stdout=subprocess.PIPE)
    reconnects = []
    f = LogFollower(transport, HostTree(str(root)), "w", on_line=got.append, follow=True,
                    poll=0.05, sleep=lambda s: None,
                    on_reconnect=lambda k, why: reconnects.append(why), **kw)
    status = f.run()
    assert writer.wait(60) == 0
    return run_dir, got, status, reconnects


def by_file(got):
    out: dict[str, list[str]] = {}
    for ln in got:
        out.setdefault(ln.file, []).append(ln.text)
    return out


def test_follow_across_attempts_until_final(root):
    run_dir, got, status, reconnects = follow_while_writing(root, LocalTransport("local"))
    assert status == "done" and not reconnects
    files = by_file(got)
    for name in ("events.jsonl", "attempt-1.log", "attempt-2.log"):
        assert files[name] == expected_lines(run_dir, name), name
    assert got[-1].file == "events.jsonl" and got[-1].event.kind == "final"
    assert {ln.attempt for ln in got if ln.file.startswith("attempt")} == {1, 2}


def test_killed_follower_loses_and_repeats_nothing(root):
    # the run ends only after the third kill (the writer goes on writing until then), so
    # every kill lands on a live stream, however the machine schedules writer and follower
    hold = root / "release"
    t = KillingTransport(kill_after=10, times=3, release=hold)
    run_dir, got, status, reconnects = follow_while_writing(root, t, hold=hold)
    assert t.kills == 3 and len(reconnects) >= 3
    assert status == "done"
    files = by_file(got)
    for name in ("events.jsonl", "attempt-1.log", "attempt-2.log"):
        assert files[name] == expected_lines(run_dir, name), name
    offs = [ln.offset for ln in got if ln.file == "attempt-1.log"]
    assert offs == sorted(set(offs)) and offs[-1] == (run_dir / "attempt-1.log").stat().st_size


def test_not_following_stops_at_eof_and_attempt_filter(root):
    run_dir, _, _, _ = follow_while_writing(root, LocalTransport("local"), n=10, delay=0)
    got = []
    st = LogFollower(LocalTransport("local"), HostTree(str(root)), "w", on_line=got.append,
                     attempt=2).run()
    assert st == "done"
    assert [ln.text for ln in got] == expected_lines(run_dir, "attempt-2.log")


def test_unknown_run_is_a_clear_error(root):
    from orchestrator.common.errors import NotFoundError

    with pytest.raises(NotFoundError, match="no run directory"):
        LogFollower(LocalTransport("local"), HostTree(str(root)), "nope",
                    on_line=lambda ln: None).run()


def test_parse_since():
    assert parse_since("10m", 1000.0) == 400.0
    assert parse_since("1700000000", 0) == 1700000000.0
    from orchestrator.common.errors import ConfigError
    with pytest.raises(ConfigError):
        parse_since("yesterday", 0)


class DroppingTransport(LocalTransport):
    """The real local transport whose first stream fails as a dropped SSH connection does
    (the transport's own ConnectError, with its hint for a person)."""

    def __init__(self):
        super().__init__("local")
        self.drops = 0

    def stream(self, argv, on_line, **kw):
        if self.drops == 0:
            from orchestrator.common.errors import ConnectError

            self.drops += 1
            raise ConnectError("connection to local lost: EOF",
                               hint="check the host and run the command again")
        return super().stream(argv, on_line, **kw)


def test_a_reconnect_names_what_was_lost_not_the_errors_hint(root):
    _, _, status, reconnects = follow_while_writing(root, DroppingTransport(), n=10, delay=0)
    assert status == "done"
    assert reconnects == ["connection to local lost: EOF"]


# --------------------------------------------------------------------------- a live run whose
# files change under the follower: a process that is the run's supervisor by its command line
# (it waits on its stdin, which the test closes), state.json naming it

def _start(n: int):
    from dfo_contract import events as ev
    from dfo_contract import runstate as rs

    return ev.AttemptStart(attempt=n, resume=None, overrides={}, argv=["trainer"], pid=1,
                           log=rs.attempt_log_name(n))


@pytest.fixture
def live(root):
    from dfo_contract.procs import SUPERVISOR_MODULE
    from dfo_contract import runstate as rs
    from orchestrator.supervisor import runfiles

    run_dir = root / "runs" / "w"
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()",
                          SUPERVISOR_MODULE, str(run_dir)], stdin=subprocess.PIPE)
    st = rs.new_state("w", "w", now=1.0)
    st.update(status="running", pid=p.pid, attempt=1)
    runfiles.write_json_atomic(str(run_dir / rs.STATE_FILE), st)

    def end(status="done"):
        runfiles.write_json_atomic(str(run_dir / rs.STATE_FILE), dict(st, status=status))

    yield run_dir, end
    p.stdin.close()
    p.wait(60)


def _follow_in_thread(root, on_line):
    """LogFollower.run() -f in a thread; (its result or exception, whether it ended), the
    join bounded only as a guard against a hang."""
    import threading

    out: dict = {}

    def go():
        try:
            out["status"] = LogFollower(LocalTransport("local"), HostTree(str(root)), "w",
                                        on_line=on_line, follow=True, poll=0.05,
                                        sleep=lambda s: None, max_retries=0).run()
        except Exception as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    th = threading.Thread(target=go, daemon=True)
    th.start()
    th.join(120)
    return out, not th.is_alive()


def test_following_a_run_whose_directory_is_deleted_ends_in_one_line(root, live):
    import shutil

    from dfo_contract import events as ev
    from orchestrator.common.errors import NotFoundError
    from orchestrator.supervisor import runfiles

    run_dir, _ = live
    runfiles.append_event(str(run_dir / "events.jsonl"), _start(1))
    (run_dir / "attempt-1.log").write_text("training\n")
    assert isinstance(ev.read_events_file(str(run_dir / "events.jsonl"))[0], ev.AttemptStart)
    out, ended = _follow_in_thread(root, lambda ln: shutil.rmtree(run_dir, ignore_errors=True))
    assert ended, "logs -f went on following a deleted run directory"
    assert isinstance(out.get("error"), NotFoundError), out
    assert f"its run directory {run_dir} was deleted" in str(out["error"])


def test_an_events_file_that_shrank_is_read_again_from_its_start(root, live):
    from orchestrator.supervisor import runfiles

    run_dir, end = live
    evs = run_dir / "events.jsonl"
    for n in (1, 2, 3):
        runfiles.append_event(str(evs), _start(n))
    got = []

    def on_line(ln):
        got.append(ln)
        if len(got) == 3:                    # emptied under the live run, then one event
            evs.write_bytes(b"")
            runfiles.append_event(str(evs), _start(7))
            end()

    out, ended = _follow_in_thread(root, on_line)
    assert ended and out.get("status") == "done", out
    assert [ln.event.attempt for ln in got if ln.event is not None] == [1, 2, 3, 7]


def test_carriage_returns_end_lines_and_a_huge_line_is_cut(root, live):
    from orchestrator.supervisor.follow import MAX_LINE_CHARS

    run_dir, end = live
    (run_dir / "attempt-1.log").write_bytes(b"\r 10%\r 50%\r100%\r\nok\n" + b"y" * (10 << 20)
                                            + b"\nafter\n")
    end()
    got = []
    out, ended = _follow_in_thread(root, got.append)
    assert ended and out.get("status") == "done", out
    texts = [ln.text for ln in got if ln.file == "attempt-1.log"]
    assert texts[:4] == [" 10%", " 50%", "100%", "ok"] and texts[5] == "after", texts[:4]
    assert texts[4].startswith("y" * MAX_LINE_CHARS + " ... (")
    assert texts[4].endswith(f"({(10 << 20) - MAX_LINE_CHARS} more characters)")


def test_following_a_run_that_had_ended_shows_its_events_first(root, live):
    from orchestrator.supervisor import runfiles

    run_dir, end = live
    runfiles.append_event(str(run_dir / "events.jsonl"), _start(1))
    (run_dir / "attempt-1.log").write_text("a\nb\n")
    end()
    got = []
    out, ended = _follow_in_thread(root, got.append)
    assert ended and out.get("status") == "done", out
    assert [ln.file for ln in got] == ["events.jsonl", "attempt-1.log", "attempt-1.log"]
