"""Where a deploy's packages come from (pure): uv's source arguments from the profile, the
host, `--find-links` and the find-links variables; the sources and an unserved pin in
words; the shipped CPU profiles' sources."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.config.inventory import HostConfig
from orchestrator.config.profiles import Sources, load_profile
from orchestrator.engine.deploy import Deployer
from orchestrator.common.errors import ConfigError
from orchestrator.plan.uv import describe_sources, translate_uv_error, unserved_package
from orchestrator.transport import LocalTransport

PYPI = "https://pypi.org/simple"
TORCH_CPU = "https://download.pytorch.org/whl/cpu"


def args(tmp_path, sources: Sources, *, env=None, find_links=(), wheelhouse=None) -> list[str]:
    prof = replace(load_profile("cpu"), sources=sources)
    host = HostConfig(name="local", transport="local", root=str(tmp_path), wheelhouse=wheelhouse)
    d = Deployer(LocalTransport("local"), host, profile=prof, environ=env or {},
                 find_links=find_links)
    return d.runner.source_args()


def test_extra_indexes_are_asked_only_without_find_links(tmp_path):
    s = Sources(index_url=PYPI, extra_index_urls=(TORCH_CPU,))
    assert args(tmp_path, s) == ["--index-url", PYPI, "--extra-index-url", TORCH_CPU]
    assert args(tmp_path, s, find_links=("/w",)) == ["--find-links", "/w", "--index-url", PYPI]


def test_find_links_order_and_the_variables(tmp_path):
    s = Sources(index_url=PYPI, find_links=("/p",))
    env = {"PIP_FIND_LINKS": "/e /p"}
    assert args(tmp_path, s, env=env, find_links=("/cli",)) == [
        "--find-links", "/p", "--find-links", "/cli", "--find-links", "/e", "--index-url", PYPI]
    # a profile that resolves from its index alone ignores the variables, not --find-links
    alone = replace(s, env_find_links=False)
    assert args(tmp_path, alone, env=env, find_links=("/cli",)) == [
        "--find-links", "/p", "--find-links", "/cli", "--index-url", PYPI]


def test_a_wheelhouse_means_offline(tmp_path):
    s = Sources(index_url=PYPI, extra_index_urls=(TORCH_CPU,))
    assert args(tmp_path, s, wheelhouse="/wh") == ["--find-links", "/wh", "--no-index", "--offline"]


def test_sources_in_words():
    assert describe_sources(["--find-links", "/w", "--index-url", PYPI + "/"]) == "find-links /w, PyPI"
    assert describe_sources(["--index-url", "https://i", "--extra-index-url", TORCH_CPU]) == \
        f"index https://i, index {TORCH_CPU}"
    assert describe_sources(["--find-links", "/wh", "--no-index", "--offline"]) == \
        "find-links /wh, no index"
    assert describe_sources([]) == "uv's defaults"


UNSAT = ("Using Python 3.11.7 environment at: /r/envs/cpu-1855acefae46\n"
         "error: No solution found when resolving dependencies\n"
         "  cause: Because there is no version of torch==2.13.0+cpu and you require "
         "torch==2.13.0+cpu, we can conclude that your requirements are unsatisfiable.\n")


def test_an_unserved_pin_names_the_pin_the_sources_and_the_fixes():
    assert unserved_package(UNSAT) == "torch==2.13.0+cpu"
    assert unserved_package("error: something else\n") is None
    e = translate_uv_error(UNSAT, host="gpu1", root="/r", what="installing the lock",
                           sources="PyPI", unserved_hint="or use profile X")
    msg = str(e)
    assert msg.startswith("torch==2.13.0+cpu is not served by the package sources on gpu1 (PyPI)")
    assert "`wheelhouse:`" in msg and "--find-links DIR|URL" in msg and "or use profile X" in msg
    assert "\n" not in msg and e.exit_code == 7


def test_the_shipped_cpu_profiles():
    cpu, pypi = load_profile("cpu"), load_profile("cpu-pypi")
    assert cpu.sources.index_url == PYPI and cpu.sources.env_find_links
    assert "https://download.pytorch.org/whl/cpu/torch/" in cpu.sources.unserved_hint
    assert "cpu-pypi" in cpu.sources.unserved_hint
    # the README's main job: PyPI alone, the machine's find-links variables left out
    assert pypi.sources == Sources(index_url=PYPI, env_find_links=False)
    assert pypi.expect["torch"] == "2.13.0+cu130"
    lock = pypi.lock_file.read_text()
    assert "\ntorch==2.13.0 \\\n" in lock and "+cpu" not in lock


def test_an_unknown_sources_key_is_named(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    (d / "profile.yaml").write_text('name: p\npython: "3.11"\nsources: {index_ur: x}\n')
    (d / "requirements.lock").write_text("")
    with pytest.raises(ConfigError, match="sources: unknown key 'index_ur'"):
        load_profile(str(d))


def test_the_embedded_default_and_the_checkouts_hosts_yaml_use_cpu_pypi():
    from orchestrator.config.inventory import load_inventory, parse_inventory, EMBEDDED_DEFAULT

    assert parse_inventory(EMBEDDED_DEFAULT, "<e>", path=None).get("local").profile == "cpu-pypi"
    repo = Path(__file__).resolve().parents[1]
    assert load_inventory(str(repo / "hosts.yaml")).get("local").profile == "cpu-pypi"
