"""`dfo deploy --force` into a dfo root on a read-only filesystem (a real tmpfs remounted
read-only), on the local transport: one line naming the lock it cannot write and why (exit
7), not a deploy that holds the lock (there is none)."""

from __future__ import annotations

import subprocess

from orchestrator.cli import main
from tests.helpers.tmpfs import tmpfs  # noqa: F401


def test_deploy_into_a_read_only_root_says_so(tmp_path, tmpfs, capsys):  # noqa: F811
    fs = tmpfs(12 << 30)          # room enough for the free-space check; nothing is written
    root = fs / "root"
    (root / "locks").mkdir(parents=True)
    (root / "locks" / "deploy.lock").touch()
    subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True, timeout=60)
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"default: local\nhosts:\n  local:\n    transport: local\n"
                     f"    root: {root}\n    profile: cpu\n")
    capsys.readouterr()
    rc = main(["--hosts", str(hosts), "deploy", "--force"])
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("dfo: error:")]
    assert rc == 7 and len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith(f"dfo: error: cannot write {root}/locks/deploy.lock on local: "
                                "Read-only file system ("), errors[0]
    assert "holds" not in err
