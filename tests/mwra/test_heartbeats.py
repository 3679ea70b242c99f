"""The controller measures step costs from the services' own heartbeats on a real Redis:
a heartbeat per role and step becomes a measurement, a forged or misplaced one does not, and a
step that ran on a split since replaced is not read as a cost of the new one."""

from __future__ import annotations

from pathlib import Path

from mutualrl.config import parse_config
from mutualrl.see import ExperienceExchange, RedisBroker, RedisOptions
from mutualrl.services.mwra.backends.base import InMemoryBackend
from mutualrl.services.mwra.controller import Controller
from mutualrl.services.mwra.heartbeats import HeartbeatFollower
from mutualrl.services.mwra.planner import Node
from mutualrl.v1 import experience_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
YAML = (ROOT / "examples" / "mwra" / "two-policies-gpu.yaml").read_text()


def _setup(redis_server, key: bytes | None = b"k" * 32):
    controller = Controller(InMemoryBackend([Node(f"n{i}", 8) for i in range(4)]))
    exp = controller.submit(parse_config(YAML, "t", check_paths=False), YAML)
    url = redis_server.url
    services = ExperienceExchange(RedisBroker(RedisOptions(url=url)), exp.id, keys=key)
    follower = HeartbeatFollower(controller,
                                 lambda e: ExperienceExchange(RedisBroker(RedisOptions(url=url)), e.id, keys=key))
    return controller, exp, services, follower


def _beat(ex: ExperienceExchange, policy: str, role: str, step: int, **stages: float) -> None:
    ex.publish(pb.Heartbeat(role=role, step=step, status="ok", stage_seconds=stages), f"{policy}.{role}")


def test_heartbeats_become_measurements_and_a_replan(redis_server):
    controller, exp, services, follower = _setup(redis_server)
    # the small policy turns out far more expensive than seeded, the large one cheap
    _beat(services, "small", "rollout", 1, generate=400.0)
    _beat(services, "small", "learner", 1, logprob=50.0, train=250.0, weight_sync=3.0)
    _beat(services, "large", "rollout", 1, generate=5.0)
    _beat(services, "large", "learner", 1, train=5.0)
    assert follower.poll_once() == 4
    assert set(exp.measured.values) == {"small", "large"}
    assert exp.history[-1]["reason"] == "measured" and exp.plan.generation == 1
    # the small policy's learner + logprob time, weight sync excluded (it is not split by GPUs)
    small = exp.plan.allocations["small"]
    assert small.gpus > 2
    # read once: the consumer group acknowledged them
    assert follower.poll_once() == 0


def test_forged_and_misplaced_heartbeats_are_not_measurements(redis_server):
    controller, exp, services, follower = _setup(redis_server)
    # a heartbeat claiming to be the learner's, on the rollout's stream
    services.publish(pb.Heartbeat(role="learner", step=1, stage_seconds={"train": 1e6}), "small.rollout")
    # a service without the key: its signature fails and it is dead-lettered, never read
    forger = ExperienceExchange(RedisBroker(RedisOptions(url=redis_server.url)), exp.id, keys=b"x" * 32)
    _beat(forger, "small", "learner", 1, train=1e6)
    # no stages (a service still starting)
    _beat(services, "small", "rollout", 1)
    assert follower.poll_once() == 0
    assert follower.counts["rejected"] == 1 and follower.counts["no_stages"] == 1
    assert exp.measured.values == {} and exp.plan.generation == 0


def test_a_step_in_flight_during_a_move_is_not_measured_on_the_new_split(redis_server):
    controller, exp, services, follower = _setup(redis_server)
    for policy, gen, train in (("small", 400.0, 300.0), ("large", 5.0, 5.0)):
        _beat(services, policy, "rollout", 1, generate=gen)
        _beat(services, policy, "learner", 1, train=train)
    follower.poll_once()
    assert exp.plan.generation == 1 and "small" in exp.moved_at
    before = dict(exp.measured.values)
    # step 2 was already running on the old split when the plan moved: dropped, counted
    _beat(services, "small", "rollout", 2, generate=900.0)
    _beat(services, "small", "learner", 2, train=900.0)
    follower.poll_once()
    assert exp.measured.values["small"] == before["small"] and exp.stale_reports == 2
    assert exp.steps["small"] == 2  # progress still counts
    # step 3 ran on the new split: measured
    _beat(services, "small", "rollout", 3, generate=100.0)
    _beat(services, "small", "learner", 3, train=100.0)
    follower.poll_once()
    assert exp.measured.values["small"] != before["small"]


def test_a_standby_controller_reads_nothing(redis_server):
    controller, exp, services, follower = _setup(redis_server)
    controller.leading = False
    _beat(services, "small", "rollout", 1, generate=1.0)
    assert follower.poll_once() == 0
    controller.leading = True
    _beat(services, "small", "learner", 1, train=1.0)
    assert follower.poll_once() == 2
