"""Every config literal that names something a library defines (a loss, an estimator, a variant, an answer format, a
task, a model preset) lists exactly what that library defines: the config stays the bottom floor (it imports no
library) and cannot drift from the formulas it selects."""

from __future__ import annotations

import typing

import pytest

from mutualrl.config.schema import (
    MODEL_PRESETS,
    AlgorithmConfig,
    CapabilityConfig,
    OptimConfig,
    PrpConfig,
    TaskConfig,
    XgrpoConfig,
)
from mutualrl.grpo import CAPABILITY_METRICS, LOSS_AGG_MODES, POLICY_LOSSES, PRP_RATIO_LEVELS, XGRPO_VARIANTS
from mutualrl.grpo.kl import KL_ESTIMATORS
from mutualrl.models.optimizer import STATE_DTYPES
from mutualrl.models.presets import PRESETS
from mutualrl.tasks import TASKS
from mutualrl.tasks.answers import ANSWER_FORMATS


def _literal(model, field: str) -> list[str]:
    annotation = model.model_fields[field].annotation
    args = typing.get_args(annotation)
    if type(None) in args:  # Optional[Literal[...]]
        (annotation,) = [a for a in args if a is not type(None)]
        args = typing.get_args(annotation)
    return sorted(args)


@pytest.mark.parametrize("model, field, defined", [
    (AlgorithmConfig, "loss", POLICY_LOSSES.names()),
    (AlgorithmConfig, "kl_type", KL_ESTIMATORS),
    (AlgorithmConfig, "loss_agg", LOSS_AGG_MODES),
    (XgrpoConfig, "variant", XGRPO_VARIANTS),
    (PrpConfig, "ratio_level", PRP_RATIO_LEVELS),
    (CapabilityConfig, "metric", CAPABILITY_METRICS),
    (TaskConfig, "answer_format", ANSWER_FORMATS),
    (TaskConfig, "name", TASKS),
    (OptimConfig, "state_dtype", STATE_DTYPES),
], ids=lambda v: v if isinstance(v, str) else getattr(v, "__name__", ""))
def test_a_config_literal_lists_what_its_library_defines(model, field, defined):
    assert _literal(model, field) == sorted(defined)


def test_the_configs_model_presets_are_the_catalogues():
    """``model.path`` may name a preset; the config knows the names without importing the models library (which
    imports torch)."""
    assert sorted(MODEL_PRESETS) == sorted(PRESETS)
