"""A per-prompt bank of peers' verified successes for SGT (docs/algorithms.md §6, bounded peers).

SGT rescues an all-fail group with a peer's verified success on the *same* prompt. When learners stop
waiting for each other, a peer's success often arrives for a prompt this learner is not training now —
an older step's, or one it will meet again. The bank keeps such ``VerifiedSuccess`` messages by prompt,
bounded in size (prompts, and successes per prompt; the least recently deposited prompt goes first) and
in age (steps between the success and its use), and hands them to the intake when their prompt comes up.
The intake re-verifies and converts them then, exactly as a fresh message: a success is an answer, and
its age does not change whether it is right.

The bank lives in memory: a restarted learner starts with an empty one (its messages were acknowledged
when banked, so none is trained twice; some are simply not used).
"""

from __future__ import annotations

from collections import Counter, OrderedDict

from mutualrl.see import Received


class SuccessBank:
    """Peers' ``VerifiedSuccess`` messages by prompt: at most ``prompts`` prompts of at most ``per_prompt``
    successes each, released while at most ``max_age`` steps old. ``counts`` says what happened to them
    (``banked``, ``released``, ``expired``, ``evicted``)."""

    def __init__(self, prompts: int, per_prompt: int, max_age: int):
        if prompts < 1 or per_prompt < 1 or max_age < 0:
            raise ValueError(f"a success bank needs prompts >= 1, per_prompt >= 1, max_age >= 0 (got {prompts}, "
                             f"{per_prompt}, {max_age})")
        self.prompts, self.per_prompt, self.max_age = prompts, per_prompt, max_age
        self._by_prompt: OrderedDict[str, list[Received]] = OrderedDict()
        self.counts: Counter[str] = Counter()

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_prompt.values())

    def deposit(self, messages: list[Received], step: int) -> None:
        """Keep these successes for later (those already older than ``max_age`` at ``step`` are dropped)."""
        for m in messages:
            if step - int(m.payload.step) > self.max_age:
                self.counts["expired"] += 1
                continue
            kept = self._by_prompt.setdefault(m.payload.prompt_id, [])
            self._by_prompt.move_to_end(m.payload.prompt_id)
            kept.append(m)
            self.counts["banked"] += 1
            if len(kept) > self.per_prompt:  # the newest successes stay
                kept.pop(0)
                self.counts["evicted"] += 1
        while len(self._by_prompt) > self.prompts:
            _, dropped = self._by_prompt.popitem(last=False)
            self.counts["evicted"] += len(dropped)

    def withdraw(self, prompt_ids: set[str], step: int) -> list[Received]:
        """The banked successes for this step's prompts that are at most ``max_age`` steps old (removed from
        the bank; older ones are dropped)."""
        out: list[Received] = []
        for pid in [p for p in self._by_prompt if p in prompt_ids]:
            for m in self._by_prompt.pop(pid):
                if step - int(m.payload.step) > self.max_age:
                    self.counts["expired"] += 1
                else:
                    out.append(m)
        self.counts["released"] += len(out)
        return out
