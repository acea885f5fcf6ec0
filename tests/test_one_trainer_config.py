"""One typed TrainerConfig from the command line to spec.json: ``dfo launch --dry-run`` of the
bundled trainer on the local transport parses the run config once (a given file, or the
default: the shipped tiny CPU config with the demo's settings), applies ``--set`` once, and
the plan's spec.json carries that config (its flat values with the overrides) and the parts
the supervisor reads (layout, processes, dense-path expectation) computed from it. The
supervisor package looks up no trainer-config key by its name."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import yaml

from dfo_contract import trainer_config as tcfg
from dfo_contract.runspec import Bundled, RunSpec
from orchestrator.cli import main
from orchestrator.config.runconfig import default_config_path
from orchestrator.config.runconfig import demo_paths
from orchestrator.plan import launch_plan as lp
from orchestrator.plan.launch_steps import spec_bytes
from orchestrator.config.host_tree import HostTree
from tests.supervisor_env import hosts_yaml, make_root

REPO = Path(__file__).resolve().parent.parent
SETS = ["train.micro_batch=4", "parallel.drafter_devices=[cpu]", "model.attention=flex-eager"]


@pytest.fixture
def launch(tmp_path, monkeypatch):
    """``dfo launch --dry-run ARGS --set SETS`` on the local host -> (the plan, the number
    of times a run config's YAML was parsed)."""
    root = make_root(tmp_path)
    hosts = hosts_yaml(tmp_path / "hosts.yaml", root)
    parses: list[str] = []
    plans: list[lp.LaunchPlan] = []
    safe_load, plan_launch = yaml.safe_load, lp.plan_launch

    def counting(stream, *a, **kw):
        text = stream if isinstance(stream, str) else "<stream>"
        if text == "<stream>" or "model:" in text:
            parses.append(text)
        return safe_load(stream, *a, **kw)

    def capture(*a, **kw):
        plans.append(plan_launch(*a, **kw))
        return plans[-1]

    monkeypatch.setattr(yaml, "safe_load", counting)
    monkeypatch.setattr(lp, "plan_launch", capture)

    def run(*args: str):
        parses.clear()
        sets = [x for s in SETS for x in ("--set", s)]
        rc = main(["--hosts", str(hosts), "launch", "--dry-run", "--no-env-check", "--json",
                   *args, *sets])
        assert rc == 0
        return plans[-1], len(parses)

    run.root = root
    return run


def _typed(cfg: tcfg.TrainerConfig) -> tcfg.TrainerConfig:
    """``cfg`` with SETS as the trainer applies ``--KEY VALUE`` flags, validated."""
    return tcfg.apply_overrides(cfg, [tuple(s.split("=", 1)) for s in SETS])


def _spec(plan: lp.LaunchPlan) -> RunSpec:
    """The spec.json launch writes for ``plan``, read back as the supervisor reads it."""
    return RunSpec.from_json(json.loads(spec_bytes(plan.spec)))


def _check(spec: RunSpec, want: tcfg.TrainerConfig) -> None:
    flat = tcfg.flat(want)
    assert spec.config.merged() == flat
    assert spec.config.overrides == {"train.micro_batch": 4, "parallel.drafter_devices": ["cpu"],
                                     "model.attention": "flex-eager"}
    assert spec.config.base["train.micro_batch"] == 8     # the file's: --set is an override
    assert spec.trainer == Bundled.of(want) == Bundled(layout="single", nproc=1,
                                                        dense_expected=True)


def test_a_config_file_is_parsed_once_and_its_typed_config_reaches_spec_json(launch, tmp_path):
    target, data = tmp_path / "target", tmp_path / "data.jsonl"
    target.mkdir()
    data.write_text("{}\n")
    cfg = yaml.safe_load((REPO / "orchestrator/config/defaults/tiny-cpu.yaml").read_text())
    cfg["model"]["target_path"], cfg["data"]["path"] = str(target), str(data)
    del cfg["run"]
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(cfg))
    plan, parses = launch("--config", str(path))
    assert parses == 1
    assert plan.config_bytes == path.read_bytes()         # the file shipped as it is
    _check(_spec(plan), _typed(tcfg.load_config(str(path), validate_now=False)))


def test_the_default_config_is_parsed_once_and_never_goes_through_a_file(launch, monkeypatch):
    p = demo_paths(HostTree(str(launch.root)))
    Path(p["target"]).mkdir(parents=True)
    Path(p["data"]).write_text("{}\n")
    Path(p["eval"]).write_text("{}\n")
    monkeypatch.setattr("tempfile.TemporaryDirectory", None)   # no local file for it
    plan, parses = launch()
    assert parses == 1                                    # the shipped tiny-cpu.yaml
    want = tcfg.load_config(str(default_config_path()), validate_now=False)
    want = tcfg.set_values(tcfg.clear(want, "run.dir"), {
        "model.target_path": p["target"], "data.path": p["data"], "data.eval_path": p["eval"],
        "eval.every": 40, "train.max_steps": 200, "train.log_every": 10,
        "compile.enabled": True, "compile.gate": False, "checkpoint.every": 20,
        "checkpoint.keep": 3})
    spec = _spec(plan)
    _check(spec, _typed(want))
    # what ships as config.yaml is the trainer's reading of that same config
    shipped = tcfg.load_text(plan.config_bytes.decode(), "config.yaml")
    assert tcfg.flat(shipped) == spec.config.base


# --- the supervisor reads spec.json's attributes, never a trainer-config key by name ---------

def _keys() -> set[str]:
    names = set(tcfg.field_types())
    return names | {k.split(".", 1)[0] for k in names}


def _lookups(tree: ast.AST, keys: set[str]) -> list[tuple[int, str]]:
    """``x["KEY"]`` and ``x.get("KEY")`` / ``.pop`` / ``.setdefault`` of a trainer-config
    section or ``SECTION.FIELD`` name."""
    out = []
    for n in ast.walk(tree):
        key = None
        if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant):
            key = n.slice.value
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
              and n.func.attr in ("get", "pop", "setdefault") and n.args
              and isinstance(n.args[0], ast.Constant)):
            key = n.args[0].value
        if isinstance(key, str) and key in keys:
            out.append((n.lineno, key))
    return out


def test_the_guard_sees_a_string_keyed_lookup():
    tree = ast.parse('cfg.get("parallel.layout")\ncfg["compile.threads"]\nd["model"]\nd.get("x")')
    assert [k for _, k in _lookups(tree, _keys())] == ["parallel.layout", "compile.threads",
                                                       "model"]


def test_the_supervisor_looks_up_no_trainer_config_key_by_name():
    keys = _keys()
    found = {str(p.relative_to(REPO)): hits
             for p in sorted((REPO / "orchestrator" / "supervisor").rglob("*.py"))
             if (hits := _lookups(ast.parse(p.read_text()), keys))}
    assert found == {}
