"""What every service process shares: its slice of the run (task, policies, exchange), a
stop flag wired to SIGTERM/SIGINT, structured logs, and the ops endpoint."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from typing_extensions import override

from mutualrl.config import ExperimentConfig, load_config
from mutualrl.models.cache import default_cache_dir
from mutualrl.runtime.exchange_setup import exchange_over, redis_options
from mutualrl.runtime.policy_setup import build_task_from_config
from mutualrl.see import RedisBroker


@dataclass
class ServiceArgs:
    """The command-line arguments every `mutualrl serve` role shares."""
    config: Path
    policy: str
    namespace: str
    redis_url: str
    weights_dir: Path
    out_dir: Path
    ops_port: int = 0
    grpc_port: int = 0
    weights_group: str | None = None  # collective transport: the learner's rendezvous, host:port


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, service, message and any ``extra`` fields."""

    def __init__(self, service: str):
        super().__init__()
        self.service = service

    @override
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": round(record.created, 3), "level": record.levelname.lower(), "service": self.service,
               "msg": record.getMessage()}
        out.update(getattr(record, "fields", {}))
        return json.dumps(out)


def service_logger(service: str) -> logging.Logger:
    """A service's logger: one JSON object a line on stdout, named after the service. The libraries' loggers
    (``mutualrl.*``: the own and peer intakes, the weights handshake, ...) write through the same formatter, so
    every line a service prints has its level, time, service and fields — not Python's bare last-resort text
    (which also drops everything below WARNING)."""
    for name in (f"mutualrl.{service}", "mutualrl"):
        log = logging.getLogger(name)
        log.setLevel(logging.INFO)
        if not log.handlers:
            h = logging.StreamHandler(sys.stdout)
            h.setFormatter(JsonFormatter(service))
            log.addHandler(h)
    log = logging.getLogger(f"mutualrl.{service}")
    log.propagate = False
    return log


def stop_flag() -> threading.Event:
    """Set on SIGTERM/SIGINT: loops finish the step they are in, then shut down cleanly."""
    ev = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: ev.set())
    return ev


class ServiceContext:
    """What a running service holds: its config, task, exchange and stop signal."""
    def __init__(self, args: ServiceArgs):
        import torch

        if os.environ.get("MUTUALRL_TORCH_THREADS"):
            torch.set_num_threads(int(os.environ["MUTUALRL_TORCH_THREADS"]))
        self.args = args
        self.cfg: ExperimentConfig = load_config(args.config)
        self.index = [p.name for p in self.cfg.policies].index(args.policy)
        self.policy_cfg = self.cfg.policies[self.index]
        self.task, self.verifier = build_task_from_config(self.cfg)
        self.cache = default_cache_dir()
        self.exchange = exchange_over(self.cfg, RedisBroker(redis_options(self.cfg.broker, args.redis_url)),
                                      args.namespace)
        self.state_dir = args.out_dir / "services"
        self.state_dir.mkdir(parents=True, exist_ok=True)

    def last_step(self, role: str, policy: str | None = None) -> int:
        """The newest step a service announced (its heartbeat), 0 before the first."""
        hb = self.exchange.last("heartbeat", f"{policy or self.args.policy}.{role}")
        return int(hb.payload.step) if hb is not None else 0

    def wait_for(self, predicate, timeout_s: float, stop: threading.Event, poll_s: float = 0.02,
                 idle: Callable[[float], object] | None = None) -> bool:
        """Poll ``predicate`` until it holds (True), the timeout passes or ``stop`` is set (False). Between polls,
        ``idle(poll_s)`` runs in place of a sleep of ``poll_s`` (a service's main thread runs the engine calls
        other threads handed it: mutualrl.runtime.owner_thread)."""
        deadline = time.monotonic() + timeout_s
        while not stop.is_set():
            if predicate():
                return True
            if time.monotonic() >= deadline:
                return False
            if idle is not None:
                idle(poll_s)
            else:
                time.sleep(poll_s)
        return False
