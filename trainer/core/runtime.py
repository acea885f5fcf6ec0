"""The trainer process's state, built once by the entry point and passed down.

``Runtime.create()`` (which reads the environment: ``trainer.env.read_env``) is called once
by each entry point (``trainer.train.loop.train``, ``trainer.train.compile_only.main``, the
bench's runs); the layouts, the step functions and the fault hook take the runtime as an
argument:

- ``compile``: the ``trainer.compile.registry.CompileRegistry`` (every function compiled in
  this process, the call guard the compile gate installs, flex's kernel options);
- ``faults``: fault injection's ``trainer.telemetry.faults.Faults`` (hang's silence, slow's
  throttle);
- ``eager_flex``: the ``flex-eager`` backend's uncompiled flex_attention, which warns once
  (``trainer.model.attention.EagerFlex``);
- ``tokenizers``: the target tokenizers loaded so far, by directory
  (``trainer.data.tokenizer.Tokenizers``);
- ``env``: the ``trainer.env.Env`` it was built with.

No module of the trainer keeps process state of its own (tests/test_module_state.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..compile.registry import CompileRegistry
from ..data.tokenizer import Tokenizers
from ..env import Env, read_env
from ..model.attention import EagerFlex
from ..telemetry.faults import Faults


@dataclass(frozen=True)
class Runtime:
    """One per process (see the module docstring)."""
    env: Env = field(default_factory=Env)
    compile: CompileRegistry = field(default_factory=CompileRegistry)
    faults: Faults = field(default_factory=Faults)
    eager_flex: EagerFlex = field(default_factory=EagerFlex)
    tokenizers: Tokenizers = field(default_factory=Tokenizers)

    @classmethod
    def create(cls, env: Env | None = None) -> "Runtime":
        """The process's runtime; ``env``: its environment (None: ``read_env()`` now)."""
        return cls(env=env if env is not None else read_env())

    def flex(self, backend: str) -> Callable | None:
        """The ``flex=`` that trainer.model.attention's ``attend`` takes for ``backend``: the
        compiled flex_attention for ``flex``, the warning-once eager one for ``flex-eager``."""
        if backend == "flex":
            return self.compile.flex_attention
        if backend == "flex-eager":
            return self.eager_flex
        return None
