"""Experiment-file validation: good files load, bad ones give one clear line (and exit 2 from the CLI)."""

import subprocess
import sys
from pathlib import Path

import pytest

from mutualrl.config import ConfigError, load_config

UNAVAILABLE = ("mutualrl.services.rollout.http_engines.EngineUnavailable: "
               "vllm at http://127.0.0.1:9: not reachable")

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo.yaml"


def test_demo_config_validates():
    cfg = load_config(DEMO)
    assert [p.name for p in cfg.policies] == ["llama-char", "qwen-bpe"]
    assert cfg.sharing.mode == "sgt"
    assert cfg.sharing.sgt.weight == pytest.approx(0.1)


def test_sgt_is_style_guarded_by_default_and_files_with_unguarded_records_pin_the_plain_nll():
    """docs/algorithms.md §3.3: the default is the variant that did not collapse a real receiver beside a bare-answer
    peer; the demo and the toy-peer pair keep the unguarded NLL their recorded figures were measured with."""
    from mutualrl.config.sharing import SgtConfig

    assert (SgtConfig().guard, SgtConfig().select) == ("chord", "any")
    for path in (DEMO, ROOT / "examples" / "real" / "pair.yaml"):
        sgt = load_config(path).sharing.sgt
        assert (sgt.guard, sgt.select) == ("none", "shortest"), path
    guarded = load_config(ROOT / "examples" / "real" / "pair.yaml",
                          ["sharing.sgt.guard=chord", "sharing.sgt.select=any"]).sharing.sgt
    assert (guarded.guard, guarded.select) == ("chord", "any")


def test_overrides_by_path_index_and_policy_name():
    cfg = load_config(DEMO,
                      ["budget.steps=2", "policies.0.optim.lr=3e-4", "policies.qwen-bpe.engine.temperature=0.7",
                       "sharing.mode=none"])
    assert cfg.budget.steps == 2
    assert cfg.policies[0].optim.lr == pytest.approx(3e-4)
    assert cfg.policies[1].engine.temperature == pytest.approx(0.7)
    assert cfg.sharing.mode == "none"


def _write(tmp_path, text):
    p = tmp_path / "exp.yaml"
    p.write_text(text)
    return p


MINIMAL = """
name: t
policies:
  - name: a
    model: {family: llama}
    tokenizer: {kind: char}
"""


@pytest.mark.parametrize(
    "text, needle",
    [
        ("name: t\npolicies: [\n", "malformed YAML"),
        (MINIMAL + "sharing: {mode: telepathy}\n", "sharing.mode"),
        (MINIMAL + "budget: {steps: many}\n", "budget.steps"),
        (MINIMAL + "budget: {stepz: 3}\n", "budget.stepz: unknown field"),
        (MINIMAL.replace("{family: llama}", "{path: ./no/such/model}").replace("    tokenizer: {kind: char}\n", ""),
         "does not exist"),
        (MINIMAL.replace("{family: llama}", "{family: mamba}"), "policies.0.model.family"),
        (MINIMAL + "sharing: {mode: sgt}\n", "needs at least two policies"),
        ("- just\n- a list\n", "expected a mapping"),
    ],
)
def test_bad_input_gives_one_clear_line(tmp_path, text, needle):
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, text))
    msg = str(e.value)
    assert needle in msg
    assert "\n" not in msg


def test_bad_override_is_a_config_error():
    with pytest.raises(ConfigError, match="key.path=value"):
        load_config(DEMO, ["budget.steps"])
    with pytest.raises(ConfigError, match="no list item"):
        load_config(DEMO, ["policies.nobody.optim.lr=1"])


def test_text_with_a_colon_read_as_a_mapping_says_to_quote_it():
    """An instruction like "Work it out: ..." passed unquoted is YAML's key: value, not the text."""
    with pytest.raises(ConfigError) as e:
        load_config(DEMO, ["policies.0.prompt.instruction=Work it out step by step: one number at a time."])
    msg = str(e.value)
    assert "policies.0.prompt.instruction" in msg and "got a mapping" in msg and "quotes" in msg
    assert "\n" not in msg
    cfg = load_config(DEMO, ['policies.0.prompt.instruction="Work it out step by step: one number at a time."'])
    assert cfg.policies[0].prompt.instruction == "Work it out step by step: one number at a time."


