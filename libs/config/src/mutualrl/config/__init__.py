"""The experiment file: one YAML validated by a typed schema (no torch import here).

Tools that only need schemas (CLI validation, Helm value checks) import this
package without pulling in torch or transformers.
"""

from mutualrl.config.loading import ConfigError, apply_overrides, dump_config, load_config, parse_config
from mutualrl.config.schema import (
    AlgorithmConfig,
    BrokerConfig,
    BudgetConfig,
    EngineConfig,
    EvalConfig,
    ExperimentConfig,
    ModelConfig,
    PolicyConfig,
    SgtConfig,
    SharingConfig,
    TaskConfig,
    ThlConfig,
    TokenizerConfig,
    WarmStartConfig,
)

__all__ = [
    "parse_config",
    "AlgorithmConfig",
    "BrokerConfig",
    "BudgetConfig",
    "EngineConfig",
    "EvalConfig",
    "ExperimentConfig",
    "ModelConfig",
    "PolicyConfig",
    "SgtConfig",
    "SharingConfig",
    "TaskConfig",
    "ThlConfig",
    "TokenizerConfig",
    "WarmStartConfig",
    "ConfigError",
    "apply_overrides",
    "load_config",
    "dump_config",
]
