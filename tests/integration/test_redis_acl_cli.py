"""`mutualrl redis acl` for a Redis the user runs: it prints the per-service users (making up passwords it is not
given, as env lines), applies them to a real Redis server, where each service may then append only to its own
streams, and refuses to apply users whose passwords the services would not know."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import redis

from mutualrl.see.acl import password_env
from mutualrl.see.server import RedisServer

POLICIES = ("llama-char", "qwen-bpe")


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mutualrl.app.cli", "redis", "acl", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=60)


def passwords() -> dict[str, str]:
    return {password_env(f"{p}.{r}"): f"pw-{p}-{r}" for p in POLICIES for r in ("rollout", "learner")}


def test_it_prints_the_users_and_the_passwords_it_made_up():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MUTUALRL_REDIS_PASSWORD_")}
    p = subprocess.run([sys.executable, "-m", "mutualrl.app.cli", "redis", "acl", "--config", "examples/demo.yaml"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    made = [ln for ln in lines if ln.startswith("# MUTUALRL_REDIS_PASSWORD_")]
    setusers = [ln for ln in lines if ln.startswith("ACL SETUSER ")]
    assert len(made) == 4 and len(setusers) == 4
    assert {ln.split()[2] for ln in setusers} == {f"{p}.{r}" for p in POLICIES for r in ("rollout", "learner")}


def test_applied_users_may_append_only_to_their_own_streams(tmp_path):
    with RedisServer(password="admin-pw") as srv:
        url = f"redis://:admin-pw@127.0.0.1:{srv.port}/0"
        p = cli("--policy", "llama-char", "--policy", "qwen-bpe", "--namespace", "mutualrl:lab", "--apply",
                "--redis", url, env=passwords())
        assert p.returncode == 0, p.stderr
        me = redis.Redis(port=srv.port, username="llama-char.rollout", password="pw-llama-char-rollout")
        me.xadd("mutualrl:lab:rollout:llama-char", {"d": b"x"})
        with pytest.raises(redis.exceptions.NoPermissionError):
            me.xadd("mutualrl:lab:rollout:qwen-bpe", {"d": b"x"})
        with pytest.raises(redis.exceptions.NoPermissionError):
            me.xadd("mutualrl:other-run:rollout:llama-char", {"d": b"x"})
        learner = redis.Redis(port=srv.port, username="qwen-bpe.learner", password="pw-qwen-bpe-learner")
        assert learner.xlen("mutualrl:lab:rollout:llama-char") == 1
        # applying again (a re-install) updates the same users
        assert cli("--policy", "llama-char", "--policy", "qwen-bpe", "--namespace", "mutualrl:lab", "--apply",
                   "--redis", url, env=passwords()).returncode == 0


def test_it_will_not_apply_users_without_their_passwords_or_to_a_closed_port():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MUTUALRL_REDIS_PASSWORD_")}
    p = subprocess.run([sys.executable, "-m", "mutualrl.app.cli", "redis", "acl", "--policy", "a", "--apply",
                        "--redis", "redis://127.0.0.1:1/0"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode != 0 and "MUTUALRL_REDIS_PASSWORD_A_ROLLOUT" in p.stdout + p.stderr
    p = cli("--policy", "a", "--apply", "--redis", "redis://127.0.0.1:1/0",
            env={password_env("a.rollout"): "x", password_env("a.learner"): "y"})
    assert p.returncode != 0 and "127.0.0.1:1" in p.stdout + p.stderr
