"""Learner side of a policy: consume own and peer experience, apply the sharing mode, step, publish weights."""

from mutualrl.services.learner.learner import Learner
from mutualrl.services.learner.peer_experience import PeerIntake, TokenizerRegistry
from mutualrl.services.learner.settings import LearnerSettings
from mutualrl.services.learner.step_record import SampledStep, StepRecord

__all__ = ["Learner", "LearnerSettings", "PeerIntake", "SampledStep", "StepRecord", "TokenizerRegistry"]
