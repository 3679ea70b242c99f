"""A real MLflow tracking server on loopback with a SQLite store, started from its own virtual environment
(`make test` installs it into .venv-mlflow, whose dependencies would fight the project's): what the tracker
tests and `benchmarks/bench_tracking.py` log to."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from mutualrl.see.server import free_port

DEFAULT_BINARY = Path(__file__).resolve().parents[1] / ".venv-mlflow" / "bin" / "mlflow"


def mlflow_binary() -> Path:
    """``MUTUALRL_MLFLOW_SERVER``, else the project's .venv-mlflow."""
    return Path(os.environ.get("MUTUALRL_MLFLOW_SERVER", DEFAULT_BINARY))


def _own_group(nice: int) -> None:
    """In the child before exec: a process group of its own (``process_group=0`` needs Python 3.11), at
    priority ``nice``."""
    os.setpgid(0, 0)
    if nice:
        os.nice(nice)


class MlflowServer:
    """``mlflow server`` in its own process group (in the caller's session), storing under ``workdir``;
    ``stop()`` kills the group."""

    def __init__(self, workdir: Path, binary: Path | None = None):
        self.workdir, self.binary = workdir, binary or mlflow_binary()
        self.proc: subprocess.Popen | None = None
        self.uri = ""

    def start(self, timeout_s: float = 180, nice: int = 0) -> "MlflowServer":
        """Start it (at CPU priority ``nice``) and wait until /health answers; its log is ``workdir/mlflow.log``."""
        if not self.binary.exists():
            raise FileNotFoundError(f"no MLflow server at {self.binary}: `make test` installs it into .venv-mlflow")
        port = free_port()
        self.proc = subprocess.Popen(
            [str(self.binary), "server", "--backend-store-uri", f"sqlite:///{self.workdir}/mlflow.db",
             "--artifacts-destination", str(self.workdir / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1"],
            stdout=open(self.workdir / "mlflow.log", "wb"), stderr=subprocess.STDOUT,
            # its own process group, so stop() can kill its workers, but the caller's session: with the
            # kernel's autogroup scheduling (sched_autogroup_enabled) a new session is a new CPU group that
            # competes with training as an equal, and ``nice`` only acts within a group
            preexec_fn=lambda: _own_group(nice), env=self._env())
        self.uri = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the MLflow server exited with {self.proc.returncode}; see "
                                   f"{self.workdir / 'mlflow.log'}")
            try:
                urllib.request.urlopen(self.uri + "/health", timeout=2).read()
                return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"the MLflow server did not answer in {timeout_s:g} s; see {self.workdir / 'mlflow.log'}")

    @staticmethod
    def _env() -> dict[str, str]:
        """MLflow 3's server starts a job runner and seven task consumers (prompt optimisation, trace
        rollups) that tracking does not use: they keep the cores busy for tens of seconds after /health
        answers and poll at ~2.5 % of a core afterwards, which a test or a benchmark beside it would pay for."""
        return {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}

    def cpu_seconds(self) -> float:
        """CPU time used so far by the server and its worker processes."""
        import psutil

        total = 0.0
        root = psutil.Process(self.proc.pid)
        for proc in [root, *root.children(recursive=True)]:
            try:
                t = proc.cpu_times()
                total += t.user + t.system
            except psutil.Error:  # a worker that just exited
                continue
        return total

    def settle(self, idle_share: float = 0.05, window_s: float = 5.0, timeout_s: float = 180) -> float:
        """Wait until the server is idle (under ``idle_share`` of a core over ``window_s``): MLflow 3 keeps two
        cores busy for tens of seconds after /health answers, starting its job workers, which a measurement
        beside it must not pay for. Returns the seconds waited."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            before = self.cpu_seconds()
            time.sleep(window_s)
            if self.cpu_seconds() - before < idle_share * window_s:
                break
        return time.monotonic() - t0

    def stop(self) -> None:
        """Kill it (and its workers) at once, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
