"""Learner side of a policy: consume own and peer experience, apply the sharing mode, step, publish weights."""

from mutualrl.services.learner.learner import Learner
from mutualrl.services.learner.peer_experience import PeerIntake, TokenizerRegistry
from mutualrl.services.learner.settings import LearnerSettings

__all__ = ["Learner", "LearnerSettings", "PeerIntake", "TokenizerRegistry"]
