"""The drafter-method registry (``dfo_contract.trainer_config.methods`` + ``trainer.core.methods``).

- No product module outside the two registry modules branches on a method's name: no
  comparison with a registered name (``== "dflash2"``, ``in ("dflash", ...)``, ``case
  "dflash2"``), no use of one as a dict key (``{"dflash2": ...}``, ``d["dflash2"]``,
  ``d.get("dflash2")``). What differs between methods is a field of their record.
- A third method is one ``register(DrafterMethod(...))``: this file registers a toy one (DFlash
  with its loss weighted twice) and trains it through the real entry points, editing nothing else.
"""

from __future__ import annotations

import ast
import io
import json
import os
from pathlib import Path

import pytest

from dfo_contract.trainer_config import methods as contract_registry
from dfo_contract.trainer_config.methods import MethodContract, register, unregister
from tests.helpers.trainer import make_synth, make_target, tiny_config
from trainer.core import objective
from trainer.core.methods import DrafterMethod, method_of

REPO = Path(__file__).resolve().parent.parent
#: the product code the rule reads
ROOTS = ("trainer", "dfo_contract", "orchestrator", "bench")
#: the registry modules, the only ones that may name a method to branch on it
REGISTRY = {"dfo_contract/trainer_config/methods.py", "trainer/core/methods.py"}
#: the call names whose first argument is a dict key
KEY_CALLS = {"get", "pop", "setdefault"}


def _is_name(node, names) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value in names
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_name(e, names) for e in node.elts)
    return False


