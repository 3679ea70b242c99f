"""``mutualrl probe``: before a long run, how each policy does on the task under each answer format and
prompt style — and the setting where RL has room.

GRPO learns from groups whose rewards differ. With a sampled pass rate p and G samples a group, the share
of groups that carry a signal is ``1 − p^G − (1 − p)^G``: zero at p = 0 and p = 1, highest in between. A
policy that cannot write the answer *form* a verifier reads sits at p = 0 whatever it knows (SmolLM2 asked
for ``<answer>`` tags scored 0 of 128; asked to end on the number, 3.9 % and then 65.6 % after 5 steps). The
probe measures greedy and sampled pass rates on held-out problems for every (format, style), then picks:

- one answer format for the task — the verifier's contract, shared by every policy — maximising the
  smallest per-policy signal share (the weakest policy decides);
- per policy, the prompt style with the largest signal share under that format.

Where the pick leaves a policy outside ~10–70 % sampled, it says so: no format gives every policy room.
Each cell also counts the completions the token limit ended (no EOS, no stop string) and how many of its passes
were read from one: a verifier that takes the last number of an unfinished explanation passes it whenever a stray
number happens to match (on reasoning-gym's `gcd` at 48 tokens, most of a policy's passes). Where half or more of
a picked policy's passes are such, the pick says to raise the token limit before trusting the rates.

A policy can look cold for want of an instruction rather than of skill: Qwen2.5-Coder-0.5B-Instruct sampled 2 % on
three-term sums of two-digit numbers under the task's instruction at T = 1, and 67 % when told to write each
intermediate result at T 0.7 (docs/results/real/sgt-r/README.md, "Cold in skill, not in instruction"). With
``worked=True`` every (format, style) is also measured under :func:`worked_instruction` at a cooler temperature;
these cells take no part in the pick, but each picked policy under RL's room is told apart: one that samples in the
room when worked is cold by its instruction and lacks that, not a peer's hint; one at or under :data:`COLD` either
way is a cold start in skill.

Policies are probed one at a time, so memory is that of the largest one.
"""

from __future__ import annotations

import gc
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from mutualrl.config import ExperimentConfig
from mutualrl.models.policy import PromptStyle
from mutualrl.runtime.evaluation import scored_completions
from mutualrl.runtime.policy_setup import (
    build_task_from_config,
    policy_instruction,
    prepare_policy,
    sampling_temperature,
)
from mutualrl.tasks import build_verifier
from mutualrl.tasks.answers import INSTRUCTIONS

ROOM = (0.10, 0.70)
"""Sampled pass rates where GRPO has room: enough successes to learn from, enough failures to improve on."""
DEFAULT_FORMATS = ("last_number", "answer_tags", "boxed", "last_line")
COLD = 0.02
"""A sampled pass rate at or under this is a cold start (issue #44's pair B: ≤ 2 % in the required form)."""
WORKED_TEMPERATURE = 0.7
"""The temperature of the worked cells: the sampler under which the 0.5B Qwen's work held together."""
CUT_OFF_PASSES = 0.5
"""A picked policy with at least this share of its passes read from completions the token limit ended is warned."""


@dataclass
class Cell:
    """One policy under one (answer format, prompt style)."""

    policy: str
    answer_format: str
    style: str
    problems: int
    greedy: float
    sampled: float
    signal: float  # expected share of groups of G samples with mixed rewards
    seconds: float
    cut_off: float = 0.0  # share of the cell's completions (greedy and sampled) that the token limit ended
    passes_cut_off: float = 0.0  # share of its passes read from such a completion (0 with no passes)
    instruction: str = "task"  # "task": the policy's own (or the task's); "worked": worked_instruction's
    temperature: float | None = None  # of the sampled rate (None in results written before it was recorded)


@dataclass
class Tally:
    """Completions scored under one setting: how many passed, how many the token limit ended, and how many of the
    passes were among those."""
    completions: int = 0
    passed: float = 0.0
    cut_off: int = 0
    passed_cut_off: float = 0.0

    def add(self, scores: list[float], cut_off: list[bool]) -> None:
        """Count one batch: each completion's score and whether the token limit ended it."""
        self.completions += len(scores)
        self.passed += sum(scores)
        self.cut_off += sum(cut_off)
        self.passed_cut_off += sum(s for s, c in zip(scores, cut_off) if c)

    @property
    def rate(self) -> float:
        """The pass rate."""
        return self.passed / self.completions if self.completions else 0.0

    @property
    def cut_off_share(self) -> float:
        """The share of completions the token limit ended."""
        return self.cut_off / self.completions if self.completions else 0.0

    @property
    def passes_cut_off_share(self) -> float:
        """The share of passes read from a completion the token limit ended (0 with no passes)."""
        return self.passed_cut_off / self.passed if self.passed else 0.0

    def __add__(self, other: "Tally") -> "Tally":
        """Both tallies' counts together (a cell's greedy and sampled completions)."""
        return Tally(self.completions + other.completions, self.passed + other.passed, self.cut_off + other.cut_off,
                     self.passed_cut_off + other.passed_cut_off)


