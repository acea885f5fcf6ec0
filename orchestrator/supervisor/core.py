"""The supervisor: runs the trainer as attempts, watches them, classifies failures, applies
fallbacks, and keeps ``state.json`` and ``events.jsonl`` (see orchestrator.ops.runstate).

Decisions come from the pure modules (classify, fallback, budget); this module only does
the process work: start, watch (by reading the attempt log by byte offset, so a supervisor
restart never loses output), dump stacks, kill, wait.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from ..ops import runstate as rs
from ..ops.budget import BudgetPolicy, BudgetState, on_failure
from ..ops.classify import LineScan, TailScan, ThroughputMonitor, classify, parse_marker
from ..ops.fallback import next_config
from ..ops.launch_plan import attempt_env, ddp_nproc, trainer_argv
from . import procs


@dataclass
class Outcome:
    exit_code: int | None = None
    signal: int | None = None
    hang: str | None = None
    collapse: str | None = None
    stopped: bool = False
    reached_train: bool = False
    healthy_s: float = 0.0
    duration_s: float = 0.0
    oom_killed: bool = False
    scan: LineScan = field(default_factory=TailScan)
    stacks: list[str] = field(default_factory=list)


class Supervisor:
    def __init__(self, run_dir: str):
        self.run_dir = os.path.abspath(run_dir)
        self.spec: dict[str, Any] = rs.read_json(self._p(rs.SPEC_FILE))
        self.t: dict[str, float] = self.spec["thresholds"]
        self.policy = BudgetPolicy.from_json(self.spec.get("budget"))
        self.stop_reason: str | None = None
        self.state: dict[str, Any] = {}
        self.lock_fd: int | None = None

    # --- files ------------------------------------------------------------------------------
    def _p(self, *parts: str) -> str:
        return os.path.join(self.run_dir, *parts)

    def save(self) -> None:
        self.state["updated_at"] = time.time()
        rs.write_json_atomic(self._p(rs.STATE_FILE), self.state)

    def emit(self, kind: str, **fields: Any) -> dict:
        rec = rs.event(kind, **fields)
        rs.append_event(self._p(rs.EVENTS_FILE), rec)
        self.state["last_event"] = rs.describe_event(rec)
        print(f"dfo-supervisor: {self.state['last_event']}", flush=True)
        return rec

    # --- signals ----------------------------------------------------------------------------
    def _on_term(self, signum, _frame) -> None:
        if self.stop_reason is None:
            self.stop_reason = f"{signal.Signals(signum).name} to the supervisor (dfo stop)"

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while self.stop_reason is None and time.monotonic() < end:
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))

    # --- lock -------------------------------------------------------------------------------
    def _take_lock(self) -> str | None:
        path = self.spec["lock"]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
            os.close(fd)
            return owner or "another run"
        os.ftruncate(fd, 0)
        os.pwrite(fd, (self.spec["run_id"] + "\n").encode(), 0)
        self.lock_fd = fd
        return None

    # --- main ---------------------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        resumed = os.path.exists(self._p(rs.STATE_FILE))
        if resumed:
            self.state = rs.read_json(self._p(rs.STATE_FILE))
            if self.state.get("status") in rs.FINAL:
                return 0
        else:
            self.state = rs.new_state(self.spec["run_id"], self.spec["run_name"], now=time.time())
            self.state["overrides"] = dict(self.spec.get("overrides") or {})
        owner = self._take_lock()
        if owner is not None:
            self._final("failed", f"run.lock is held by {owner}: another run is live on this host")
            return 0
        self.state.update(pid=os.getpid(), mode="systemd" if os.environ.get("INVOCATION_ID") else "setsid")
        self.emit("supervisor_start", pid=os.getpid(), mode=self.state["mode"], resumed=resumed)
        if resumed:
            was = self.state.get("status")
            self._recover_after_restart()
            if was == "stopping":  # it died while stopping: finish the stop, start nothing
                return self._final("stopped", "stopped (the supervisor died while stopping)")
        self.state["status"] = "running"
        self.save()
        try:
            return self._loop()
        finally:
            if self.lock_fd is not None:
                os.close(self.lock_fd)

    def _recover_after_restart(self) -> None:
        """A previous supervisor died: no trainer of this run may run unwatched."""
        orphans = procs.processes_of_run(self.run_dir)
        if orphans:
            procs.signal_all(orphans, signal.SIGTERM)
            if not procs.wait_gone(orphans, self.t["kill_grace_s"]):
                procs.signal_all(orphans, signal.SIGKILL)
                procs.wait_gone(orphans, 5)
            self.emit("orphans_reaped", pids=orphans)
        att = self.state["attempts"][-1] if self.state["attempts"] else None
        if att and att.get("ended_at") is None:
            att.update(ended_at=time.time(), cls="crash",
                       reason="the supervisor died during this attempt")
            self.emit("attempt_end", attempt=att["n"], exit_code=None, signal=None,
                      duration_s=att["ended_at"] - att["started_at"],
                      note="supervisor died; attempt abandoned")
        self.save()

    def _loop(self) -> int:
        restore_cache = False
        while True:
            if self.stop_reason:
                return self._final("stopped", self.stop_reason)
            n = int(self.state["attempt"]) + 1
            if restore_cache:
                self._restore_cache(n)
            out = self._run_attempt(n)
            if out.stopped:
                return self._final("stopped", self.stop_reason or "stopped")
            diag = classify(out.scan, exit_code=out.exit_code, signal=out.signal, hang=out.hang,
                            oom_killed=out.oom_killed, collapse=out.collapse)
            att = self.state["attempts"][-1]
            att.update(cls=diag.cls, reason=diag.reason)
            self.emit("classified", attempt=n, **{"class": diag.cls}, reason=diag.reason,
                      evidence=[e.to_json() for e in diag.evidence], also=list(diag.also))
            if diag.cls == "done":
                return self._final("done", f"reached max_steps at step {self.state['last_step']}")
            if out.stopped or self.stop_reason:
                return self._final("stopped", self.stop_reason or "stopped")
            bstate = BudgetState.from_json(self.state.get("budget"))
            prev_start_fail = self.state.get("last_startup_failure_overrides")
            dec = on_failure(self.policy, bstate, diag.cls, healthy_s=out.healthy_s,
                             startup=not out.reached_train, permanent=diag.permanent,
                             same_config_as_last_startup_failure=(
                                 prev_start_fail == self.state["overrides"]))
            self.state["budget"] = bstate.to_json()
            self.state["last_startup_failure_overrides"] = (
                dict(self.state["overrides"]) if not out.reached_train else None)
            ev = [e.to_json() for e in diag.evidence]
            if not dec.restart:
                self.emit("give_up", **{"class": diag.cls}, reason=dec.reason, evidence=ev)
                return self._final("failed", f"{diag.cls} ({diag.reason}): {dec.reason}",
                                   evidence=ev)
            ladder = list((self.spec.get("ladders") or {}).get(diag.cls, []))
            pos = int(self.state["ladder_pos"].get(diag.cls, 0))
            base = dict(self.spec.get("base_config") or {})
            choice = next_config(diag.cls, ladder, pos, base, dict(self.state["overrides"]))
            if choice.exhausted:
                reason = f"{diag.cls}: fallback ladder spent ({' -> '.join(ladder) or 'empty'})"
                self.emit("give_up", **{"class": diag.cls}, reason=reason, evidence=ev)
                return self._final("failed", reason, evidence=ev)
            self.state["ladder_pos"][diag.cls] = choice.position
            self.state["overrides"] = choice.overrides
            if choice.step and choice.step != "same":
                self.state["fallbacks"].append({"class": diag.cls, "step": choice.step,
                                                "changed": choice.changed, "attempt": n})
            self.emit("fallback", attempt=n, **{"class": diag.cls}, step=choice.step,
                      changed=choice.changed, overrides=choice.overrides,
                      restore_cache=choice.restore_cache)
            restore_cache = choice.restore_cache
            self.state["status"] = "backoff"
            self.emit("restart", attempt=n + 1, delay_s=round(dec.delay, 3), reason=dec.reason)
            self.save()
            self._sleep(dec.delay)
            self.state["status"] = "running"
            self.save()

    def _final(self, status: str, reason: str, evidence: list | None = None) -> int:
        self.state.update(status=status, reason=reason, ended_at=time.time())
        if evidence is not None:
            self.state["evidence"] = evidence
        self.emit("final", status=status, reason=reason,
                  last_checkpoint=self.state.get("last_checkpoint"))
        self.save()
        return 0

    # --- one attempt ------------------------------------------------------------------------
    def _resume_target(self) -> str | None:
        """Once this run has saved a checkpoint: the newest one whose manifest verifies
        (torn/corrupt ones are skipped and reported). Before that: the checkpoint launch was
        given (--resume), else None (from scratch)."""
        ck = self.spec["checkpoint_dir"]
        if not self.state.get("last_checkpoint"):
            return self.spec.get("resume")  # this run saved nothing yet: what launch was given
        try:
            from dfo_contract.checkpoints import newest_valid
        except ImportError:
            best = _newest_valid_fallback(ck)
        else:
            info, skipped = newest_valid(ck)
            for c in skipped:
                self.emit("watchdog", attempt=self.state["attempt"] + 1,
                          reason=f"skipping checkpoint {c.name}: {c.reason}")
            best = info.path if info else None
        return best or self.spec.get("resume")

    def _config(self) -> dict:
        return {**(self.spec.get("base_config") or {}), **self.state["overrides"]}

    def _run_attempt(self, n: int) -> Outcome:
        cfg = self._config()
        resume = self._resume_target()
        layout = cfg.get("parallel.layout")
        argv = trainer_argv(self.spec["python"], self.spec["config_path"], self.state["overrides"],
                            run_dir=self.run_dir, checkpoint_dir=self.spec["checkpoint_dir"],
                            resume=resume, layout=layout, nproc=ddp_nproc(cfg))
        env = dict(os.environ)
        env.update(attempt_env(self.spec.get("env") or {}, attempt=n, run_dir=self.run_dir,
                               fault=self.spec.get("fault")))
        log_name = rs.attempt_log_name(n)
        log_path = self._p(log_name)
        self.state["attempt"] = n
        att = {"n": n, "started_at": time.time(), "ended_at": None, "resume": resume,
               "overrides": dict(self.state["overrides"]), "argv": argv, "log": log_name,
               "exit_code": None, "signal": None, "cls": None, "reason": None}
        self.state["attempts"].append(att)
        self.state["last_step"] = self.state.get("last_step")
        oom_before = procs.cgroup_oom_kills()
        with open(log_path, "ab") as logf:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                    env=env, cwd=self.run_dir, start_new_session=True,
                                    preexec_fn=procs.set_pdeathsig)
        att["pid"] = proc.pid
        self.state["trainer_pids"] = [proc.pid]
        self.emit("attempt_start", attempt=n, resume=resume, overrides=att["overrides"],
                  argv=argv, pid=proc.pid, log=log_name)
        self.save()
        out = self._watch(n, proc, log_path)
        oom_after = procs.cgroup_oom_kills()
        out.oom_killed = (oom_before is not None and oom_after is not None
                          and oom_after > oom_before and out.signal == signal.SIGKILL)
        att.update(ended_at=time.time(), exit_code=out.exit_code, signal=out.signal)
        self.state["trainer_pids"] = []
        self.emit("attempt_end", attempt=n, exit_code=out.exit_code, signal=out.signal,
                  duration_s=round(out.duration_s, 3), reached_train=out.reached_train)
        self.save()
        return out

    def _watch(self, n: int, proc: subprocess.Popen, log_path: str) -> Outcome:
        t0 = time.monotonic()
        out = Outcome()
        mon = ThroughputMonitor(fraction=self.t["collapse_fraction"],
                                steps=int(self.t["collapse_steps"]),
                                baseline_steps=int(self.t["baseline_steps"]),
                                skip_steps=int(self.t["skip_steps"]))
        base = self.state.get("baseline_tokens_per_s")
        if base and self.state.get("baseline_overrides") == self.state["overrides"]:
            mon.baseline = float(base)
        offset, pending = 0, b""
        last_progress = time.monotonic()
        first_step_at: float | None = None
        kill_at: float | None = None       # when to escalate to SIGKILL
        term_at: float | None = None       # when to send SIGTERM (a fatal line was printed)
        attention = str(self._config().get("model.attention", ""))
        dense_expected = attention == "flex-eager"   # uncompiled flex on purpose
        poll = float(self.t.get("poll_s", 0.2))
        exited = False
        while True:
            # 1. new output (once more after the process exited: its last lines)
            rc = proc.poll()
            exited = rc is not None
            try:
                with open(log_path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except OSError:
                chunk = b""
            if chunk:
                offset += len(chunk)
                data = pending + chunk
                *lines, pending = data.split(b"\n")
                for raw in lines:
                    text = raw.decode("utf-8", "replace")
                    rule = out.scan.feed(text)
                    rec = parse_marker(text)
                    if rec is not None:
                        last_progress = time.monotonic()
                        kind = rec.get("kind")
                        if kind == "step":
                            if first_step_at is None:
                                first_step_at = time.monotonic()
                            out.reached_train = True
                            self.state["last_step"] = rec.get("step")
                            tps = rec.get("tokens_per_s")
                            self.state["tokens_per_s"] = tps
                            why = mon.observe(tps)
                            if mon.baseline and not self.state.get("baseline_tokens_per_s"):
                                self.state["baseline_tokens_per_s"] = mon.baseline
                                self.state["baseline_overrides"] = dict(self.state["overrides"])
                            if why and out.collapse is None and term_at is None:
                                out.collapse = why
                                self.emit("watchdog", attempt=n, reason=f"throughput collapse: {why}")
                                term_at = time.monotonic()
                            self.save()
                        elif kind == "checkpoint":
                            self.state["last_checkpoint"] = {"step": rec.get("step"),
                                                             "path": rec.get("path")}
                            self.emit("checkpoint", attempt=n, step=rec.get("step"),
                                      path=rec.get("path"))
                            self.save()
                    if rule is not None and rule.live and term_at is None and kill_at is None:
                        if rule.cls == "dense_fallback" and dense_expected:
                            continue
                        grace = 0.0 if rule.cls == "dense_fallback" else self.t["live_grace_s"]
                        self.emit("watchdog", attempt=n,
                                  reason=f"{rule.cls} seen in the output ({rule.name})")
                        term_at = time.monotonic() + grace
            # 2. exited?
            if exited:
                if pending:
                    out.scan.feed(pending.decode("utf-8", "replace"))
                out.exit_code = rc if rc >= 0 else None
                out.signal = -rc if rc < 0 else None
                break
            now = time.monotonic()
            # 3. stop requested
            if self.stop_reason and not out.stopped:
                out.stopped = True
                self.state["status"] = "stopping"
                self.emit("stopping", attempt=n, reason=self.stop_reason)
                self.save()
                procs.signal_all([proc.pid], signal.SIGTERM)
                kill_at = now + self.t["stop_timeout_s"]
            # 4. a fatal line or a collapse: ask it to stop (it checkpoints), then kill
            if term_at is not None and now >= term_at and kill_at is None:
                procs.signal_all([proc.pid], signal.SIGTERM)
                kill_at = now + (self.t["stop_timeout_s"] if out.collapse or
                                 "dense_fallback" in out.scan.hits else self.t["kill_grace_s"])
            # 5. watchdog: no heartbeat/step within the threshold
            limit = self.t["train_s"] if out.reached_train else self.t["warmup_s"]
            if kill_at is None and term_at is None and now - last_progress > limit:
                phase = "training" if out.reached_train else "warm-up/compile"
                out.hang = f"{now - last_progress:.0f}s without progress during {phase} " \
                           f"(threshold {limit:g}s)"
                self.emit("watchdog", attempt=n, reason=out.hang)
                out.stacks = self._dump_stacks(n, proc.pid, log_path)
                self.emit("stacks", attempt=n, files=out.stacks)
                procs.kill_tree(proc.pid, self.run_dir, sig=signal.SIGKILL)
                kill_at = now
            # 6. escalate
            if kill_at is not None and now >= kill_at:
                procs.kill_tree(proc.pid, self.run_dir, sig=signal.SIGKILL)
                kill_at = now + 2.0
            time.sleep(poll)
        # the tree: nothing of this attempt may outlive it
        left = procs.processes_of_run(self.run_dir)
        if left:
            procs.signal_all(left, signal.SIGKILL)
            procs.wait_gone(left, 5)
        end = time.monotonic()
        out.duration_s = end - t0
        if first_step_at is not None and out.collapse is None:
            out.healthy_s = end - first_step_at
        return out

    def _dump_stacks(self, n: int, pid: int, log_path: str) -> list[str]:
        """Keep the hung attempt's stacks in stacks/: py-spy if present, else the trainer's
        faulthandler (SIGUSR1), plus each thread's kernel wait channel."""
        d = self._p(rs.STACKS_DIR)
        os.makedirs(d, exist_ok=True)
        files = []
        pids = procs.descendants(pid) or [pid]
        spy = procs.py_spy([os.path.dirname(self.spec["python"])])
        for p in pids:
            name = f"attempt-{n}-pid-{p}"
            text = procs.py_spy_dump(spy, p) if spy else None
            how = "py-spy"
            if not text and procs.catches(p, signal.SIGUSR1):
                before = os.path.getsize(log_path)
                os.kill(p, signal.SIGUSR1)
                time.sleep(1.5)
                with open(log_path, "rb") as f:
                    f.seek(before)
                    text = f.read().decode("utf-8", "replace")
                how = "faulthandler"
            k = procs.kernel_stacks(p)
            body = f"# {how if text else 'no python stacks (no py-spy, no SIGUSR1 handler)'}; " \
                   f"pid {p}: {' '.join(procs.cmdline(p))[:300]}\n{text or ''}\n# kernel\n{k}"
            path = os.path.join(d, name + ".txt")
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                f.write(body)
            os.replace(tmp, path)
            files.append(os.path.join(rs.STACKS_DIR, name + ".txt"))
        return files

    def _restore_cache(self, n: int) -> None:
        argv = self.spec.get("restore_cache_argv")
        if not argv:
            self.emit("cache_restore", attempt=n, ok=False,
                      detail="no cache to restore from; continuing with the run's cache as it is")
            return
        p = subprocess.run(argv, capture_output=True, text=True)
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] if p.returncode else []
        self.emit("cache_restore", attempt=n, ok=p.returncode == 0,
                  detail="the run's cache re-seeded from the host's live cache (empty if none)"
                  if p.returncode == 0 else f"restore failed: {' '.join(tail)}")


def _newest_valid_fallback(ck_dir: str) -> str | None:
    """Newest step_N with a manifest.json (used only if trainer.ckpt_manifest is missing)."""
    try:
        names = os.listdir(ck_dir)
    except OSError:
        return None
    best = None
    for nm in names:
        if nm.startswith("step_") and nm[5:].isdigit() and \
                os.path.exists(os.path.join(ck_dir, nm, "manifest.json")):
            if best is None or int(nm[5:]) > int(best[5:]):
                best = nm
    return os.path.join(ck_dir, best) if best else None


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m orchestrator.supervisor")
    ap.add_argument("--run-dir", required=True)
    a = ap.parse_args(argv)
    try:
        return Supervisor(a.run_dir).run()
    except FileNotFoundError as e:
        print(f"dfo-supervisor: {e}", file=sys.stderr)
        return 0  # nothing to supervise: never restart-loop on it