def method_branches(source: str, names) -> list[tuple[int, str]]:
    """``(line, what)`` for each comparison with, or dict-key use of, a name in ``names``."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Compare) and any(_is_name(x, names) for x in [n.left, *n.comparators]):
            out.append((n.lineno, "a comparison"))
        elif isinstance(n, ast.Dict) and any(k is not None and _is_name(k, names) for k in n.keys):
            out.append((n.lineno, "a dict key"))
        elif isinstance(n, ast.Subscript) and _is_name(n.slice, names):
            out.append((n.lineno, "a subscript"))
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
              and n.func.attr in KEY_CALLS and n.args and _is_name(n.args[0], names)):
            out.append((n.lineno, f"a .{n.func.attr}() key"))
        elif isinstance(n, ast.MatchValue) and _is_name(n.value, names):
            out.append((n.lineno, "a case pattern"))
    return out


def product_branches(repo: Path = REPO, names=None) -> list[str]:
    names = set(names or contract_registry.names())
    out = []
    for root in ROOTS:
        for p in sorted((repo / root).rglob("*.py")):
            rel = p.relative_to(repo).as_posix()
            if "__pycache__" in p.parts or rel in REGISTRY:
                continue
            for line, what in method_branches(p.read_text(encoding="utf-8"), names):
                out.append(f"{rel}:{line}: {what} with a method name")
    return out


def test_no_method_name_branches_outside_the_registry():
    assert {"dflash", "dflash2"} <= set(contract_registry.names())
    assert product_branches() == []


def test_the_rule_sees_a_method_branch(tmp_path):
    bad = '''
def f(cfg, d, m):
    if cfg.model.method == "dflash2":
        pass
    if m in ("dflash", "other"):
        pass
    two = "dflash2" != m
    x = {"dflash": 1}
    y = d["dflash2"], d.get("dflash")
    match m:
        case "dflash2":
            pass
'''
    fine = '''
method = "dflash2"
ARGS = ["--model.method", "dflash2"]
def g(ap, m):
    ap.add_argument("--methods", default="dflash")
    return m.name == m.other
'''
    names = {"dflash", "dflash2"}
    assert [w for _, w in method_branches(bad, names)] == [
        "a comparison", "a comparison", "a comparison", "a dict key", "a subscript",
        "a .get() key", "a case pattern"]
    assert method_branches(fine, names) == []
    (tmp_path / "trainer" / "core").mkdir(parents=True)
    (tmp_path / "trainer" / "core" / "step.py").write_text(bad)
    (tmp_path / "trainer" / "core" / "methods.py").write_text(bad)   # the registry may
    found = product_branches(tmp_path, names)
    assert len(found) == 7 and all(f.startswith("trainer/core/step.py:") for f in found)


# --------------------------------------------------------------------------- a third method

TOY = "toy"
TOY_WEIGHT = 2.0


def _toy_forward_loss(*args):
    loss, metrics = objective.dflash_forward_loss(*args)
    return loss * TOY_WEIGHT, {**metrics, "loss": metrics["loss"] * TOY_WEIGHT}


@pytest.fixture
def toy():
    """DFlash with its loss weighted ``TOY_WEIGHT`` times: a registry entry and nothing else."""
    dflash = method_of("dflash")
    m = register(DrafterMethod.of(MethodContract(name=TOY, label="Toy"), build=dflash.build,
                                  build_exported=dflash.build_exported,
                                  forward_loss=_toy_forward_loss, step_name="toy_step"))
    try:
        yield m
    finally:
        unregister(TOY)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    d = tmp_path_factory.mktemp("toy")
    return {"dir": d, "target": make_target(str(d / "target")),
            "data": make_synth(str(d / "synth.jsonl"), num=32)}


def _first_loss(env, run: str, method: str) -> float:
    from trainer.train.loop import train

    cfg = tiny_config(env["target"], env["data"], str(env["dir"] / run),
                      **{"model.method": method, "train.max_steps": 1})
    assert train(cfg, out=io.StringIO()) == 0
    with open(os.path.join(env["dir"], run, "metrics.jsonl")) as f:
        return next(r["loss"] for r in map(json.loads, f) if "loss" in r)


@pytest.mark.usefixtures("one_torch_thread")
def test_a_registered_third_method_trains_a_step_on_cpu(toy, env):
    from dfo_contract.trainer_config import load_config
    from dfo_contract.exitcodes import TrainerConfigError

    assert method_of(load_config(None, ["--data.path", "x", "--model.method", TOY])) is toy
    base = _first_loss(env, "dflash", "dflash")
    got = _first_loss(env, "toy", TOY)
    assert got == pytest.approx(TOY_WEIGHT * base, rel=1e-5)
    unregister(TOY)
    with pytest.raises(TrainerConfigError, match="--model.method: expected one of dflash, dflash2"):
        load_config(None, ["--data.path", "x", "--model.method", TOY])


# --------------------------------------------------------------------------- the config

#: ``model``'s keys as ``to_dict`` writes them (a checkpoint's config.yaml, the compile-cache
#: key's ``config.model.*`` components): the same flat keys, in the same order, as before the
#: methods' own fields moved into their settings records
MODEL_KEYS = ["target_path", "drafter_layers", "block_size", "attention", "mask_token_id",
              "target_layer_ids", "gamma", "ce_chunk", "dtype", "target_fp8", "init_seed",
              "init_from", "method", "layer_types", "sliding_window", "is_causal",
              "conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k",
              "final_logit_softcapping", "output_multiplier"]


def test_the_methods_settings_are_written_flat_as_before():
    from dfo_contract.trainer_config import TrainerConfig, config_from_dict, load_config
    from dfo_contract.trainer_config.methods import DFlash2Settings

    assert list(TrainerConfig().to_dict()["model"]) == MODEL_KEYS
    cfg = load_config(None, ["--data.path", "x", "--model.method", "dflash2",
                             "--model.selector_rank", "8"])
    assert cfg.model.settings() == DFlash2Settings(selector_rank=8)
    assert cfg.model.get_flat("selector_rank") == 8 and cfg.to_dict()["model"]["selector_rank"] == 8
    back = config_from_dict(cfg.to_dict())
    assert back.model.method_settings == cfg.model.method_settings
    assert TrainerConfig().model.settings() is None          # dflash has no settings of its own
