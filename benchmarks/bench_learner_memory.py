"""A learner service's resident memory against the number and size of its peers.

Each case builds, in a fresh process, exactly what a learner service builds
(``services.learner.setup.service_learner``) for the demo's llama-char, and reports the peak
resident set: alone with the demo's peer, with a third, 100x larger peer added, and — the
baseline, in the same run — that first case plus the large peer's model actually loaded (what
preparing every policy used to cost). Goal: adding the large peer costs the learner < 10 %.

    .venv/bin/python benchmarks/bench_learner_memory.py
"""

from __future__ import annotations

import multiprocessing as mp
import resource
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIG = {"name": "big-qwen",
       "model": {"family": "qwen2", "hidden_size": 768, "num_layers": 12, "num_heads": 12, "intermediate_size": 3072,
                 "max_positions": 64},
       "tokenizer": {"kind": "bpe", "vocab_size": 300}, "warm_start": {"enabled": False}}


def _case(name: str, q) -> None:
    import torch

    from mutualrl.config import load_config
    from mutualrl.models.cache import default_cache_dir
    from mutualrl.runtime.policy_setup import build_task_from_config
    from mutualrl.see import ExperienceExchange, InProcessBroker
    from mutualrl.services.learner.setup import service_learner
    from mutualrl.weights import WeightStore

    torch.set_num_threads(1)
    cfg = load_config(ROOT / "examples" / "demo.yaml")
    if name != "two policies":
        cfg = cfg.model_copy(update={"policies": [*cfg.policies, type(cfg.policies[0]).model_validate(BIG)]})
    task, verifier = build_task_from_config(cfg)
    ex = ExperienceExchange(InProcessBroker(), "mutualrl:mem")
    pp, learner = service_learner(cfg, 0, task, verifier, default_cache_dir(), ex, WeightStore())
    params = sum(p.numel() for p in learner.model.parameters())
    if name == "peer model loaded (baseline)":
        from mutualrl.runtime.policy_setup import prepare_policy

        peer = prepare_policy(cfg, 2, task, verifier, default_cache_dir())
        params += sum(p.numel() for p in peer.arts.model.parameters())
    q.put((name, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, params))


def main() -> int:
    ctx = mp.get_context("spawn")
    rows = {}
    for name in ("two policies", "three, one 100x larger", "peer model loaded (baseline)"):
        q = ctx.Queue()
        p = ctx.Process(target=_case, args=(name, q))
        p.start()
        rows[name] = q.get(timeout=1800)
        p.join()
    for name, (_, rss, params) in rows.items():
        print(f"{name:32s} peak RSS {rss:8.0f} MiB   parameters in the process {params / 1e6:7.1f} M")
    base = rows["two policies"][1]
    grown = rows["three, one 100x larger"][1] / base
    loaded = rows["peer model loaded (baseline)"][1] / base
    print(f"ratio three/two: {grown:.2f} (goal < 1.10); with the peer's model loaded it would be {loaded:.2f}")
    return 0 if grown < 1.10 else 1


if __name__ == "__main__":
    raise SystemExit(main())