def signal_share(p: float, group_size: int) -> float:
    """The probability that G independent samples at pass rate p do not all agree."""
    return 1.0 - p ** group_size - (1.0 - p) ** group_size


def worked_instruction(fmt: str) -> str:
    """The instruction of a worked cell: write each intermediate result, then the answer in format ``fmt``."""
    return ("Work it out step by step and write each intermediate result. "
            + INSTRUCTIONS[fmt].removeprefix("Solve the problem. "))


def _styles(cfg: ExperimentConfig, index: int, tok) -> list[str]:
    p = cfg.policies[index]
    if not p.model.path:
        return ["bare"]
    styles = ["chat"] if getattr(tok, "chat_template", None) else []
    return styles + ["completion"]


def _style(cfg: ExperimentConfig, index: int, style: str, fmt: str, worked: bool = False) -> PromptStyle:
    p = cfg.policies[index]
    instruction = worked_instruction(fmt) if worked else policy_instruction(cfg, p, fmt)
    if style == "chat":
        return PromptStyle(chat_template=True, instruction=instruction)
    if style == "completion":
        return PromptStyle(chat_template=False, instruction=instruction, completion_template=p.prompt.template,
                           stop=tuple(p.prompt.stop) if p.prompt.stop is not None else None)
    return PromptStyle(chat_template=False, instruction=instruction)


def _rate(model, tok, problems, verifier, style: PromptStyle, max_new_tokens: int, temperature: float,
          seed: int, batch: int) -> Tally:
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    tally = Tally()
    for i in range(0, len(problems), batch):
        part = problems[i : i + batch]
        done = scored_completions(model, tok, part, max_new_tokens, temperature, style, gen)
        tally.add(verifier.score_many(part, [c.text for c in done]), [c.cut_off for c in done])
    return tally


def probe(cfg: ExperimentConfig, n: int = 32, formats: tuple[str, ...] = DEFAULT_FORMATS,
          max_new_tokens: int | None = None, batch: int = 16, cache=None, worked: bool = False,
          worked_temperature: float = WORKED_TEMPERATURE, echo: Callable[[str], None] = lambda s: None) -> dict:
    """Every policy's greedy and sampled pass rate under every (format, style) on the first ``n`` held-out
    problems, and the pick (module docstring); with ``worked``, each also under :func:`worked_instruction` sampled
    at ``worked_temperature``."""
    from mutualrl.models.cache import default_cache_dir

    cache = cache or default_cache_dir()
    task, _ = build_task_from_config(cfg)
    problems = task.eval[:n]
    tokens = max_new_tokens or cfg.budget.max_new_tokens
    G = cfg.budget.group_size
    cells: list[Cell] = []
    for index, p in enumerate(cfg.policies):
        pp = prepare_policy(cfg, index, task, build_verifier(cfg.task.verifier, task, formats[0]), cache, echo)
        model, tok = pp.arts.model, pp.arts.tokenizer
        runs = [("task", sampling_temperature(p))] + ([("worked", worked_temperature)] if worked else [])
        for style in _styles(cfg, index, tok):
            for fmt in formats:
                verifier = build_verifier(cfg.task.verifier, task, fmt)
                for instruction, temperature in runs:
                    if instruction == "worked" and not INSTRUCTIONS[fmt]:
                        continue  # "whole": the bare answer is the whole completion, there is no work to ask for
                    t0 = time.monotonic()
                    ps = _style(cfg, index, style, fmt, worked=instruction == "worked")
                    greedy = _rate(model, tok, problems, verifier, ps, tokens, 0.0, cfg.seed, batch)
                    sampled = _rate(model, tok, problems, verifier, ps, tokens, temperature, cfg.seed, batch)
                    both = greedy + sampled
                    cell = Cell(p.name, fmt, style, len(problems), greedy.rate, sampled.rate,
                                signal_share(sampled.rate, G), round(time.monotonic() - t0, 1), both.cut_off_share,
                                both.passes_cut_off_share, instruction, temperature)
                    cells.append(cell)
                    cut = (f"  cut off {cell.cut_off:.0%} (of passes {cell.passes_cut_off:.0%})" if cell.cut_off
                           else "")
                    echo(f"[{p.name}] {style:10s} {fmt:12s} {_instruction_text(instruction, temperature):14s} "
                         f"greedy {greedy.rate:6.1%}"
                         f"  sampled {sampled.rate:6.1%}{cut}  ({cell.seconds:.0f} s)")
        del pp, model
        gc.collect()
    return {"task": cfg.task.name, "dataset": cfg.task.dataset, "dataset_config": cfg.task.dataset_config,
            "problems": len(problems), "max_new_tokens": tokens, "group_size": G,
            "cells": [asdict(c) for c in cells],
            "pick": pick(cells, [p.name for p in cfg.policies], formats, tokens)}


