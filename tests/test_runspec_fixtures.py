"""spec.json's bytes: the specs under tests/fixtures/spec/ (written by ``dfo launch``'s
writer, ``plan.launch_steps.spec_bytes``) read back and are written again byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dfo_contract.runspec import Bundled, Group, Own, RunSpec, Solo
from orchestrator.plan.launch_steps import spec_bytes

FIXTURES = Path(__file__).parent / "fixtures" / "spec"


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.stem)
def test_a_written_spec_reads_back_and_is_written_byte_identical(path):
    raw = path.read_bytes()
    spec = RunSpec.from_json(json.loads(raw))
    assert spec_bytes(spec) == raw
    assert RunSpec.from_json(json.loads(spec_bytes(spec))) == spec
    assert list(spec.to_json()["trainer"])[0] == "kind" == list(spec.to_json()["role"])[0]


def test_the_fixtures_cover_both_trainers_and_both_roles():
    specs = [RunSpec.from_json(json.loads(p.read_bytes())) for p in FIXTURES.glob("*.json")]
    assert {type(s.trainer) for s in specs} == {Bundled, Own}
    assert {type(s.role) for s in specs} == {Solo, Group}
    own = next(s.own for s in specs if s.own is not None and s.own.resume is not None)
    assert isinstance(own.command, tuple) and isinstance(own.resume.args, tuple)
    assert all(isinstance(steps, tuple) for steps in own.fallbacks.values())
