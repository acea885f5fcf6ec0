"""Every weight an export writes is one the serving engines' loaders build, with its shape.

The parameter sets of vLLM's and SGLang's DFlash and DFlash2 loaders were read from their
source at the commits named in tests/fixtures/engine_params/*.json (as checkpoint names and
stored shapes). vLLM raises on a name it does not know; SGLang skips it and leaves the
parameter at its initial value (a zero selector codebook, say), so a misnamed tensor would
be served silently wrong. Each layer pattern dfo exports is checked: DFlash, DFlash2, and a
hybrid of sliding and full layers."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from safetensors import safe_open

from tests.helpers.trainer import make_synth, make_target, tiny_config

FIXTURES = Path(__file__).parent / "fixtures" / "engine_params"
ENGINES = sorted(p.stem for p in FIXTURES.glob("*.json"))
D2 = {"model.method": "dflash2", "model.selector_rank": 8, "model.selector_top_k": 4}
PATTERNS = {
    "dflash": {},
    "dflash-hybrid": {"model.layer_types": "[sliding_attention,full_attention]",
                      "model.sliding_window": 16},
    "dflash2": {**D2, "model.sliding_window": 16},
    "dflash2-full": {**D2, "model.sliding_window": 0, "model.conv_kernel_size": 3},
}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    from trainer.evaluate.export_dir import export
    from trainer.train.loop import train

    d = tmp_path_factory.mktemp("names")
    target = make_target(str(d / "target"))
    data = make_synth(str(d / "synth.jsonl"), num=16)
    out = {}
    for name, extra in PATTERNS.items():
        cfg = tiny_config(target, data, str(d / name), **{
            "model.drafter_layers": 2, "model.target_layer_ids": "[1,2]", "train.max_steps": 1,
            **extra})
        assert train(cfg, out=io.StringIO()) == 0
        export(str(d / name / "checkpoints" / "step_1"), str(d / f"x-{name}"), dtype="fp32")
        out[name] = d / f"x-{name}"
    return out


def _dims(conf: dict) -> dict[str, int]:
    dc = conf["dflash_config"]
    d = {"H": conf["hidden_size"], "NH": conf["num_attention_heads"],
         "NKV": conf["num_key_value_heads"], "D": conf["head_dim"], "I": conf["intermediate_size"],
         "V": conf["vocab_size"], "T": len(dc["target_layer_ids"])}
    if "conv_kernel_size" in dc:
        d.update(K=dc["conv_kernel_size"], G=dc["conv_group_size"], R=dc["selector_rank"])
    return d


def _shape(spec, dims) -> tuple[int, ...]:
    return tuple(int(eval(str(x), {}, dict(dims))) for x in spec)   # noqa: S307 - fixture arithmetic


def _expected(engine: str, conf: dict) -> dict[str, tuple[int, ...]]:
    fx = json.loads((FIXTURES / f"{engine}.json").read_text())
    dims = _dims(conf)
    table = dict(fx["dflash"])
    if conf["architectures"] == ["DFlash2DraftModel"]:
        table.update(fx["dflash2"])
    out = {}
    for pattern, spec in table.items():
        names = [pattern.format(i=i) for i in range(conf["num_hidden_layers"])] \
            if "{i}" in pattern else [pattern]
        for n in names:
            out[n] = _shape(spec, dims)
    return out


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_export_names_and_shapes_are_the_loaders(exports, engine, pattern):
    d = exports[pattern]
    conf = json.loads((d / "config.json").read_text())
    want = _expected(engine, conf)
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        have = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert sorted(set(have) - set(want)) == [], f"{engine} does not know these names"
    assert sorted(set(want) - set(have)) == [], f"{engine} would leave these at their init"
    assert {k: have[k] for k in want} == want


def test_the_fixture_catches_a_misnamed_codebook(exports):
    """The check is not vacuous: the codebook under a `.weight` name (as a transformers
    state_dict of an nn.Embedding would write it) is not a name either loader builds."""
    conf = json.loads((exports["dflash2"] / "config.json").read_text())
    for engine in ENGINES:
        want = _expected(engine, conf)
        assert "candidate_selector.successor_codebook" in want
        assert "candidate_selector.successor_codebook.weight" not in want
        assert not any(re.search(r"embed_tokens|lm_head", k) for k in want)