def _instruction_text(instruction: str, temperature: float | None) -> str:
    return "task" if instruction == "task" else f"worked, T {temperature:g}"


def pick(cells: list[Cell], policies: list[str], formats: tuple[str, ...], max_new_tokens: int | None = None) -> dict:
    """The answer format maximising the weakest policy's best signal share, each policy's best style under it,
    and whether every policy then has room (and whether its passes can be trusted: module docstring)."""
    worked = [c for c in cells if c.instruction == "worked"]
    cells = [c for c in cells if c.instruction == "task"]  # the pick sets format and style, not the instruction

    def best(policy: str, fmt: str) -> Cell:
        mine = [c for c in cells if c.policy == policy and c.answer_format == fmt]
        return max(mine, key=lambda c: (c.signal, c.sampled))

    scored = {fmt: min(best(q, fmt).signal for q in policies) for fmt in formats}
    fmt = max(formats, key=lambda f: (scored[f], sum(best(q, f).sampled for q in policies)))
    chosen = {q: best(q, fmt) for q in policies}
    styles = {q: c.style for q, c in chosen.items()}
    outside = {q: c.sampled for q, c in chosen.items() if not ROOM[0] <= c.sampled <= ROOM[1]}
    note = ("every policy has room" if not outside else
            "no format gives every policy room: " + ", ".join(f"{q} samples {r:.0%}" for q, r in outside.items())
            + f" (outside {ROOM[0]:.0%}–{ROOM[1]:.0%}); make the task easier or harder for them, or let a peer's "
            "successes carry the policy (SGT)")
    unfinished = {q: c.passes_cut_off for q, c in chosen.items() if c.passes_cut_off >= CUT_OFF_PASSES}
    if unfinished:
        limit = f"{max_new_tokens} tokens" if max_new_tokens else "the token limit"
        note += ("; " + ", ".join(f"{r:.0%} of {q}'s passes" for q, r in unfinished.items())
                 + f" were read from completions cut off at {limit}, where a stray number can match: raise "
                 "budget.max_new_tokens (probe: --max-new-tokens) before trusting these rates")
    cold = _cold_starts(chosen, worked)
    if cold:
        note += "; " + "; ".join(cold.values())
    return {"answer_format": fmt, "styles": styles, "weakest_signal": scored[fmt], "room": not outside,
            "note": note, "cold": cold, "overrides": [f"task.answer_format={fmt}"]
            + [f"policies.{q}.prompt.style={s}" for q, s in styles.items()]}


def _cold_starts(chosen: dict[str, Cell], worked: list[Cell]) -> dict[str, str]:
    """Per picked policy under RL's room (< 10 % sampled) with worked cells under its picked format: what its best
    worked cell says of why it is cold (module docstring)."""
    found: dict[str, str] = {}
    for q, c in chosen.items():
        mine = [w for w in worked if w.policy == q and w.answer_format == c.answer_format]
        if c.sampled >= ROOM[0] or not mine:
            continue
        w = max(mine, key=lambda w: w.sampled)
        how = f"asked to show its work ({w.style}, T {w.temperature:g}) {q} samples {w.sampled:.0%}"
        if w.sampled >= ROOM[0]:
            found[q] = (f"{how}: it is cold by its instruction, not by skill; give it a worked instruction "
                        f"(policies.{q}.prompt.instruction) rather than a peer's hints")
        elif w.sampled <= COLD and c.sampled <= COLD:
            found[q] = f"{how}: a cold start in skill, where a peer's hint may help (mutualrl probe-hints)"
        else:
            found[q] = f"{how}: under {ROOM[0]:.0%} either way"
    return found


def render(result: dict) -> str:
    """The probe's table and pick as Markdown."""
    lines = ["| policy | style | answer format | instruction | greedy | sampled | signal share | cut off (of passes) |",
             "|---|---|---|---|---|---|---|---|"]
    for c in result["cells"]:
        instruction = _instruction_text(c.get("instruction", "task"), c.get("temperature"))  # older results: task
        lines.append(f"| {c['policy']} | {c['style']} | {c['answer_format']} | {instruction} | "
                     f"{c['greedy']:.1%} | {c['sampled']:.1%} | {c['signal']:.2f} | {c.get('cut_off', 0.0):.0%} "
                     f"({c.get('passes_cut_off', 0.0):.0%}) |")
    pk = result["pick"]
    lines += ["", f"Pick: `task.answer_format: {pk['answer_format']}`; styles: "
              + ", ".join(f"{q} `{s}`" for q, s in pk["styles"].items()) + f". {pk['note']}.",
              "", "Overrides: " + " ".join(f"`--set {o}`" for o in pk["overrides"])]
    return "\n".join(lines)
