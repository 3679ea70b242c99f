"""Open the SEE exchange a run's config asks for (in-process, or Redis — a given URL or a
local server started for the run and stopped with it)."""

from __future__ import annotations

import os
import time
import uuid
from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator

from mutualrl.config import ConfigError, ExperimentConfig
from mutualrl.config.schema import BrokerConfig
from mutualrl.see import Backpressure, ExperienceExchange, InProcessBroker, RedisBroker, RedisOptions
from mutualrl.see.broker import Broker
from mutualrl.see.identity import SEE_KEYS_ENV, Keyring, parse_keys

# set by `mutualrl up` for each service it starts: its own Redis identity, and a generated run key
REDIS_USERNAME_ENV = "MUTUALRL_REDIS_USERNAME"
REDIS_PASSWORD_ENV = "MUTUALRL_REDIS_PASSWORD"
RUN_HMAC_ENV = "MUTUALRL_RUN_HMAC_KEY"


def _env(name: str | None, what: str) -> str | None:
    if name is None:
        return None
    value = os.environ.get(name)
    if value is None:
        raise ConfigError(f"{what}: environment variable {name} is not set")
    return value


def hmac_key(b: BrokerConfig) -> bytes | None:
    """The run key named by ``broker.hmac_key_env`` (ConfigError when that variable is unset)."""
    key = _env(b.hmac_key_env, "broker.hmac_key_env")
    return key.encode() if key else None


def see_keys(b: BrokerConfig) -> Keyring | None:
    """This process's signing keys: the per-service keys `mutualrl up` hands each service
    (``MUTUALRL_SEE_KEYS``: its own and those of the services it reads), else every key
    derived from the run key ``broker.hmac_key_env`` names; None when signing is off.
    ConfigError when the config names a key variable that is unset and no keys were given."""
    try:
        given = parse_keys(os.environ.get(SEE_KEYS_ENV, ""))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if given:
        return Keyring(given)
    key = hmac_key(b)
    return Keyring(run_key=key) if key else None


def redis_options(b: BrokerConfig, url: str) -> RedisOptions:
    """Connection options from the broker config (the password read from ``password_env``); a
    service started by `mutualrl up` uses the identity `up` gave it instead."""
    if os.environ.get(REDIS_USERNAME_ENV):
        username, password = os.environ[REDIS_USERNAME_ENV], os.environ.get(REDIS_PASSWORD_ENV)
    else:
        username, password = b.username, _env(b.password_env, "broker.password_env")
    return RedisOptions(
        url=url, username=username, password=password, tls=b.tls,
        tls_ca_certs=b.tls_ca_certs, tls_certfile=b.tls_certfile, tls_keyfile=b.tls_keyfile,
    )


def _redact(url: str) -> str:
    """The URL without its password, for messages."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


def run_namespace(cfg: ExperimentConfig) -> str:
    """``mutualrl:<run name>:<run id>``: a shared Redis may hold several runs (and reruns)."""
    return f"mutualrl:{cfg.name}:{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"


def probe_broker(opts: RedisOptions) -> None:
    """Fail fast at start-up (ConfigError, one line) when Redis cannot be reached; services
    retry patiently later. `mutualrl run` and `mutualrl up` both call it."""
    probe = RedisBroker(replace(opts, retries=2, socket_timeout_s=3.0))
    try:
        probe.ping()
    except Exception as e:  # noqa: BLE001 - any failure to reach the server is a config problem here
        raise ConfigError(f"cannot reach Redis at {_redact(opts.url)}: {e}") from e
    finally:
        probe.close()


def exchange_over(cfg: ExperimentConfig, broker: Broker, namespace: str) -> ExperienceExchange:
    """The run's exchange over ``broker``: signing key, retention and backpressure from the
    config — the one construction `mutualrl run`, every `mutualrl serve` service and so `up`
    share, so they cannot drift apart."""
    b = cfg.broker
    backpressure = Backpressure(b.max_backlog, b.on_backlog, b.block_timeout_s) if b.max_backlog else None
    return ExperienceExchange(
        broker, namespace, keys=see_keys(b), max_len=b.max_len,
        max_age_ms=int(b.max_age_s * 1000) if b.max_age_s else None, backpressure=backpressure,
    )


@contextmanager
def open_exchange(cfg: ExperimentConfig, namespace: str | None = None) -> Iterator[ExperienceExchange]:
    """The experiment's SEE exchange (in-process, or Redis with a server started when none is given), closed on exit."""
    b = cfg.broker
    see_keys(b)  # fails before a server starts when the key it names is unset
    server = None
    broker: Broker
    if b.backend == "inprocess":
        broker = InProcessBroker()
    else:
        url = b.url
        if url is None:
            from mutualrl.see.server import RedisServer, ServerNotFound

            try:
                server = RedisServer().start()
            except (ServerNotFound, RuntimeError) as e:
                raise ConfigError(f"broker.backend redis without broker.url: {e}") from e
            url = server.url
        opts = redis_options(b, url)
        try:
            probe_broker(opts)
        except ConfigError:
            if server is not None:
                server.cleanup()
            raise
        broker = RedisBroker(opts)
    ex = exchange_over(cfg, broker, namespace or run_namespace(cfg))
    try:
        yield ex
    finally:
        broker.close()
        if server is not None:
            server.cleanup()
