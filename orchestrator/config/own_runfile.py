"""The run file of your own trainer (``dfo launch --run-file own.yaml -- CMD ...``).

```yaml
command: [python, train.py, --threads, "4"]   # or after `--` on the command line
cwd: /srv/me/project                           # default: the run directory
step_pattern: 'step (?P<step>\\d+) .* (?P<tok_s>[\\d.]+) tok/s'
env: {HF_HOME: /srv/hf}
resume: {glob: ckpt/step_*, order: step, args: [--resume, "{path}"]}
fallbacks:
  fx_trace_race:
    - run_first: [python, warm.py, --threads, "1"]
    - drop_arg: --threads
  compile_hang:
    - env: {TORCHINDUCTOR_COMPILE_THREADS: "1"}
thresholds: {hang_s: 60}
```

Every error is one line ``FILE:LINE: what (how to fix)`` (a ConfigError).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..common.errors import ConfigError
from ..common import own_trainer

KEYS = ("command", "cwd", "step_pattern", "env", "resume", "fallbacks", "thresholds")


def _plain(node: yaml.Node) -> Any:
    return yaml.safe_load(yaml.serialize(node)) if node is not None else None


def _at(path: str, node: yaml.Node, e: ConfigError) -> ConfigError:
    return ConfigError(f"{path}:{node.start_mark.line + 1}: {e.message}", hint=e.hint)


def read_run_file(path: str) -> tuple[dict, bytes]:
    """The run file at ``path``, validated, and its bytes (shipped as the run's run-file.yaml)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"--run-file {path}: cannot read it ({e.strerror})",
                          hint="give the path of a YAML run file") from None
    return parse_run_file(data.decode("utf-8", "replace"), path), data


def parse_run_file(text: str, path: str = "run file") -> dict:
    """The validated run file as a dict of the keys in :data:`KEYS` (absent ones omitted)."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{line}: not valid YAML ({getattr(e, 'problem', e)})",
                          hint="fix the YAML syntax") from None
    if root is None:
        return {}
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError(f"{path}:{root.start_mark.line + 1}: expected a mapping of "
                          + ", ".join(KEYS))
    out: dict[str, Any] = {}
    for knode, vnode in root.value:
        key = knode.value
        if key not in KEYS:
            raise ConfigError(f"{path}:{knode.start_mark.line + 1}: unknown key {key!r}",
                              hint="known: " + ", ".join(KEYS))
        try:
            out[key] = _check(key, vnode, path)
        except ConfigError as e:
            if e.message.startswith(f"{path}:"):
                raise
            raise _at(path, vnode, e) from None
    return out


def _check(key: str, node: yaml.Node, path: str) -> Any:
    val = _plain(node)
    if key == "command":
        if not isinstance(val, list) or not val or not all(isinstance(a, (str, int, float))
                                                           for a in val):
            raise ConfigError("command: expected a list of arguments",
                              hint="e.g. command: [python, train.py, --steps, '100']")
        return [str(a) for a in val]
    if key == "cwd":
        if not isinstance(val, str) or not val.startswith("/"):
            raise ConfigError("cwd: expected an absolute path")
        return val
    if key == "step_pattern":
        if not isinstance(val, str):
            raise ConfigError("step_pattern: expected a regular expression (quote it)")
        own_trainer.compile_step_pattern(val, source="step_pattern")
        return val
    if key == "env":
        if not isinstance(val, dict):
            raise ConfigError("env: expected a mapping NAME: VALUE")
        return own_trainer.check_step({"env": val}, "env").env
    if key == "resume":
        return own_trainer.check_resume(val)
    if key == "thresholds":
        if not isinstance(val, dict) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in val.values()):
            raise ConfigError("thresholds: expected a mapping NAME: SECONDS")
        return {str(k): float(v) for k, v in val.items()}
    # fallbacks: each class and each step at its own line
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError("fallbacks: expected a mapping of failure class -> list of steps")
    ladders: dict[str, list] = {}
    for cnode, lnode in node.value:
        try:
            own_trainer.check_ladders({cnode.value: []})
        except ConfigError as e:
            raise _at(path, cnode, e) from None
        if not isinstance(lnode, yaml.SequenceNode):
            raise _at(path, lnode, ConfigError(f"fallbacks.{cnode.value}: expected a list of "
                                               "steps"))
        steps = []
        for i, snode in enumerate(lnode.value):
            try:
                steps.append(own_trainer.check_step(_plain(snode), f"fallbacks.{cnode.value}[{i}]"))
            except ConfigError as e:
                raise _at(path, snode, e) from None
        ladders[cnode.value] = steps
    return ladders
