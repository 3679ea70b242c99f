"""A learner sharded over N ranks on one host (FSDP2, mutualrl.models.sharding).

The learner service is rank 0: it alone reads SEE, gathers and scores each step's experience,
publishes weights, serves metrics and writes the run's records. It starts ranks 1..N-1 itself,
as child processes (`mutualrl serve learner-rank`), so every launcher — `mutualrl up`, compose,
the chart, MWRA's pods — runs one learner command per policy. Every step, rank 0 hands its
gathered :class:`~mutualrl.services.learner.update.StepInputs` to the other ranks
(``broadcast_object_list``), and all ranks run the same update, gather the weights to publish,
evaluate and checkpoint in lockstep: a sharded model's forward and backward are collectives.

N is the GPUs this process sees on a GPU host (the local plan's ``CUDA_VISIBLE_DEVICES``, or a
pod's ``nvidia.com/gpu``), else ``resources.learner_gpus`` CPU ranks over gloo. Each rank
checkpoints its own shards beside rank 0's state; a rank that dies takes the group down, the
service exits, and its launcher restarts it, all ranks resuming from their shards.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from mutualrl.config.schema import PolicyConfig
from mutualrl.runtime.memory import reuse_freed_pages

RANK_TIMEOUT_S = 1800.0  # a collective waits this long for a rank before the group fails


def learner_world(p: PolicyConfig) -> int:
    """How many ranks a policy's learner runs on: the GPUs it sees (GPU host), else
    ``resources.learner_gpus`` CPU ranks."""
    if p.engine.device.startswith("cuda") and torch.cuda.is_available():
        return max(1, torch.cuda.device_count())
    return p.resources.learner_gpus


def rank_device(p: PolicyConfig, rank: int) -> str:
    """Rank k trains on the k-th visible GPU (CPU ranks on the CPU)."""
    return f"cuda:{rank}" if p.engine.device.startswith("cuda") else p.engine.device


def init_group(rank: int, world: int, port: int, device: str) -> None:
    """The learner's training group on loopback (rank 0 hosts the rendezvous)."""
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=RANK_TIMEOUT_S))


def rank_state_path(state_dir: Path, policy: str, rank: int = 0) -> Path:
    """Where a learner's rank keeps its state file: rank 0 (the learner service itself, sharded or not) the whole
    learner's, rank k > 0 its shards of the model and optimiser. `mutualrl up` reads rank 0's to tell a learner that
    will resume."""
    return state_dir / (f"{policy}.learner.state.pt" if rank == 0 else f"{policy}.learner.state.r{rank}.pt")


class RankGroup:
    """Rank 0's handle on the other ranks: starts them, sends each command, watches them."""

    def __init__(self, argv: list[str], world: int, port: int):
        self.world = world
        self.procs = [subprocess.Popen([*argv, "--rank", str(k), "--world", str(world), "--dist-port",
                                        str(port)]) for k in range(1, world)]
        self._failed = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while not self._failed.is_set():
            if any(p.poll() not in (None, 0) for p in self.procs):
                self._failed.set()
                return
            time.sleep(0.5)

    def send(self, command: str, payload=None) -> None:
        """Every rank runs ``command`` next (a collective: they wait for it)."""
        if self._failed.is_set():
            codes = [p.poll() for p in self.procs]
            raise RuntimeError(f"a learner rank exited (exit codes {codes}); the sharded learner stops and is "
                               "restarted")
        dist.broadcast_object_list([(command, payload)], src=0)

    def stop(self) -> None:
        """Tell the ranks to stop and wait for their processes (killing those that do not exit)."""
        try:
            self.send("stop")
        except Exception:  # noqa: BLE001 - the group is already down; the ranks exit on their own
            pass
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def receive() -> tuple[str, object]:
    """On a rank other than 0: the next (command, argument) rank 0 broadcasts."""
    box: list = [None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def exit_with_parent() -> None:
    """A rank whose rank 0 died (kill -9) is orphaned: it exits instead of waiting on the group."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(3)
            time.sleep(1.0)

    threading.Thread(target=watch, daemon=True).start()


def rank_argv(config: Path, policy: str) -> list[str]:
    """The command of ranks 1..N-1: this module's own entry point (:func:`main`; the rank flags are appended by
    :class:`RankGroup`)."""
    return [sys.executable, "-m", __name__, "--config", str(config), "--policy", policy]


def run_learner_rank(config: Path, policy: str, out_dir: Path, rank: int, world: int, port: int) -> int:
    """Rank k > 0 of a sharded learner: the same model, sharded the same way, running rank 0's
    commands through the same :class:`~mutualrl.services.learner.loop.LearnerLoop` until it says
    stop. It reads nothing from SEE and publishes nothing: its exchange is an empty in-process
    one, and only rank 0 publishes the weights the ranks gather together."""
    from mutualrl.config import load_config
    from mutualrl.models.cache import default_cache_dir
    from mutualrl.models.sharding import shard_policy
    from mutualrl.runtime.policy_setup import build_task_from_config, evaluate
    from mutualrl.see import ExperienceExchange, InProcessBroker
    from mutualrl.services.learner.loop import Checkpoints, LearnerLoop, follow_rank0
    from mutualrl.services.learner.setup import service_learner
    from mutualrl.weights import WeightStore

    exit_with_parent()
    reuse_freed_pages()  # a rank is started with ``-m`` of this module, not through the CLI's main
    if os.environ.get("MUTUALRL_TORCH_THREADS"):
        torch.set_num_threads(int(os.environ["MUTUALRL_TORCH_THREADS"]))
    cfg = load_config(config)
    index = [q.name for q in cfg.policies].index(policy)
    p = cfg.policies[index]
    device = rank_device(p, rank)
    init_group(rank, world, port, device)
    task, verifier = build_task_from_config(cfg)
    exchange = ExperienceExchange(InProcessBroker(), f"mutualrl:rank{rank}")
    shard = (lambda model: shard_policy(model, mixed_precision=device.startswith("cuda"),
                                        activation_checkpointing=p.resources.activation_checkpointing))
    pp, learner = service_learner(cfg, index, task, verifier, default_cache_dir(), exchange, WeightStore(), shard=shard,
                                  device=device)
    loop = LearnerLoop(learner, lambda model, step: evaluate(pp, model, task, verifier, cfg), steps=cfg.budget.steps,
                       eval_every=cfg.eval_every(pp.config.name),
                       checkpoints=Checkpoints(rank_state_path(out_dir / "services", policy, rank),
                                               cfg.checkpoint.every), rank=rank)
    try:
        follow_rank0(loop, receive)
        return 0
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ranks 1..N-1 (``python -m mutualrl.services.learner.ranks``), started by rank 0's learner
    service; nothing else starts them."""
    import argparse

    ap = argparse.ArgumentParser(prog="mutualrl.services.learner.ranks", description=main.__doc__)
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--policy", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--dist-port", type=int, required=True)
    a = ap.parse_args(argv)
    if not 1 <= a.rank < a.world:
        ap.error(f"--rank must be 1..{a.world - 1} (rank 0 is the learner service)")
    return run_learner_rank(a.config, a.policy, a.out, a.rank, a.world, a.dist_port)


if __name__ == "__main__":
    sys.exit(main())
