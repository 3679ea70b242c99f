"""A live probe of a learner's own stream: a holder of a rollout service's signing key feeds its learner while
`mutualrl up` trains the demo over a real Redis, and the probe counts what the learner did with each forgery.

For every real ``Rollout`` llama-char's rollout service publishes, the probe publishes, signed with that
service's own key, on its own stream:
- a copy with ``sample_index`` beyond the group (groups of G + 1 from G);
- for samples 0 and 4 of each group, a copy of the same (prompt, sample, weights version) with other content,
  after the real one (a forged duplicate: both must fail closed, as conflicts);
- for sample 1, a copy with other content stamped with weights version 99, never published (refused as
  ``unknown_version``; the real one is trained);
and, once a step, a row longer than the model's context — and, when it sees step t begin, copies of sample 2 of
every prompt of step t + 1 *before* the real service samples them (forged first: both copies must fail closed).
It then reads the learner's log (JSON lines), the run's dead-letter stream and the learner's ledger: no forged
row may be trained, and every real row dropped must be dead-lettered and logged as a conflict.

    .venv/bin/python tools/probe_own_stream.py [--steps 4] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import redis
import torch

from mutualrl.config import load_config
from mutualrl.runtime.distributor import PromptDistributor
from mutualrl.runtime.policy_setup import build_task_from_config
from mutualrl.see import ExperienceExchange
from mutualrl.see.exchange import dead_letter_stream, stream_name
from mutualrl.see.identity import Keyring, derive_key
from mutualrl.see.redis_broker import FIELD, RedisBroker, RedisOptions
from mutualrl.see.server import RedisServer
from mutualrl.v1 import experience_pb2 as pb

ROOT = Path(__file__).resolve().parents[1]
POLICY, G = "llama-char", 8
SERVICE = f"{POLICY}.rollout"


def start_up(out: Path, url: str, steps: int, env: dict[str, str]) -> subprocess.Popen:
    """The demo under `mutualrl up`, on the probe's Redis, signed with the probe's run key."""
    sets = [f"budget.steps={steps}", "budget.prompts_per_step=8", "eval.every=1000", "eval.size=16",
            "broker.backend=redis", f"broker.url={url}", "broker.hmac_key_env=PROBE_RUN_KEY",
            "checkpoint.every=1", "launcher.peer_deadline_s=120"]
    argv = [sys.executable, "-m", "mutualrl.app.cli", "up", str(ROOT / "examples" / "demo.yaml"), "--out", str(out)]
    for s in sets:
        argv += ["--set", s]
    out.mkdir(parents=True, exist_ok=True)
    with open(console_log(out), "w") as console:  # a file: a pipe nobody reads fills and blocks up
        return subprocess.Popen(argv, env=env, stdout=console, stderr=subprocess.STDOUT, text=True)


def console_log(out: Path) -> Path:
    """Where `up`'s console output goes (beside the run folder)."""
    return out.parent / f"{out.name}.console.log"


def namespace_of(out: Path, proc: subprocess.Popen, timeout_s: float = 600) -> str:
    """The run's SEE namespace, once `up` has written services.json."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (out / "services.json").exists():
            return json.loads((out / "services.json").read_text())["namespace"]
        if proc.poll() is not None:
            raise SystemExit(f"up exited with {proc.returncode} before it started; its output is in {console_log(out)}")
        time.sleep(0.5)
    raise SystemExit("up did not start in time")


def _copy(r: pb.Rollout, extra_token: bool = True) -> pb.Rollout:
    """``r`` with other content (one more token), as a forger would make it."""
    other = pb.Rollout()
    other.CopyFrom(r)
    if extra_token:
        other.completion_text = r.completion_text + "9"
        other.token_ids.append(r.token_ids[0] if r.token_ids else 3)
        other.logprobs.append(-0.1)
    return other


def forge(ex: ExperienceExchange, r: pb.Rollout, version: int, sent: Counter, long_steps: set[int],
          ours: set[str]) -> None:
    """The forgeries for one real rollout, published after it (their message ids go into ``ours``)."""
    beyond = _copy(r, extra_token=False)
    beyond.sample_index = r.sample_index + G  # a group of G + 1 and more
    ours.add(ex.publish(beyond, POLICY, version))
    sent["sample_index_beyond_group"] += 1
    if r.sample_index % 4 == 0:
        ours.add(ex.publish(_copy(r), POLICY, version))
        sent["forged_duplicate_after"] += 1
    if r.sample_index == 1:
        ours.add(ex.publish(_copy(r), POLICY, 99))
        sent["unpublished_version"] += 1
    if r.step not in long_steps:
        long_steps.add(r.step)
        huge = _copy(r, extra_token=False)
        huge.sample_index = (r.sample_index + 1) % G
        huge.token_ids.extend([3] * 500)
        huge.logprobs.extend([-0.1] * 500)
        huge.completion_text = r.completion_text + "1" * 500
        ours.add(ex.publish(huge, POLICY, version))
        sent["over_long"] += 1


def forge_ahead(ex: ExperienceExchange, r: pb.Rollout, version: int, prompts: list[str], sent: Counter,
                ours: set[str]) -> None:
    """Sample 2 of every prompt of the step after ``r``'s, forged from ``r`` before the real service samples it."""
    for prompt_id in prompts:
        first = _copy(r)
        first.step, first.prompt_id, first.sample_index = r.step + 1, prompt_id, 2
        ours.add(ex.publish(first, POLICY, version))
        sent["forged_first"] += 1


