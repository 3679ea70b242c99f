"""Resume points of `mutualrl run`: a run stopped between steps goes on from its newest one.

A real-model run takes hours on a CPU, longer than a working session or a spot instance lasts, and a
`mutualrl compare` of twelve such runs used to restart an unfinished run from step 1. With
``checkpoint.resume_every: K`` the embedded run writes, every K steps, one file holding every policy's
learner state (weights, optimiser, weights version, totals, peer reputation), its rollout count and the
numbers its summary needs, and the process's random state. Started again on the same ``--out`` with the
same config, the run restores it and trains from the next step.

What a resumed run shares with an uninterrupted one:
- its prompts, and each step's sampling seed, which depend on (seed, policy, step) only;
- the learners' state at the resume point, and the random state of torch, Python and NumPy;
- ``metrics.jsonl`` and ``evals/*.jsonl`` up to the resume point (lines of later steps, written before the
  stop, are dropped, then the steps are trained again).

What differs, on purpose: the weights versions go on one past the resume point's (versions never repeat,
as for a restarted learner service); SGT's bank of peers' successes starts empty, as a restarted learner's
does; a pipelined run (``async.max_staleness`` k > 0) samples the k steps after the resume point with the
restored weights instead of older ones. One file, written atomically: a stop while it is being written
leaves the previous one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from mutualrl.config import ConfigError, ExperimentConfig
from mutualrl.runtime.outputs import read_metrics
from mutualrl.services.learner.loop import restore_rng, rng_state, save_state

RESUME_FILE = "resume.pt"
# settings that may change between a run and its resumption without changing what it trains
_NOT_FINGERPRINTED = ("checkpoint", "tracking", "output_dir")


def config_fingerprint(cfg: ExperimentConfig) -> str:
    """What a resume point must agree with: the config as loaded, less how it is checkpointed and tracked.
    Taken before the run starts, and kept: loading the models settles settings the config left open
    (``optim.lr`` by a model's size), and a fingerprint taken after that would never match the config as a
    restarted run loads it. Settings at their defaults are left out, so a release that adds a setting (at a
    default that keeps today's behaviour) can resume the runs of the one before it: the fingerprint is of what the
    run was told, not of every setting the code knows."""
    data = cfg.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    for k in _NOT_FINGERPRINTED:
        data.pop(k, None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class PolicyResume:
    """One policy's part of a resume point, besides its learner state."""
    rollouts: int
    warm_accuracy: float
    warm_steps: int
    pass_rate: dict | None
    last_eval: float


@dataclass
class ResumePoint:
    """A loaded resume point: the last step it covers, each policy's learner state and numbers, the RL
    seconds and the run's wall seconds spent before it (over every invocation so far), and the random state to
    restore."""
    step: int
    learners: dict[str, dict]
    policies: dict[str, PolicyResume]
    rl_s: float
    rng: dict
    elapsed_s: float = 0.0  # 0 in a resume point written before this was kept

    def restore_rng(self) -> None:
        """The random state as it was after the resume point's step."""
        restore_rng(self.rng)


def resume_path(out_dir: Path) -> Path:
    """Where a run directory keeps its resume point."""
    return out_dir / RESUME_FILE


def load_resume_point(out_dir: Path, cfg: ExperimentConfig) -> ResumePoint | None:
    """The run directory's resume point, or None when it has none. One written for another config is an
    error (one line): training on would mix two experiments in one directory."""
    path = resume_path(out_dir)
    if not path.is_file():
        return None
    try:
        st = torch.load(path, weights_only=False)
    except Exception as e:  # noqa: BLE001 — a damaged file is the user's to remove, said in one line
        raise ConfigError(f"{path} cannot be read ({type(e).__name__}: {e}); remove it to start the run again from "
                          "step 1") from e
    if st.get("config") != config_fingerprint(cfg):
        raise ConfigError(f"{out_dir} holds a resume point of another config (step {st.get('step')}); give another "
                          f"--out, or remove {path} to start this one from step 1")
    names = {p.name for p in cfg.policies}
    if set(st["learners"]) != names:
        raise ConfigError(f"{path} holds policies {sorted(st['learners'])}, the config {sorted(names)}")
    return ResumePoint(step=int(st["step"]), learners=st["learners"],
                       policies={k: PolicyResume(**v) for k, v in st["policies"].items()},
                       rl_s=float(st.get("rl_s", 0.0)), rng=st["rng"], elapsed_s=float(st.get("elapsed_s", 0.0)))


def save_resume_point(out_dir: Path, fingerprint: str, step: int, learners: dict[str, dict],
                      policies: dict[str, PolicyResume], rl_s: float, elapsed_s: float = 0.0) -> None:
    """Write the resume point of ``step`` for the config of ``fingerprint`` (:func:`config_fingerprint` of
    the config as loaded), atomically: the previous one stays until this one is whole."""
    state = {"config": fingerprint, "step": step, "learners": learners,
             "policies": {k: vars(v) for k, v in policies.items()}, "rl_s": rl_s, "elapsed_s": elapsed_s,
             "rng": rng_state()}
    save_state(resume_path(out_dir), state, step)


def discard_resume_point(out_dir: Path) -> None:
    """The run finished (its final checkpoints and summary are written): the resume point has served."""
    resume_path(out_dir).unlink(missing_ok=True)


def keep_lines_until(path: Path, step: int) -> list[dict]:
    """The JSON lines of ``path`` whose ``step`` is at most ``step`` (the file rewritten with only them);
    lines of later steps were trained before a stop and will be trained again."""
    if not path.is_file():
        return []
    kept = [r for r in read_metrics(path) if int(r.get("step", 0)) <= step]
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    return kept
