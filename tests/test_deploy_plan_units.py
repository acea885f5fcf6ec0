"""Unit tests of deploy's pure parts, continued: the state parser and the plan, profile
loading, uv's errors (the lock, fingerprint and drift parts: ``test_deploy_units.py``)."""

from __future__ import annotations

import base64
import json
import shutil

import pytest

from dfo_contract.env_fingerprint import EnvFingerprint
from orchestrator.common.errors import ConfigError, DeployError, LockHeldError
from orchestrator.plan import deploy_plan as dp
from orchestrator.config.lockfile import parse_lock
from orchestrator.config.profiles import PROFILES_DIR, available, load_profile

H1 = "a" * 64
H2 = "b" * 64

# --------------------------------------------------------------------------- state + plan


def _b(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def _state(**kw) -> str:
    lines = {"arch": "x86_64", "uv": "uv 0.13.9 (x86_64-unknown-linux-gnu)", "current": "",
             "previous": "", "target": "absent", "python": "/usr/bin/python3.11", "df_kb": "9999999",
             "wheel": "present"}
    lines.update({k: v for k, v in kw.items() if not k.startswith("_")})
    out = [f"{k}\t{v}" for k, v in lines.items()]
    out += kw.get("_extra", [])
    return "\n".join(out + ["end\tok"]) + "\n"


WHEEL = "/root/dfo/wheels/abc/dfo-0.1.0-py3-none-any.whl"
TLOCK = parse_lock(f"torch==2.13.0+cpu --hash=sha256:{H1}\nnumpy==2.4.6 --hash=sha256:{H2}\n")
TARGET = f"cpu-{TLOCK.short_hash}"
GOOD_FREEZE = f"dfo @ file://{WHEEL}\nnumpy==2.4.6\ntorch==2.13.0+cpu\n"
FP = {"torch": "2.13.0+cpu", "torch_cuda": None, "python": "3.11.2"}
EXPECT = {"torch": "2.13.0+cpu", "torch_cuda": None, "python": "3.11"}


def _current_state(freeze=GOOD_FREEZE, fp=FP, lock_sha=TLOCK.sha256, uv="uv 0.13.9 (x)", **kw):
    extra = [f"current_marker\t{_b(json.dumps({'lock_hash': lock_sha}))}",
             f"current_fingerprint\t{_b(json.dumps(fp))}",
             f"current_freeze\t{_b(freeze)}", f"env\tcomplete {TARGET}"] + kw.pop("_extra", [])
    return dp.parse_state(_state(current=TARGET, target="complete", uv=uv, _extra=extra, **kw))


def _plan(state, force=False, local_uv="uv 0.13.9 (y)"):
    return dp.make_plan(state, target=TARGET, lock=TLOCK, expect=EXPECT, local_uv=local_uv,
                        wheel_remote=WHEEL, force=force)


def test_plan_noop_when_the_root_has_a_space():
    wheel = "/root/my dfo/wheels/abc/dfo-0.1.0-py3-none-any.whl"
    freeze = "dfo @ file:///root/my%20dfo/wheels/abc/dfo-0.1.0-py3-none-any.whl\nnumpy==2.4.6\ntorch==2.13.0+cpu\n"
    p = dp.make_plan(_current_state(freeze=freeze), target=TARGET, lock=TLOCK, expect=EXPECT,
                     local_uv="uv 0.13.9 (y)", wheel_remote=wheel)
    assert p.action == "noop", p.drift.lines() if p.drift else p


def test_parse_state():
    owner = _b('{"run_id": "r7"}')
    s = dp.parse_state(_state(_extra=["run_lock\theld", f"run_lock_owner\t{owner}",
                                      "env\tincomplete cpu-x", "env\tcomplete cpu-y",
                                      f"deploy_owner\t{_b('tok {}')}", "deploy_owner_age\t3"]))
    assert s.complete_output and s.uv_version.startswith("uv 0.13.9")
    assert s.envs == {"cpu-x": False, "cpu-y": True}
    assert s.run_lock_held and dp.describe_run_lock(s.run_lock_owner) == "run r7"
    assert s.deploy_owner == "tok {}" and s.deploy_owner_age == 3
    assert not dp.parse_state("arch\tx86_64\n").complete_output


def test_plan_noop_when_current_matches():
    p = _plan(_current_state())
    assert p.action == "noop" and [s.stage for s in p.steps if s.run] == ["connect"]


def test_plan_repairs_drift_in_a_new_generation():
    p = _plan(_current_state(freeze=GOOD_FREEZE.replace("numpy==2.4.6", "numpy==1.26.4") + "sglang==0.4\n"))
    assert p.action == "repair" and p.runs("install") and p.runs("verify")
    # envs/current is never changed in place: the repair is a new env beside it
    assert p.runs("switch") and p.runs("create venv")
    assert p.target == f"{TARGET}.2" and p.new_previous == TARGET and not p.reinstall
    assert p.drift.lines() == ["numpy: lock 2.4.6, installed 1.26.4", "+ sglang 0.4 (not in lock)"]


def test_plan_updates_dfo_only_when_wheel_changed():
    p = _plan(_current_state(freeze=GOOD_FREEZE.replace("/abc/", "/old/"), wheel="absent"))
    # a new env: the lock is synced into it (from uv's cache), then the new wheel
    assert p.action == "update" and p.sync and p.runs("push wheel") and p.runs("install")
    assert p.runs("create venv") and p.runs("switch") and p.target == f"{TARGET}.2"


def test_plan_reverifies_when_fingerprint_no_longer_matches():
    p = _plan(_current_state(fp={**FP, "torch_cuda": "13.0"}))
    assert p.action == "reverify" and p.runs("verify") and not p.runs("install")
    assert [str(m) for m in p.mismatches] == ["torch.version.cuda: expected none, got 13.0"]


def test_plan_force_reinstalls():
    p = _plan(_current_state(), force=True)
    assert p.action == "repair" and p.reinstall
    assert p.target == f"{TARGET}.2" and p.runs("create venv") and p.runs("switch")


def test_plan_creates_and_cleans_half_built_envs():
    s = dp.parse_state(_state(current="cpu-old", target="incomplete", uv="",
                              _extra=[f"env\tincomplete {TARGET}", "env\tcomplete cpu-old",
                                      "env\tincomplete cpu-zzz"]))
    p = _plan(s)
    assert p.action == "create" and p.clean == sorted([TARGET, "cpu-zzz"])
    assert [s.stage for s in p.steps if s.run] == list(dp.STAGES)[:2] + ["create venv", "install",
                                                                          "verify", "switch"]
    assert p.new_previous == "cpu-old"


def test_plan_push_uv_only_on_version_change():
    assert not _plan(dp.parse_state(_state(uv="uv 0.13.9 (a)", wheel="absent"))).runs("push uv")
    assert _plan(dp.parse_state(_state(uv="uv 0.12.0 (a)"))).runs("push uv")
    assert _plan(dp.parse_state(_state(uv=""))).runs("push uv")


def test_plan_reuses_complete_env_that_is_not_current():
    s = dp.parse_state(_state(current="cpu-other", target="complete",
                              _extra=[f"env\tcomplete {TARGET}", "env\tcomplete cpu-other"]))
    p = _plan(s)
    assert p.action == "reuse" and p.runs("switch") and not p.runs("create venv")
    assert p.new_previous == "cpu-other"


def test_env_generation_names():
    from orchestrator.config.host_tree import env_generation, generation_name

    assert env_generation(TARGET) == (TARGET, 1) and generation_name(TARGET, 1) == TARGET
    assert env_generation(f"{TARGET}.3") == (TARGET, 3) and generation_name(TARGET, 3) == f"{TARGET}.3"
    assert env_generation("cpu-x.2") == ("cpu-x.2", 1)        # not an env of a lock hash
    assert env_generation(f"{TARGET}.1") == (f"{TARGET}.1", 1)


def _gen_state(current: str, previous: str = "", envs: dict | None = None, **kw):
    """A state whose envs/current is ``current`` (a generation of TARGET, matching its lock)."""
    extra = [f"current_marker\t{_b(json.dumps({'lock_hash': TLOCK.sha256}))}",
             f"current_fingerprint\t{_b(json.dumps(FP))}", f"current_freeze\t{_b(kw.pop('freeze', GOOD_FREEZE))}"]
    extra += [f"env\t{'complete' if ok else 'incomplete'} {n}" for n, ok in (envs or {}).items()]
    return dp.parse_state(_state(current=current, previous=previous, target="absent",
                                 _extra=extra, **kw))


def test_plan_a_later_generation_is_current_and_matches():
    p = _plan(_gen_state(f"{TARGET}.2", TARGET, {TARGET: True, f"{TARGET}.2": True}))
    assert p.action == "noop" and p.target == f"{TARGET}.2" and not p.clean


def test_plan_repair_of_a_generation_retires_the_older_ones():
    s = _gen_state(f"{TARGET}.3", f"{TARGET}.2",
                   {TARGET: True, f"{TARGET}.2": True, f"{TARGET}.3": True, "cpu-other": True},
                   freeze=GOOD_FREEZE.replace("numpy==2.4.6", "numpy==1.26.4"))
    p = _plan(s)
    assert p.action == "repair" and p.target == f"{TARGET}.4" and p.new_previous == f"{TARGET}.3"
    # current and previous stay; older generations of the same env go; other envs are kept
    assert p.retire == sorted([TARGET, f"{TARGET}.2"])


def test_plan_after_an_interrupted_force_cleans_and_keeps_current():
    envs = {TARGET: True, f"{TARGET}.2": False}
    p = _plan(_gen_state(TARGET, "", envs))
    assert p.action == "noop" and p.clean == [f"{TARGET}.2"] and p.target == TARGET
    p = _plan(_gen_state(TARGET, "", envs), force=True)
    assert p.action == "repair" and p.clean == [f"{TARGET}.2"]
    assert p.target == f"{TARGET}.2" and p.new_previous == TARGET and p.retire == []


def test_plan_never_cleans_the_env_current_points_to():
    """A current env without its marker (cut short by a dfo that repaired in place) is not
    removed under envs/current: a new generation is built and switched to."""
    s = dp.parse_state(_state(current=TARGET, previous="cpu-old", target="incomplete",
                              _extra=[f"env\tincomplete {TARGET}", "env\tcomplete cpu-old",
                                      "env\tincomplete cpu-zzz"]))
    p = _plan(s)
    assert p.action == "create" and p.clean == ["cpu-zzz"]
    assert p.target == f"{TARGET}.2" and p.new_previous == "" and p.runs("switch")


def test_plan_reverify_stays_in_place():
    s = _gen_state(f"{TARGET}.2", TARGET, {TARGET: True, f"{TARGET}.2": True})
    s.current_fingerprint = EnvFingerprint.from_json({**FP, "torch_cuda": "13.0"})
    p = _plan(s)
    assert p.action == "reverify" and p.target == f"{TARGET}.2"
    assert not p.runs("create venv") and not p.runs("install") and not p.runs("switch")


def test_plan_reuse_prefers_the_previous_generation():
    s = dp.parse_state(_state(current="cpu-other", previous=f"{TARGET}.2", _extra=[
        f"env\tcomplete {TARGET}", f"env\tcomplete {TARGET}.2", "env\tcomplete cpu-other"]))
    p = _plan(s)
    assert p.action == "reuse" and p.target == f"{TARGET}.2" and p.new_previous == "cpu-other"
    assert p.retire == [TARGET]


def test_plan_another_lock_retires_older_generations_of_the_old_one():
    s = dp.parse_state(_state(current="cpu-aaaaaaaaaaaa.2", previous="cpu-aaaaaaaaaaaa", _extra=[
        "env\tcomplete cpu-aaaaaaaaaaaa", "env\tcomplete cpu-aaaaaaaaaaaa.2"]))
    p = _plan(s)
    assert p.action == "create" and p.target == TARGET
    assert p.new_previous == "cpu-aaaaaaaaaaaa.2" and p.retire == ["cpu-aaaaaaaaaaaa"]


def test_rollback_plan():
    s = dp.parse_state(_state(current="cpu-b", previous="cpu-a", _extra=["env\tcomplete cpu-a"]))
    p = dp.rollback_plan(s)
    assert p.target == "cpu-a" and p.new_previous == "cpu-b" and p.runs("verify")
    with pytest.raises(DeployError, match="no previous env"):
        dp.rollback_plan(dp.parse_state(_state(current="cpu-b")))
    with pytest.raises(DeployError, match="missing or incomplete"):
        dp.rollback_plan(dp.parse_state(_state(current="cpu-b", previous="cpu-a")))


def test_run_lock_error_names_the_run():
    e = dp.run_lock_error("lab", "/root/dfo", '{"run_id": "2026-05-18-a", "pid": 42}')
    assert isinstance(e, LockHeldError) and e.exit_code == 9
    assert str(e).startswith("run 2026-05-18-a (pid 42) holds /root/dfo/locks/run.lock on lab")
    assert dp.describe_run_lock("r-plain\n") == "run r-plain"
    # another writer's names for the id; a mistyped pid is left out, not a crash
    assert dp.describe_run_lock('{"run": "r-9", "pid": "7"}') == "run r-9"
    assert dp.describe_run_lock('{"id": "r-8"}') == "run r-8"
    assert dp.describe_run_lock('{"pid": 3}') == 'run {"pid": 3}'


def test_check_disk():
    assert dp.check_disk(100 * 1024, 1500, host="h", root="/r") == \
        "disk full on h: /r has 100 MB free, the env needs about 1500 MB"
    assert dp.check_disk(5000 * 1024, 1500, host="h", root="/r") is None


# --------------------------------------------------------------------------- profiles


def test_shipped_profiles():
    assert {"cpu", "gpu-cu128"} <= set(available())
    gpu = load_profile("gpu-cu128")
    assert gpu.python == "3.12" and gpu.expect["torch_cuda"] == "12.8"
    assert gpu.expect["torch_git"] == "70d99e998b4955e0049d13a98d77ae1b14db1f45"
    assert "https://download.pytorch.org/whl/cu128" in gpu.sources.extra_index_urls


def test_unknown_profile_did_you_mean():
    with pytest.raises(ConfigError, match=r"unknown profile 'cpux' \(did you mean cpu\?"):
        load_profile("cpux")


def test_profile_without_lock_says_how_to_make_one(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    (d / "profile.yaml").write_text('python: "3.12"\n')
    with pytest.raises(ConfigError, match="tools/make_lock.py"):
        load_profile(str(d)).load_lock()


@pytest.mark.parametrize("profile, pin, edited", [
    ("cpu", "numpy==2.4.6", "numpy==2.4.5"),
    ("gpu-cu130", "transformers==5.6.0", "transformers==5.17.0"),
])
def test_edited_lock_does_not_match_its_hash(tmp_path, profile, pin, edited):
    d = tmp_path / f"{profile}-edited"
    shutil.copytree(PROFILES_DIR / profile, d)
    lock = d / "requirements.lock"
    assert pin in lock.read_text()
    lock.write_text(lock.read_text().replace(pin, edited))
    with pytest.raises(ConfigError, match="does not match its hash"):
        load_profile(str(d)).load_lock()


def test_bad_expectation_key(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    (d / "profile.yaml").write_text('python: "3.12"\nexpect: {torch_cdua: "12.8"}\n')
    with pytest.raises(ConfigError, match="did you mean torch_cuda"):
        load_profile(str(d))


# --------------------------------------------------------------------------- uv errors

def test_uv_errors_become_one_line_deploy_errors():
    from orchestrator.engine.deploy import translate_uv_error

    mismatch = ("Resolved 1 package in 0.64ms\nerror: Failed to download `mdurl==0.1.2`\n"
                "  cause: Hash mismatch for `mdurl==0.1.2`\n\n         Expected:\n"
                f"           sha256:{'0' * 64}\n\n         Computed:\n"
                "           sha256:84008a41e51615a49fc9966191ff91509e3c40b939176e643fd50a5c2196b8f8\n")
    e = translate_uv_error(mismatch, host="lab", root="/r", what="installing the lock")
    assert str(e).startswith("mdurl==0.1.2: the file does not match the lock's sha256 "
                             "(hash mismatch): lock sha256 000000000000..., file 84008a41e516...")
    missing = ("error: No solution found when resolving dependencies\n  cause: Because annotated-doc "
               "was not found in the provided package locations and you require "
               "annotated-doc==0.0.7, we can conclude that your requirements are unsatisfiable.\n")
    e = translate_uv_error(missing, host="lab", root="/r", what="installing the lock")
    assert str(e).startswith("annotated-doc==0.0.7 is not available from the package sources on lab")
    e = translate_uv_error("error: failed to write: No space left on device (os error 28)\n",
                           host="lab", root="/r", what="installing the lock")
    assert str(e).startswith("disk full on lab while installing the lock")
    e = translate_uv_error("boom\nlast line\n", host="lab", root="/r", what="creating the venv")
    assert str(e).startswith("creating the venv failed on lab: last line")
    for err in (e,):
        assert "\n" not in str(err) and err.exit_code == 7
