"""Rollout side of a policy: an engine behind a small interface, and the worker that
samples groups, verifies them and publishes experience through SEE."""

from mutualrl.services.rollout.engine import EngineInfo, RolloutEngine, SamplingSpec
from mutualrl.services.rollout.hf_engine import HFEngine
from mutualrl.services.rollout.worker import RolloutWorker, StepRollouts

__all__ = ["EngineInfo", "RolloutEngine", "SamplingSpec", "HFEngine", "RolloutWorker", "StepRollouts"]
