"""Per-service signing keys: who owns which stream, what each service holds, and that a
receiver accepts a message only under the key of the service that owns its stream."""

from __future__ import annotations

import pytest

from mutualrl.see import ExperienceExchange, InProcessBroker
from mutualrl.see.codec import CodecError, EnvelopeCodec
from mutualrl.see.identity import (
    Keyring,
    derive_key,
    format_keys,
    keys_for_service,
    owner_of,
    parse_keys,
    services_read,
)
from mutualrl.v1 import experience_pb2 as pb

RUN_KEY = "0f" * 32
POLICIES = ["a", "b", "c"]


def test_every_stream_has_one_owning_service():
    assert owner_of("rollout", "a") == owner_of("verified_success", "a") == owner_of("advantage_stats",
        "a") == "a.rollout"
    assert owner_of("weights_published", "a") == "a.learner"
    assert owner_of("heartbeat", "a.learner") == "a.learner" and owner_of("heartbeat", "a.rollout") == "a.rollout"


def test_keys_are_distinct_per_service_and_match_the_documented_derivation():
    import hashlib

    keys = {s: derive_key(RUN_KEY, s) for s in ("a.rollout", "a.learner", "b.rollout")}
    assert len(set(keys.values())) == 3
    # plain SHA-256 over text, so a Helm template's sha256sum computes the same
    assert keys["a.rollout"] == hashlib.sha256(f"{RUN_KEY}:see-key:a.rollout".encode()).hexdigest().encode()
    assert derive_key(RUN_KEY.encode(), "a.rollout") == keys["a.rollout"]


def test_each_service_holds_its_own_key_and_only_its_sources_keys():
    assert set(keys_for_service(RUN_KEY, "a", "rollout", POLICIES)) == {"a.rollout", "a.learner"}
    assert set(keys_for_service(RUN_KEY, "a", "learner", POLICIES)) == {"a.learner", "a.rollout", "b.rollout",
        "c.rollout"}
    assert set(keys_for_service(RUN_KEY, "mwra", "observer",
                                POLICIES)) == {f"{p}.{r}" for p in POLICIES for r in ("rollout", "learner")}
    assert services_read("b", "rollout", POLICIES) == ["b.learner"]
    with pytest.raises(ValueError, match="role must be one of"):
        services_read("a", "judge", POLICIES)


def test_keys_round_trip_through_the_environment_and_bad_items_are_named():
    keys = keys_for_service(RUN_KEY, "a", "learner", POLICIES)
    assert parse_keys(format_keys(keys)) == keys
    with pytest.raises(ValueError, match="expected service=key"):
        parse_keys("a.rollout=abc,b.rollout")
    assert parse_keys("") == {}
    ring = Keyring(parse_keys(format_keys(keys)))
    assert ring.key("a.rollout") == keys["a.rollout"] and ring.key("b.learner") is None


def _codec(policy: str, role: str) -> EnvelopeCodec:
    return EnvelopeCodec(Keyring(keys_for_service(RUN_KEY, policy, role, POLICIES)))


def test_a_receiver_accepts_only_what_the_owning_service_signed():
    rollout_a, learner_a, learner_b, rollout_b = _codec("a", "rollout"), _codec("a", "learner"), _codec("b",
        "learner"), _codec("b", "rollout")
    _, data = rollout_a.wrap_encoded(pb.Rollout(prompt_id="p", reward=1.0), "a")
    assert learner_a.decode(data).rollout.prompt_id == "p" and learner_b.decode(data).producer == "a"
    # b's rollout service holds no key of a's rollout service: it cannot check (nor forge) a's rollouts
    with pytest.raises(CodecError, match="no key for 'a.rollout'") as e:
        rollout_b.decode(data)
    assert e.value.reason == "bad_signature"
    # b's learner signing a rollout in a's name cannot (it holds a.rollout's key only to verify,
    # but its own key is what its codec signs b.learner's streams with); a rollout signed with
    # a *different* service's key does not verify as a's
    forged = EnvelopeCodec(Keyring({"a.rollout": derive_key(RUN_KEY, "b.learner")}))
    _, fake = forged.wrap_encoded(pb.Rollout(prompt_id="p", reward=1.0), "a")
    with pytest.raises(CodecError, match="does not match 'a.rollout'"):
        learner_a.decode(fake)
    # weights announcements are a's learner's: its rollout service verifies them
    _, wp = learner_a.wrap_encoded(pb.WeightsPublished(policy="a", version=1), "a")
    assert rollout_a.decode(wp).weights_published.version == 1


def test_a_service_cannot_sign_for_a_service_whose_key_it_lacks():
    ex = ExperienceExchange(InProcessBroker(), "mutualrl:k",
                            keys=Keyring(keys_for_service(RUN_KEY, "a", "rollout", POLICIES)))
    assert ex.publish(pb.Rollout(prompt_id="p"), "a")
    with pytest.raises(KeyError, match="no signing key for b.rollout"):
        ex.publish(pb.Rollout(prompt_id="p"), "b")


def test_a_run_key_derives_every_service_key():
    whole, split = EnvelopeCodec(RUN_KEY.encode()), _codec("a", "learner")
    _, data = whole.wrap_encoded(pb.Rollout(prompt_id="p"), "c")
    assert split.decode(data).producer == "c"
    _, back = split.wrap_encoded(pb.Heartbeat(role="learner", step=3), "a.learner")
    assert whole.decode(back).heartbeat.step == 3
