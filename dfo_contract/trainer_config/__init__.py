"""The trainer's config: one tree of ``kw_only`` dataclasses, YAML + dotted flag overrides.

``schema``  the dataclass tree, its choices and derived values (pure)
``parse``   YAML loading, flag overrides, coercion, ``split_args``, ``validate``
``flat``    the config as flat ``SECTION.FIELD`` values, and the YAML of its explicit keys
``layers``  the draft layers' attention pattern
``methods``  the drafter methods' registry, torch-free (settings, validation, export config)
``drafter_dir``  ``model.init_from``: the settings a run takes from a drafter's config.json

Torch-free: the orchestrator imports this package to validate and render run configs.
"""

from .drafter_dir import effective_config
from .flat import clear, copied, explicit_yaml, flat, from_flat
from .parse import (apply_overrides, config_from_dict, field_types, load_config, load_text, parse_overrides,
                    set_values, split_args, validate)
from .schema import (ATTENTION_BACKENDS, COMPILE_MODES, DATA_FORMATS, DTYPES, LAYOUTS, SCHEDULES,
                     CheckpointConfig, CompileConfig, DataConfig, FaultConfig, ModelConfig,
                     ParallelConfig, RunConfig, TrainConfig, TrainerConfig, default_gamma)

__all__ = [
    "ATTENTION_BACKENDS", "COMPILE_MODES", "DATA_FORMATS", "DTYPES", "LAYOUTS", "SCHEDULES",
    "CheckpointConfig", "CompileConfig", "DataConfig", "FaultConfig", "ModelConfig",
    "ParallelConfig", "RunConfig", "TrainConfig", "TrainerConfig", "apply_overrides",
    "clear", "config_from_dict", "copied", "effective_config", "explicit_yaml", "flat", "from_flat",
    "default_gamma", "field_types", "load_config", "load_text", "parse_overrides", "set_values",
    "split_args", "validate",
]