def learner_refusals(log_path: Path) -> Counter:
    """The learner's log lines about own rollouts it refused, by reason and level (its lines are JSON)."""
    out: Counter = Counter()
    for line in log_path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("reason") and "own rollout" in rec.get("msg", ""):
            out[f"{rec['reason']} ({rec['level']})"] += len(rec.get("message_ids") or [1])
    return out


def main() -> int:
    """Run the probe; 1 when the learner trained on a rollout the real service never published."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", type=Path, help="Keep the run here (default: a temporary folder).")
    args = ap.parse_args()
    run_key = secrets.token_hex(32)
    env = {**os.environ, "PROBE_RUN_KEY": run_key, "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory() as tmp, RedisServer() as server:
        out = args.out or Path(tmp) / "run"
        proc = start_up(out, server.url, args.steps, env)
        ns = namespace_of(out, proc)
        r = redis.Redis.from_url(server.url)
        ex = ExperienceExchange(RedisBroker(RedisOptions(url=server.url)), ns,
                                keys=Keyring({SERVICE: derive_key(run_key, SERVICE)}))
        cfg = load_config(out / "config.yaml")
        task, _ = build_task_from_config(cfg)
        distributor = PromptDistributor(task.train, cfg.budget.prompts_per_step, seed=cfg.seed)
        stream, last_id = stream_name(ns, "rollout", POLICY), "0-0"
        sent, real, long_steps, ours, ahead = Counter(), 0, set(), set(), set()
        while proc.poll() is None:
            for _, entries in r.xread({stream: last_id}, block=500) or []:
                for entry_id, fields in entries:
                    last_id = entry_id
                    env_msg = ex.codec.decode(fields[FIELD])
                    if env_msg.message_id in ours or env_msg.WhichOneof("payload") != "rollout":
                        continue
                    real += 1
                    roll = env_msg.rollout
                    if roll.step not in ahead and roll.step < args.steps:
                        ahead.add(roll.step)
                        forge_ahead(ex, roll, env_msg.weights_version,
                                    [p.prompt_id for p in distributor.batch(roll.step + 1)], sent, ours)
                    forge(ex, roll, env_msg.weights_version, sent, long_steps, ours)
        if proc.returncode != 0:
            print(console_log(out).read_text()[-3000:])
            raise SystemExit(f"up exited with {proc.returncode}")
        dead, dead_ids = Counter(), {}
        for _, f in r.xrange(dead_letter_stream(ns)):
            reason, _stream, _entry, _detail, data = f[FIELD].split(b"\x00", 4)
            dead[reason.decode()] += 1
            try:
                dead_ids[ex.codec.decode(data).message_id] = reason.decode()
            except Exception:  # noqa: BLE001 - a record that is not a decodable envelope: counted by reason only
                pass
        logged = learner_refusals(out / "logs" / f"{POLICY}.learner.log")
        state = torch.load(out / "services" / f"{POLICY}.learner.state.pt", weights_only=False)
        trained = {mid for step in state["ledger"].values() for mid in step["own"]}
        published = set()
        for line in (out / "services" / f"{POLICY}.rollout.ledger.jsonl").read_text().splitlines():
            published.update(json.loads(line)["rollouts"])
        print(f"real rollouts seen: {real}; forgeries sent: {dict(sent)}")
        print(f"dead-lettered, by reason: {dict(dead)}")
        print(f"learner log lines about refused own rollouts: {dict(logged)}")
        print(f"trained own rollouts: {len(trained)}; published by the real service: {len(published)}; "
              f"trained but not published: {len(trained - published)}; published but not trained: "
              f"{len(published - trained)}")
        dropped = published - trained
        why = Counter(dead_ids.get(mid, "not dead-lettered") for mid in dropped)
        print(f"forged rows trained: {len(trained & ours)}; real rows not trained: {len(dropped)}, by dead-letter "
              f"reason: {dict(why)}")
        return 0 if trained <= published and not (trained & ours) and set(why) <= {"own_conflict"} else 1


if __name__ == "__main__":
    sys.exit(main())
