"""The prompt distributor: every policy samples the same prompts at step t (docs/architecture.md, "One training
step")."""

from __future__ import annotations

import random

from mutualrl.tasks import Problem


class PromptDistributor:
    """Deterministic in (seed, step): any process can recompute the batch of step t,
    so same-prompt peer groups line up without coordination, and a resumed run
    sees exactly the prompts it would have seen."""

    def __init__(self, problems: list[Problem], batch_size: int, seed: int = 0):
        if not problems:
            raise ValueError("no training problems to distribute")
        self.problems = problems
        self.batch_size = min(batch_size, len(problems))
        self.seed = seed

    def batch(self, step: int) -> list[Problem]:
        """Step ``step``'s prompts: the same for every policy, drawn from the seed and the step alone."""
        return random.Random(f"prompts:{self.seed}:{step}").sample(self.problems, self.batch_size)
