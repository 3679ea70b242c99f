"""mutualrl: mutual reinforcement learning for heterogeneous LLM policies.

Subpackages: ``config`` (experiment schema), ``tasks`` (verifiable tasks),
``models`` (policies without a hub), ``grpo`` (losses and sharing modes),
``thl`` (tokenizer heterogeneity layer), ``see`` (shared experience exchange),
``runtime`` (the run loop and its outputs), ``services`` (rollout and learner
workers), ``v1`` (generated protobuf code).
"""

__version__ = "0.1.0"