def test_cli_exits_2_with_one_line_and_no_traceback(tmp_path):
    bad = _write(tmp_path, MINIMAL + "sharing: {mode: telepathy}\n")
    for cmd in (["validate", str(bad)], ["run", str(bad)], ["run", str(DEMO), "--set", "budget.steps=-1"],
                ["run", str(tmp_path / "missing.yaml")]):
        p = subprocess.run([sys.executable, "-m", "mutualrl.app.cli", *cmd], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 2, (cmd, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), p.stderr


def test_cli_validate_ok():
    p = subprocess.run([sys.executable, "-m", "mutualrl.app.cli", "validate", str(DEMO)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and "ok" in p.stdout


def test_cli_load_time_input_errors_exit_2(tmp_path):
    """Inputs that pass the schema but fail to load (a directory that is no model, a malformed
    task file) are still one-line input errors; the run never starts."""
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    bad_jsonl = tmp_path / "bad.jsonl"
    bad_jsonl.write_text('{"prompt": "a", "answer": "1"}\n{oops\n')
    cases = [
        (MINIMAL.replace("{family: llama}", f"{{path: {empty}}}").replace("    tokenizer: {kind: char}\n", ""),
         "has no config.json"),
        (MINIMAL + f"task: {{name: jsonl, path: {bad_jsonl}}}\n", "bad.jsonl:2"),
    ]
    for i, (text, needle) in enumerate(cases):
        cfg = tmp_path / f"exp{i}.yaml"
        cfg.write_text(text)
        p = subprocess.run([sys.executable, "-m", "mutualrl.app.cli", "run", str(cfg), "--out",
                            str(tmp_path / f"out{i}")],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 2, p.stderr[-2000:]
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        assert len(lines) == 1 and needle in lines[0] and "Traceback" not in p.stderr, p.stderr[-2000:]


@pytest.mark.parametrize(
    "sets,needle",
    [
        (["broker.url=redis://h:6379/0"], "only used with broker.backend: redis"),
        (["broker.backend=redis", "broker.url=http://h:6379"], "must start with redis://"),
        (["broker.max_backlog=10", "broker.max_len=5"], "must not exceed broker.max_len"),
        (["broker.on_backlog=wait"], "on_backlog"),
        (["sharing.mode=xgrpo", "sharing.xgrpo.variant=mixed"], "variant"),
        (["sharing.mode=hacpo", "sharing.capability.ratio_min=2"], "ratio_min"),
        (["algorithm.loss=ppo"], "loss"),
    ],
)
def test_sharing_and_broker_options_are_validated(sets, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(DEMO, sets)


def test_loss_specific_clip_defaults():
    assert load_config(DEMO, ["algorithm.clip_low=null", "algorithm.clip_high=null"]).algorithm.clip_bounds() == (0.2,
        0.28)
    gspo = load_config(DEMO, ["algorithm.loss=gspo", "algorithm.clip_low=null", "algorithm.clip_high=null"])
    assert gspo.algorithm.clip_bounds() == (3e-4, 4e-4)


def test_hacpo_refuses_samplers_whose_logprobs_are_not_the_models():
    from mutualrl.config import ConfigError, load_config

    base = Path(__file__).resolve().parents[2] / "examples" / "baselines" / "hacpo.yaml"
    with pytest.raises(ConfigError, match="temperature 0.7"):
        load_config(base, ["policies.1.engine.temperature=0.7"])
    with pytest.raises(ConfigError, match="top_k 20"):
        load_config(base, ["policies.0.engine.top_k=20"])
    assert load_config(base).sharing.mode == "hacpo"


def test_up_remembers_a_services_last_exception_line():
    from mutualrl.app.launcher import Service

    s = Service("a.rollout", "rollout", "a", [], 0)
    for line in ["starting\n", "Traceback (most recent call last):\n", '  File "x.py", line 1, in <module>\n',
                 "    raise X\n",
                 "requests.exceptions.ConnectionError: HTTPConnectionPool(host='127.0.0.1', port=9)\n",
                 "\n", "During handling of the above exception, another exception occurred:\n", "\n",
                 "Traceback (most recent call last):\n",
                 '  File "y.py", line 2\n',
                 UNAVAILABLE + "\n"]:
        s.note_output(line)
    assert s.last_error == UNAVAILABLE
    rich = Service("b.rollout", "rollout", "b", [], 0)
    for line in ["╭──────── Traceback (most recent call last) ────────╮\n",
                 "│ /x.py:1 in f                                      │\n",
                 "╰───────────────────────────────────────────────────╯\n",
                 "EngineUnavailable: no vLLM server at http://127.0.0.1:9:\n",
                 "/version (Caused by NewConnectionError(...))\n"]:
        rich.note_output(line)
    assert rich.last_error == "EngineUnavailable: no vLLM server at http://127.0.0.1:9:"


def test_base_seed_fixes_the_starting_point_across_run_seeds():
    """`base_seed` pins the task split (and with it the warm start's cache key); `seed` then
    varies only the RL run. Without it the run seed moves both."""
    from mutualrl.config import parse_config
    from mutualrl.runtime.policy_setup import build_task_from_config

    text = "name: s\npolicies: [{name: a, model: {family: llama}, tokenizer: {kind: char}}]\ntask: {eval_size: 16}\n"
    fixed = [build_task_from_config(parse_config(text + f"seed: {s}\nbase_seed: 7\n", "t"))[0] for s in (0, 1)]
    assert fixed[0].fingerprint() == fixed[1].fingerprint() and fixed[0].eval == fixed[1].eval
    free = [build_task_from_config(parse_config(text + f"seed: {s}\n", "t"))[0] for s in (0, 1)]
    assert free[0].fingerprint() != free[1].fingerprint()
    assert parse_config(text + "seed: 3\n", "t").start_seed == 3


def test_a_task_too_small_to_split_is_bad_input_before_any_model_loads():
    """One-digit sums have 100 distinct problems; a held-out set of 256 takes them all. That is the user's settings,
    so it is a ConfigError (one line from the CLI) naming the count and the two ways out, raised while the task is
    built, not a traceback from the first use of its training split."""
    from mutualrl.config import parse_config
    from mutualrl.runtime.policy_setup import build_task_from_config

    text = ("name: s\npolicies: [{name: a, model: {family: llama}, tokenizer: {kind: char}}]\n"
            "task: {name: arithmetic, min_digits: 1, max_digits: 1, operators: '+', eval_size: %d}\n")
    with pytest.raises(ConfigError, match=r"gave 100 distinct problems.*task.eval_size 256.*lower task.eval_size"):
        build_task_from_config(parse_config(text % 256, "t"))
    task, _ = build_task_from_config(parse_config(text % 40, "t"))
    assert len(task.eval) == 40 and len(task.train) == 60 and not set(p.prompt for p in task.eval) & set(
        p.prompt for p in task.train)


def test_hacpo_paper_schedule_scales_the_learning_rate_by_its_updates():
    from mutualrl.config import parse_config
    from mutualrl.services.learner.setup import learner_optim

    pol = "{{name: {n}, model: {{family: llama}}, tokenizer: {{kind: char}}, optim: {{lr: 4.0e-4}}}}"
    text = f"name: h\npolicies: [{pol.format(n='a')}, {pol.format(n='b')}]\nsharing: {{mode: hacpo}}\n"
    cfg = parse_config(text, "t")
    assert learner_optim(cfg.sharing, cfg.policies[0].optim, 1).lr == 1e-4  # 2 self + 2 cross updates
    assert learner_optim(cfg.sharing, cfg.policies[0].optim, 2).lr == 4e-4 / 6  # 2 self + 2 per peer
    off = parse_config(text.replace("{mode: hacpo}", "{mode: hacpo, hacpo: {scale_lr: false}}"), "t")
    assert learner_optim(off.sharing, off.policies[0].optim, 1).lr == 4e-4
    grpo = parse_config(text.replace("{mode: hacpo}", "{mode: none}"), "t")
    assert learner_optim(grpo.sharing, grpo.policies[0].optim, 1).lr == 4e-4


def test_a_policy_can_have_its_own_evaluation_cadence_and_a_cadence_must_name_a_policy():
    from mutualrl.config import ExperimentConfig

    base = {"name": "x", "policies": [{"name": "a", "model": {"family": "llama"}, "tokenizer": {"kind": "char"}},
                                      {"name": "b", "model": {"family": "llama"}, "tokenizer": {"kind": "char"}}],
            "task": {"name": "arithmetic"}, "sharing": {"mode": "sgt"}, "eval": {"every": 2}}
    cfg = ExperimentConfig.model_validate({**base, "eval": {"every": 2, "every_for": {"b": 20}}})
    assert cfg.eval_every("a") == 2 and cfg.eval_every("b") == 20
    with pytest.raises(ValueError, match="every_for names no policy: c"):
        ExperimentConfig.model_validate({**base, "eval": {"every_for": {"c": 5}}})
    with pytest.raises(ValueError, match="at least 1 step"):
        ExperimentConfig.model_validate({**base, "eval": {"every_for": {"a": 0}}})


def test_sgt_r_refuses_a_sharded_receiver_in_one_line():
    from mutualrl.config import ExperimentConfig

    pol = lambda name, gpus=1: {"name": name, "model": {"family": "llama"}, "tokenizer": {"kind": "char"},  # noqa: E731
                                "resources": {"learner_gpus": gpus}}
    base = {"name": "x", "task": {"name": "arithmetic"}, "sharing": {"mode": "sgt_r"}}
    ExperimentConfig.model_validate({**base, "policies": [pol("a"), pol("b")]})
    with pytest.raises(ValueError, match="policy 'b' has a sharded learner"):
        ExperimentConfig.model_validate({**base, "policies": [pol("a"), pol("b", 2)]})


def test_up_sends_whole_versions_on_one_host_unless_the_file_asks_for_deltas():
    """`up` puts every learner beside its engine: a delta there saves no wire bytes and costs a copy of the weights
    and a compare of every value, so `auto` left to the file resolves to whole versions; a named value is kept."""
    from mutualrl.app.launcher import _weights_deltas
    from mutualrl.config import ExperimentConfig

    base = {"name": "d", "policies": [{"name": n, "model": {"family": "llama"}, "tokenizer": {"kind": "char"}}
                                      for n in ("a", "b")], "task": {"name": "arithmetic"}}
    said: list[str] = []
    left = _weights_deltas(ExperimentConfig.model_validate(base), said.append)
    assert left.weights.deltas == "off" and len(said) == 1 and "weights.deltas=on" in said[0]
    for named in ("auto", "on"):
        cfg = ExperimentConfig.model_validate({**base, "weights": {"deltas": named}})
        assert _weights_deltas(cfg, said.append).weights.deltas == named
    assert len(said) == 1
