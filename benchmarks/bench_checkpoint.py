"""What exactly-once checkpointing costs a learner: training steps with the learner service's
checkpoint (model, optimiser, ledger, records; fsync'd, atomic rename) every K steps, against the
same steps without one, in one process. Goal: overhead at K = 10 <= 10 %.

    .venv/bin/python benchmarks/bench_checkpoint.py [--steps 20] [--every 10] [--hidden 512] [--layers 8]

Rollouts are published straight onto the learner's own stream (no generation), so the time is
the learner's: logprobs, loss, backward, optimiser, weight publish — and the checkpoint.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch

from mutualrl.config import AlgorithmConfig, SharingConfig
from mutualrl.config.schema import OptimConfig
from mutualrl.models import load_policy
from mutualrl.models.families import ModelShape
from mutualrl.see import ExperienceExchange, InProcessBroker
from mutualrl.services.learner import Learner, LearnerSettings, PeerIntake, TokenizerRegistry
from mutualrl.services.learner.loop import save_state
from mutualrl.tasks import build_task
from mutualrl.thl import ThlBudget
from mutualrl.v1 import experience_pb2 as pb
from mutualrl.weights import WeightStore


def make_learner(hidden: int, layers: int):
    task = build_task("arithmetic", seed=0, min_digits=3, max_digits=3, train_size=2000, eval_size=16)
    arts = load_policy(family="llama",
                       shape=ModelShape(hidden_size=hidden, num_layers=layers, num_heads=8,
                                        intermediate_size=4 * hidden, max_positions=64),
                       tokenizer_kind="char", corpus=task.corpus, corpus_fingerprint=task.fingerprint(), seed=0)
    ex = ExperienceExchange(InProcessBroker(), "mutualrl:bench")
    reg = TokenizerRegistry()
    reg.register(arts.fingerprint, arts.tokenizer)
    from mutualrl.tasks.verifiers import ExactMatchVerifier

    intake = PeerIntake(arts.tokenizer, ExactMatchVerifier(), reg, ThlBudget())
    settings = LearnerSettings(group_size=8, algorithm=AlgorithmConfig(), sharing=SharingConfig(mode="none"),
                               optim=OptimConfig(lr=1e-5), peer_deadline_s=5.0)
    learner = Learner("a", arts.model, arts.tokenizer, ex, intake, WeightStore(), settings, peers=[])
    return learner, ex, arts, task


def publish_step(ex, arts, problems, step: int, rng: random.Random) -> None:
    tok = arts.tokenizer
    for p in problems:
        prompt = tok(p.prompt)["input_ids"]
        for i in range(8):
            text = p.answer if rng.random() < 0.4 else str(rng.randint(100, 1998))
            ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            ex.publish(pb.Rollout(prompt_id=p.prompt_id, prompt_text=p.prompt, completion_text=text,
                                  prompt_token_ids=prompt, token_ids=ids,
                                  logprobs=[-1.0] * len(ids), reward=1.0 if text == p.answer else 0.0, step=step,
                                  sample_index=i, group_size=8), "a")


def timed_steps(steps: int, every: int | None, hidden: int, layers: int, state_dir: Path) -> float:
    learner, ex, arts, task = make_learner(hidden, layers)
    rng = random.Random(0)
    ledger: dict[int, dict] = {}
    records: list[dict] = []
    total = 0.0
    for step in range(1, steps + 1):
        problems = task.train[(step - 1) * 16: step * 16]
        publish_step(ex, arts, problems, step, rng)
        t = time.perf_counter()
        rec = learner.train_step(step, problems, commit=False)
        ledger[step] = learner.last_used
        records.append(rec.to_dict())  # as the loop checkpoints them
        if every is not None and step % every == 0:
            rng_state = {"torch": torch.get_rng_state(), "python": random.getstate()}
            save_state(state_dir / "a.learner.state.pt",
                       {"learner": learner.state_dict(), "step": step, "rng": rng_state, "ledger": ledger,
                        "records": records}, step)
        learner.commit()
        total += time.perf_counter() - t
    return total / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        base = timed_steps(args.steps, None, args.hidden, args.layers, Path(tmp))
        ckpt = timed_steps(args.steps, args.every, args.hidden, args.layers, Path(tmp))
        size = (Path(tmp) / "a.learner.state.pt").stat().st_size
    params = args.hidden * args.hidden * 12 * args.layers
    print(f"model ~{params / 1e6:.0f}M params (hidden {args.hidden}, {args.layers} layers); checkpoint "
          f"{size / 1e6:.0f} MB")
    print(f"mean step without checkpoints           {base * 1000:8.1f} ms")
    print(f"mean step, checkpoint every {args.every:<3d}         {ckpt * 1000:8.1f} ms")
    print(f"overhead                                {(ckpt / base - 1) * 100:8.1f} %   (goal <= 10 %)")


if __name__ == "__main__":
    main()
