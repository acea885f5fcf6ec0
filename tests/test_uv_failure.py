"""uv's failures in one line that names the cause: the pure classifier on outputs recorded
from the real uv (tests/fixtures/uv), and a real deploy whose python is a broken shim."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.common.errors import DeployError
from orchestrator.plan.uv import translate_uv_error
from orchestrator.plan.uv_failure import classify_uv_failure

FIX = Path(__file__).parent / "fixtures" / "uv"


def rec(name: str) -> str:
    return (FIX / name).read_text()


def one_line(e: DeployError) -> str:
    s = str(e)
    assert "\n" not in s
    return s


def translate(name: str) -> str:
    return one_line(translate_uv_error(rec(name), host="box", root="/r",
                                       what="creating the venv"))


def test_a_broken_pyenv_shim_is_named_with_what_it_said():
    f = classify_uv_failure(rec("pyenv_shim_not_found.txt"))
    assert f.kind == "interpreter_broken" and f.exit_code == 127
    assert f.interpreter == "/root/.pyenv/shims/python3.12"
    assert f.origin == "first executable in the search path"
    assert f.said == "pyenv: python3.12: command not found"
    msg = translate("pyenv_shim_not_found.txt")
    assert msg.startswith("creating the venv failed on box: the Python interpreter "
                          "/root/.pyenv/shims/python3.12 (first executable in the search path) "
                          "does not run (exit 127): pyenv: python3.12: command not found")
    assert "to be found at the same time" not in msg
    assert "hosts.yaml `python:`" in msg and "envs/current is untouched" in msg


@pytest.mark.parametrize("name, said, code", [
    ("pyenv_shim_path.txt", "pyenv: python3.12: command not found", 127),
    ("pyenv_version_missing.txt", "pyenv: version `3.99.1' is not installed (set by "
                                  "PYENV_VERSION environment variable)", 1),
    ("silent_interpreter.txt", "", 1),
])
def test_every_recorded_interpreter_failure_names_the_interpreter(name, said, code):
    f = classify_uv_failure(rec(name))
    assert f.kind == "interpreter_broken" and f.said == said and f.exit_code == code
    msg = translate(name)
    assert f"the Python interpreter {f.interpreter}" in msg and f"(exit {code})" in msg


def test_no_interpreter_and_other_failures_keep_the_cause_line():
    assert translate("no_interpreter.txt").startswith(
        "creating the venv failed on box: No interpreter found for Python 3.99 in managed "
        "installations or search path")
    f = classify_uv_failure(rec("unserved_pin.txt"))
    assert f.kind == "other" and f.cause.startswith("Because torch was not found")
    # the existing translations still come first: a package the sources lack
    assert "torch==9.9.9 is not available from the package sources on box" in \
        translate("unserved_pin.txt")
    assert classify_uv_failure("error: boom\n  cause: the real reason\ntrailing words\n").cause \
        == "the real reason"


def test_a_wrapped_query_line_still_names_the_interpreter():
    """uv wraps a long message; the path lands on the next line."""
    text = ("error: Failed to inspect Python interpreter from first executable in the search "
            "path at\n  `/tmp/a/very/long/path/shims/python3.12`\n  Caused by: Querying "
            "Python at\n  `/tmp/a/very/long/path/shims/python3.12` failed with exit status\n"
            "  exit status: 127\n\n[stderr]\npyenv: python3.12: command not found\n")
    f = classify_uv_failure(text)
    assert f.kind == "interpreter_broken" and f.exit_code == 127
    assert f.interpreter == "/tmp/a/very/long/path/shims/python3.12"


@pytest.mark.slow
def test_a_real_deploy_with_a_broken_shim_first_on_path(tmp_path, monkeypatch, project_wheel):
    from orchestrator.config.inventory import HostConfig
    from orchestrator.engine.deploy import Deployer
    from orchestrator.transport import LocalTransport

    shims = tmp_path / "shims"
    shims.mkdir()
    shim = shims / "python3.12"
    # what a pyenv shim does when no selected version has the command
    shim.write_text("#!/bin/sh\necho \"pyenv: python3.12: command not found\" >&2\n"
                    "echo >&2\necho \"Note: See 'pyenv help global' for tips on allowing "
                    "multiple\" >&2\necho \"      Python versions to be found at the same "
                    "time.\" >&2\nexit 127\n")
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{os.environ['PATH']}")
    host = HostConfig(name="box", transport="local", root=str(tmp_path / "root"),
                      python="3.12", wheelhouse=str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    d = Deployer(LocalTransport("box"), host, wheel=project_wheel, environ={})
    with pytest.raises(DeployError) as ei:
        d.deploy()
    msg = one_line(ei.value)
    assert f"the Python interpreter {shim}" in msg and "(exit 127)" in msg
    assert "pyenv: python3.12: command not found" in msg
    assert "to be found at the same time" not in msg
    assert not (tmp_path / "root" / "envs" / "current").exists()
