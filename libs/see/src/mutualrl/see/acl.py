"""Identity per service, enforced by Redis itself: one ACL user per service that may append only
to its own streams.

A service reads (through its consumer groups) every stream of its run, but the only keys it may
``XADD`` to are the ones it produces: a rollout service its policy's ``rollout``,
``verified_success``, ``advantage_stats`` and ``sample_result`` streams and its heartbeat, a learner its
policy's ``weights_published`` and ``sample_request`` streams and its heartbeat; both may append to the
run's dead-letter stream.
A compromised or buggy service therefore cannot write onto another policy's streams — Redis
answers ``NOPERM`` — and the receivers' producer check (the envelope's producer must own the
stream) catches the rest. The rules use ACL selectors (Redis 7+): the root permissions cover
reading, a selector in parentheses covers appending to the service's own keys.

``mutualrl up`` writes these users to an ACL file for the Redis it starts; the compose file and
the Helm chart render the same lines from :func:`acl_file` (one definition).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from mutualrl.see.exchange import dead_letter_stream, stream_name
from mutualrl.see.identity import OBSERVER, ROLE_KINDS, service_env

__all__ = ["ADMIN_PASSWORD_ENV", "OBSERVER", "ROLE_KINDS", "ServiceUser", "acl_file", "acl_rules", "own_streams",
           "password_env"]
ADMIN_PASSWORD_ENV = "MUTUALRL_REDIS_ADMIN_PASSWORD"


def password_env(service: str) -> str:
    """The environment variable a deployment passes a service's password in, e.g.
    ``llama-char.rollout`` -> ``MUTUALRL_REDIS_PASSWORD_LLAMA_CHAR_ROLLOUT``."""
    return service_env("MUTUALRL_REDIS_PASSWORD_", service)

# reading and consumer-group bookkeeping on any of the run's streams
READ_COMMANDS = ("xreadgroup", "xack", "xgroup", "xautoclaim", "xclaim", "xpending", "xrange", "xrevrange", "xlen",
                 "xinfo", "exists", "type", "scan")
# connection housekeeping every client does
# (7.0 has no client|setinfo; redis-py ignores its refusal)
CONNECTION_COMMANDS = ("ping", "hello", "auth", "client|setname", "select", "info")


@dataclass(frozen=True)
class ServiceUser:
    """One service's Redis identity: its user name (``<policy>.<role>``) and password."""

    policy: str
    role: str
    password: str

    @property
    def name(self) -> str:
        """The Redis user name: ``<policy>.<role>``."""
        return f"{self.policy}.{self.role}"


def _own_keys(policy: str, role: str) -> list[str]:
    """The stream names a service appends to, after ``<namespace>:``."""
    if role not in ROLE_KINDS:
        raise ValueError(f"role must be one of {', '.join(ROLE_KINDS)}; got {role!r}")
    probe = "\n"  # a namespace no real one equals, cut off again below
    names = [stream_name(probe, kind,
                         policy + suffix) for kind, suffix in ROLE_KINDS[role]] + [dead_letter_stream(probe)]
    return [n[len(probe) + 1:] for n in names]


def own_streams(namespace: str, policy: str, role: str) -> list[str]:
    """The keys a service may append to."""
    return [f"{namespace}:{k}" for k in _own_keys(policy, role)]


def _glob_escape(key: str) -> str:
    """ACL key patterns are globs: escape the glob characters a name could contain."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in key)


def acl_rules(namespace: str | None, user: ServiceUser) -> list[str]:
    """The ``ACL SETUSER`` rules of one service (the password stored as its SHA-256).
    ``namespace`` None: any run's keys (a deployment whose run ids are made later, by MWRA)."""
    digest = hashlib.sha256(user.password.encode()).hexdigest()
    if namespace is None:
        read_keys, prefix = "~*", "*:"
    else:
        read_keys, prefix = f"~{_glob_escape(namespace)}:*", _glob_escape(namespace) + ":"
    writes = " ".join(f"~{prefix}{_glob_escape(k)}" for k in _own_keys(user.policy, user.role))
    return ["reset", "on", f"#{digest}", "resetchannels", read_keys,
            *(f"+{c}" for c in READ_COMMANDS + CONNECTION_COMMANDS), f"({writes} +xadd +xtrim)"]


def acl_file(namespace: str | None, users: list[ServiceUser], admin_password: str) -> str:
    """An ACL file: the default user (the operator's, with every permission) and one user per service."""
    admin = hashlib.sha256(admin_password.encode()).hexdigest()
    lines = [f"user default on #{admin} ~* &* +@all"]
    lines += [f"user {u.name} " + " ".join(acl_rules(namespace, u)) for u in users]
    return "\n".join(lines) + "\n"
