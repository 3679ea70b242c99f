"""Per-service identities enforced by a real Redis (ACL selectors): a service appends only to its
own streams — Redis itself answers NOPERM elsewhere — while it reads every stream of the run
through its consumer groups, and SEE works end to end under those users."""

from __future__ import annotations

import pytest
import redis

from mutualrl.see import ExperienceExchange, RedisBroker, RedisOptions
from mutualrl.see.acl import ServiceUser, acl_file, own_streams
from mutualrl.see.server import RedisServer
from mutualrl.v1 import experience_pb2 as pb

NS = "mutualrl:acl-test:run1"
USERS = [ServiceUser(p, r, f"pw-{p}-{r}") for p in ("a", "b") for r in ("rollout", "learner")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("acl") / "users.acl"
    path.write_text(acl_file(NS, USERS, "admin-pw"))
    srv = RedisServer(password="admin-pw", aclfile=str(path)).start()
    yield srv
    srv.cleanup()


def _exchange(server, user: ServiceUser, key=b"k" * 32) -> ExperienceExchange:
    opts = RedisOptions(url=f"redis://127.0.0.1:{server.port}/0", username=user.name, password=user.password, retries=0)
    return ExperienceExchange(RedisBroker(opts), NS, keys=key)


def test_a_service_appends_to_its_own_streams_only(server):
    a_roll, b_learn = USERS[0], USERS[3]
    ex = _exchange(server, a_roll)
    assert ex.publish(pb.Rollout(prompt_id="p", step=1, token_ids=[1], logprobs=[-1.0]), "a")
    assert ex.publish(pb.Heartbeat(role="rollout", step=1), "a.rollout")
    # onto b's rollout stream, or a's learner heartbeat, or a's weights: Redis refuses
    for payload, producer in ((pb.Rollout(prompt_id="p", step=1), "b"),
                              (pb.Heartbeat(role="learner", step=9), "a.learner"),
                              (pb.WeightsPublished(policy="a", version=99), "a")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            ex.publish(payload, producer)
    # the learner of b reads a's rollouts through its group, and acks them
    reader = _exchange(server, b_learn)
    sub = reader.subscribe("b", ["rollout"], ["a"], consumer="b-learner")
    got = sub.poll()
    assert [r.payload.prompt_id for r in got] == ["p"]
    sub.ack(got)
    assert sub.pending() == 0
    # but cannot write onto it
    with pytest.raises(redis.exceptions.NoPermissionError):
        reader.broker.publish(own_streams(NS, "a", "rollout")[0], b"forged")


def test_a_service_cannot_touch_another_run_or_administer_redis(server):
    ex = _exchange(server, USERS[0])
    with pytest.raises(redis.exceptions.NoPermissionError):
        ex.broker.r.xadd("mutualrl:other-run:rollout:a", {"data": b"x"})
    with pytest.raises(redis.exceptions.NoPermissionError):
        ex.broker.r.execute_command("ACL", "SETUSER", "mallory", "on", ">x", "~*", "+@all")
    with pytest.raises(redis.exceptions.NoPermissionError):
        ex.broker.r.execute_command("FLUSHALL")


def test_the_acl_rules_name_every_stream_the_services_write():
    assert own_streams(NS, "a", "rollout") == [f"{NS}:rollout:a", f"{NS}:verified_success:a", f"{NS}:advantage_stats:a",
                                               f"{NS}:sample_result:a", f"{NS}:heartbeat:a.rollout", f"{NS}:deadletter"]
    assert own_streams(NS, "a", "learner") == [f"{NS}:weights_published:a", f"{NS}:sample_request:a",
                                               f"{NS}:heartbeat:a.learner", f"{NS}:deadletter"]
    with pytest.raises(ValueError):
        own_streams(NS, "a", "admin")
