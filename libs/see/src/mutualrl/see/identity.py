"""Who may write what on SEE, and with which key: service identities and per-service signing keys.

Every stream has one owning service (``<policy>.<role>``): a rollout service produces its
policy's ``rollout``, ``verified_success``, ``advantage_stats`` and ``sample_result`` streams and its
heartbeat, a learner its policy's ``weights_published`` and ``sample_request`` streams and its heartbeat. Redis ACLs
(:mod:`mutualrl.see.acl`) let only the owner append to a stream; the keys here let a receiver
check that the owner *signed* what it reads: each service signs with its own key, and a receiver
holds only the keys of the services it reads from (docs/architecture.md, "Security model").

Keys are derived from the run's key, ``sha256_hex(run_key ":see-key:" service)``, so whoever
holds the run key (the launcher, the operator) can hand each service exactly the keys it needs
— and a deployment that gives every service the run key still gets a distinct key per producer.
The derivation is plain SHA-256 over text so a Helm template (``sha256sum``) computes the same.
"""

from __future__ import annotations

import hashlib
from typing import Mapping

ROLE_KINDS = {
    # what each role appends, by (kind, producer suffix): the producer names the services use
    "rollout": (("rollout", ""), ("verified_success", ""), ("advantage_stats", ""), ("sample_result", ""),
                ("heartbeat", ".rollout")),
    "learner": (("weights_published", ""), ("sample_request", ""), ("heartbeat", ".learner")),
    "observer": (),  # MWRA's controller: reads heartbeats, writes nothing but dead letters
}
OBSERVER = ("mwra", "observer")  # the controller's identity: user "mwra.observer"
SEE_KEYS_ENV = "MUTUALRL_SEE_KEYS"
"""``service=key,service=key``: the signing keys a service holds (set by `mutualrl up`)."""

_OWNER_ROLE = {kind: role for role, kinds in ROLE_KINDS.items() for kind, suffix in kinds if suffix == ""}


def owner_of(kind: str, producer: str) -> str:
    """The service that owns (and signs) the ``kind`` stream of ``producer``: ``llama.rollout``
    for llama's rollouts, ``llama.learner`` for its weight announcements; a heartbeat's producer
    already names its service."""
    role = _OWNER_ROLE.get(kind)
    return f"{producer}.{role}" if role else producer


def derive_key(run_key: str | bytes, service: str) -> bytes:
    """A service's signing key from the run key (hex text, as bytes)."""
    rk = run_key.decode() if isinstance(run_key, bytes) else run_key
    return hashlib.sha256(f"{rk}:see-key:{service}".encode()).hexdigest().encode()


def services_read(policy: str, role: str, policies: list[str]) -> list[str]:
    """The services whose streams ``policy``'s ``role`` reads: a rollout service its learner's
    weight announcements and heartbeat; a learner every rollout service's experience and
    heartbeat (its own and its peers'); the observer every heartbeat."""
    if role == "rollout":
        return [f"{policy}.learner"]
    if role == "learner":
        return [f"{q}.rollout" for q in policies]
    if role == "observer":
        return [f"{q}.{r}" for q in policies for r in ("rollout", "learner")]
    raise ValueError(f"role must be one of {', '.join(ROLE_KINDS)}; got {role!r}")


def keys_for_service(run_key: str | bytes, policy: str, role: str, policies: list[str]) -> dict[str, bytes]:
    """The keys one service needs: its own (to sign) and those of the services it reads."""
    own = [] if role == "observer" else [f"{policy}.{role}"]
    return {s: derive_key(run_key, s) for s in dict.fromkeys(own + services_read(policy, role, policies))}


def service_env(prefix: str, service: str) -> str:
    """An environment variable per service: ``prefix`` + the service name upper-cased, every
    other character an underscore (``llama-char.rollout`` -> ``<prefix>LLAMA_CHAR_ROLLOUT``)."""
    return prefix + "".join(c if c.isalnum() else "_" for c in service).upper()


def key_env(service: str) -> str:
    """The variable a deployment keeps one service's key in, e.g. ``llama-char.rollout`` ->
    ``MUTUALRL_SEE_KEY_LLAMA_CHAR_ROLLOUT`` (docker-compose's ``.env``)."""
    return service_env("MUTUALRL_SEE_KEY_", service)


def format_keys(keys: Mapping[str, bytes]) -> str:
    """The :data:`SEE_KEYS_ENV` value for ``keys``."""
    return ",".join(f"{s}={k.decode()}" for s, k in keys.items())


def parse_keys(text: str) -> dict[str, bytes]:
    """Inverse of :func:`format_keys`; ValueError naming the bad item."""
    out: dict[str, bytes] = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        service, sep, key = item.partition("=")
        if not sep or not service or not key:
            raise ValueError(f"{SEE_KEYS_ENV}: expected service=key, got {item.split('=')[0]!r}=…")
        out[service] = key.encode()
    return out


class Keyring:
    """The signing keys a process holds: explicit per-service keys and/or the run key (from which
    any service's key derives). :meth:`key` answers None for a service whose key it lacks, so a
    receiver rejects what that service claims to have sent."""

    def __init__(self, keys: Mapping[str, bytes] | None = None, run_key: str | bytes | None = None):
        self.keys = dict(keys or {})
        self.run_key = run_key

    def key(self, service: str) -> bytes | None:
        """The signing key of ``service``: given, or derived from the run key; None when neither is known."""
        if service in self.keys:
            return self.keys[service]
        if not self.run_key:
            return None
        key = derive_key(self.run_key, service)
        if len(self.keys) < 4096:  # cached; bounded, since any producer name can arrive on the wire
            self.keys[service] = key
        return key

    def key_for(self, kind: str, producer: str) -> bytes | None:
        """The key of the service that owns the stream of ``kind`` from ``producer``."""
        return self.key(owner_of(kind, producer))
