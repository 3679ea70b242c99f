"""Loss + backward time of every sharing mode, as a ratio to GRPO in the same run.

64 groups × 8 completions × 256 tokens: the step's advantages (once) and the
mode's loss over the rows, then ``backward``, through the learner's own
composition (the mode's class, ``mutualrl.services.learner.modes``) — i.e. exactly what a training step adds on top
of the model's forward/backward. Log-probs are a leaf tensor so the model's
cost does not drown the differences. Modes with peer rows keep 512 rows in
total (per prompt: 4 own + 4 peer), so every mode processes the same tensor
volume; SGT adds its rescue rows (one per all-fail group), which it really pays.
Issue goal: every mode ≤ 1.3× GRPO.

    .venv/bin/python benchmarks/bench_losses.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mutualrl.config.schema import AlgorithmConfig, SharingConfig
from mutualrl.grpo import sgt_nll
from mutualrl.services.learner.modes import make_mode
from mutualrl.services.learner.objective import OWN, PEER, RESCUE, ROW_FIELDS, LossInputs, Rows, right_aligned
from mutualrl.services.learner.peer_experience import PeerStats

GROUPS, G, T = 64, 8, 256
CASES: dict[str, tuple[dict, dict]] = {
    "grpo": ({}, {"mode": "none"}),
    "gspo": ({"loss": "gspo", "loss_agg": "seq-mean-token-mean"}, {"mode": "none"}),
    "gspo_token": ({"loss": "gspo_token", "loss_agg": "seq-mean-token-mean"}, {"mode": "none"}),
    "naive": ({}, {"mode": "naive"}),
    "prp (sequence)": ({}, {"mode": "prp"}),
    "prp (token)": ({}, {"mode": "prp", "prp": {"ratio_level": "token"}}),
    "xgrpo (pooled)": ({}, {"mode": "xgrpo"}),
    "xgrpo (leave-self-out)": ({}, {"mode": "xgrpo", "xgrpo": {"variant": "leave_self_out"}}),
    "sgt (nll)": ({}, {"mode": "sgt"}),
    "sgt (group insert)": ({}, {"mode": "sgt", "sgt": {"variant": "group_insert"}}),
    "hacpo": ({"kl_coef": 0.001, "loss_agg": "seq-mean-token-mean"}, {"mode": "hacpo"}),
}


def build_rows(peer_rows: bool, gen: torch.Generator) -> tuple[Rows, Rows]:
    """(training rows with own rows first, rescue rows: one per all-fail own group)."""
    own, peer, rescue = Rows(), Rows(), Rows()
    for g in range(GROUPS):
        rewards = []
        for i in range(G):
            is_peer = peer_rows and i >= G // 2
            n = int(torch.randint(T // 2, T + 1, (1,), generator=gen))
            lp = (torch.rand(n, generator=gen) * -2).tolist()
            r = float(torch.rand(1, generator=gen) < 0.3)
            (peer if is_peer else own).add(
                prompt_token_ids=[1, 2, 3], token_ids=[5] * n, logprobs=lp, mask=[1.0] * n, reward=r, prompt_id=f"p{g}",
                source_policy="peer" if is_peer else "me", kind=PEER if is_peer else OWN,
                source_mean_logprob=sum(lp) / n,
            )
            rewards.append(r)
        if not any(rewards[: G // 2 if peer_rows else G]):
            n = T // 2
            rescue.add(prompt_token_ids=[1, 2, 3], token_ids=[5] * n, logprobs=[0.0] * n, mask=[1.0] * n, reward=1.0,
                       prompt_id=f"p{g}", source_policy="peer", kind=RESCUE, source_mean_logprob=0.0)
    for src in (peer,):
        for k in range(len(src)):
            own.add(**{f: getattr(src, f)[k] for f in FIELDS})
    return own, rescue


FIELDS = ROW_FIELDS


def time_case(alg: dict, sharing: dict, repeats: int) -> float:
    gen = torch.Generator().manual_seed(0)
    a, sh = AlgorithmConfig(**alg), SharingConfig(**sharing)
    rows, rescue = build_rows(sh.mode in ("naive", "prp", "hacpo"), gen)
    nll = sh.mode == "sgt" and sh.sgt.variant == "nll"
    if sh.mode == "sgt" and not nll:  # group insert: the rescues are training rows
        for k in range(len(rescue)):
            rows.add(**{f: getattr(rescue, f)[k] for f in FIELDS})
    stats = {f"p{g}": [PeerStats("peer", 8, 0.5, 0.53, 0.5)] for g in range(GROUPS)} if sh.mode == "xgrpo" else {}
    obj = make_mode("me", a, sh, T)
    if obj.tracker is not None:
        obj.tracker.update({"me": [1, 0, 0, 0], "peer": [1, 1, 0, 0]})
    old, mask = right_aligned(rows.logprobs, T), right_aligned(rows.mask, T)
    kind, src = torch.tensor(rows.kind), torch.tensor(rows.source_mean_logprob)
    base = old + torch.randn(old.shape, generator=gen) * 0.01 * mask
    ref = old.clone() if a.kl_coef > 0 else None
    r_base, r_mask = right_aligned(rescue.logprobs, T) - 1.0, right_aligned(rescue.mask, T)
    times = []
    for _ in range(repeats + 2):
        logp = base.clone().requires_grad_(True)
        r_logp = r_base.clone().requires_grad_(True)
        t0 = time.perf_counter()
        step_adv = obj.advantages(rows, stats)
        out = obj.loss(LossInputs(logp=logp, logprobs=old, mask=mask, advantages=step_adv.advantages, kind=kind,
                                  source_mean_logprob=src,
                                  omega=step_adv.omega, minibatch_index=0, ref_logp=ref))
        loss = out.loss + (0.1 * sgt_nll(r_logp, r_mask) if nll and len(rescue) else 0.0)
        loss.backward()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


def _busy(stop) -> None:
    """Another training process on the same cores (a peer's learner): matmuls until told to stop."""
    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    while not stop.is_set():
        a = torch.tanh(a @ a)


def contended(repeats: int) -> None:
    """GRPO's loss + backward while another process trains on the same 2 cores: with torch's
    default threads (one per core, spinning when oversubscribed) against threads sized to this
    process's share of the cores, as `mutualrl up` sizes them (MUTUALRL_TORCH_THREADS)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    other = ctx.Process(target=_busy, args=(stop,))
    other.start()
    try:
        time.sleep(2.0)
        out = {}
        for threads in (2, 1):
            torch.set_num_threads(threads)
            out[threads] = time_case(*CASES["grpo"], repeats)
    finally:
        stop.set()
        other.join()
    print(f"with another training process on the cores: {out[2] * 1e3:.1f} ms at 2 threads (one per core), "
          f"{out[1] * 1e3:.1f} ms at 1 thread (its share): {out[2] / out[1]:.1f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--contended", action="store_true",
                    help="Also time GRPO beside another training process, threads per core vs per share.")
    args = ap.parse_args()
    if args.contended:
        contended(args.repeats)
    torch.set_num_threads(2)
    base = time_case(*CASES["grpo"], args.repeats)
    print(f"{GROUPS} groups x {G} completions x {T} tokens; median of {args.repeats} (loss + backward, advantages "
          "included)")
    print(f"{'mode':<26}{'ms':>9}{'ratio to grpo':>16}")
    worst = 0.0
    for name, (alg, sh) in CASES.items():
        t = base if name == "grpo" else time_case(alg, sh, args.repeats)
        worst = max(worst, t / base)
        print(f"{name:<26}{t * 1e3:>9.2f}{t / base:>16.2f}")
    print(f"worst ratio {worst:.2f} (goal <= 1.30: {'met' if worst <= 1.3 else 'NOT met'})")


if __name__ == "__main__":
    main()
