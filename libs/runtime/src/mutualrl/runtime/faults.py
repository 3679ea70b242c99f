"""Fault injection for the crash tests: a real kill -9 at a named instant of a service's step.

``MUTUALRL_FAULT="policy/phase:step,…"`` arms the points; each fires once (a marker file in the
run's state directory survives the restart), so the restarted service then completes the run.
Unset, every point is a no-op (one environment lookup)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

FAULT_ENV = "MUTUALRL_FAULT"


def fault_point(phase: str, step: int, state_dir: Path, policy: str) -> None:
    """Kill this process with SIGKILL if ``policy/phase:step`` is armed and has not fired yet."""
    spec = os.environ.get(FAULT_ENV)
    if not spec or f"{policy}/{phase}:{step}" not in spec.split(","):
        return
    marker = Path(state_dir) / f"fault-{policy}-{phase}-{step}"
    if marker.exists():
        return
    marker.write_text("fired")
    os.kill(os.getpid(), signal.SIGKILL)
