"""The child process of :mod:`mutualrl.tracking.process`: runs one policy's guarded trackers on the
``metrics.jsonl`` records its parent pipes in, and reports back as JSON lines (the wire is described there).
Started as ``python -m mutualrl.tracking.child`` at low CPU priority; ends when the parent sends ``finish``
or closes the pipe (a parent that died: what waits is still sent, within ``timeout_s``)."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Callable

from mutualrl.config.tracking import TrackingConfig
from mutualrl.tracking.backend import RunInfo
from mutualrl.tracking.process import NICE, PROCESS
from mutualrl.tracking.tracker import DropCounter, WarnOnce, open_tracker


def _child_protocol():
    """The parent's pipe for events, and fd 1 pointed at stderr: a library that prints (wandb does) must not
    write into the protocol."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    lock = threading.Lock()

    def emit(event: dict) -> None:
        with lock:
            try:
                proto.write(json.dumps(event) + "\n")
                proto.flush()
            except (BrokenPipeError, OSError, ValueError):
                pass  # the parent is gone: nobody to tell
    return emit


def main() -> int:
    """Run one policy's trackers on the records the parent pipes in, until it closes the pipe."""
    emit = _child_protocol()
    try:
        os.setpriority(os.PRIO_PROCESS, 0, NICE)  # the parent set it too, but only once this had started
    except OSError:
        pass

    class Forward(WarnOnce):
        def __call__(self, backend: str, message: str) -> None:
            emit({"warn": [backend, message]})

    class Drops(DropCounter):
        def callback(self, backend: str, policy: str) -> Callable[[int], None]:
            return lambda n: emit({"drop": [backend, n]})

    first = sys.stdin.readline()
    try:
        start = json.loads(first)["start"]
        cfg = TrackingConfig.model_validate({**start["config"], "isolation": "thread"})
        info = RunInfo(**{**start["info"], "run_dir": Path(start["info"]["run_dir"])})
    except (ValueError, KeyError, TypeError) as e:
        emit({"warn": [PROCESS, f"tracking: the tracker process got a bad start line ({e})"]})
        return 2
    tracker = open_tracker(cfg, info, Forward(lambda m: None), drops=Drops())
    emit({"ready": tracker.names()})
    summary: dict = {}
    for raw in sys.stdin:
        try:
            msg = json.loads(raw)
        except ValueError:
            continue
        if "log" in msg:
            tracker.log(msg["log"])
        elif "finish" in msg:
            summary = msg["finish"]
            break
    emit({"done": tracker.finish(summary)})  # also at end of input without finish: the parent died
    return 0


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    # every tracker is closed (or its points counted as dropped): skip the libraries' exit hooks, which retry
    # a server that is down for seconds (MLflow's) after the parent has its numbers
    os._exit(code)
