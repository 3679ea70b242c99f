"""The warm start decides when to stop on a validation slice of the training split, never on the
held-out problems RL is evaluated on (a first crossing of the target on the test set would report
an inflated starting accuracy and understate every RL gain)."""

import pytest

from mutualrl.config.schema import WarmStartConfig
from mutualrl.models import build_model
from mutualrl.models.families import ModelShape
from mutualrl.runtime import warm_start as ws
from mutualrl.tasks import build_verifier

SHAPE = ModelShape(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_positions=64)


def test_split_validation_holds_back_the_tail():
    train = list(range(100))
    sft, val = ws.split_validation(train, 10)
    assert val == list(range(90, 100)) and sft == list(range(90))
    sft, val = ws.split_validation(train, 64)  # at most a fifth of the split
    assert len(val) == 20 and len(sft) == 80
    with pytest.raises(ValueError, match="at least 2 training problems"):
        ws.split_validation([1], 10)


def test_checks_never_see_held_out_problems(arithmetic_task, tokenizers, tmp_path, monkeypatch):
    tok = tokenizers["char"]
    ids = {"pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    model = build_model("llama", len(tok), SHAPE, ids, seed=0)
    checked: list[str] = []
    real = ws.greedy_accuracy

    def recording(model, tok, problems, *a, **kw):
        checked.extend(p.prompt for p in problems)
        return real(model, tok, problems, *a, **kw)

    monkeypatch.setattr(ws, "greedy_accuracy", recording)
    cfg = WarmStartConfig(target_accuracy=1.0, max_steps=4, check_every=2, batch_size=4, eval_size=8)
    res = ws.warm_start(model, tok, arithmetic_task.train, build_verifier(None, arithmetic_task), cfg,
                        source="test", task_fingerprint=arithmetic_task.fingerprint(), seed=0,
                        max_new_tokens=6, cache_dir=tmp_path)
    assert res.steps == 4 and not res.cached
    held_out = {p.prompt for p in arithmetic_task.eval}
    validation = {p.prompt for p in arithmetic_task.train[-8:]}
    assert len(checked) == 3 * 8  # at step 0, 2 and 4
    assert set(checked) == validation and not set(checked) & held_out


def test_a_warm_start_that_misses_its_target_says_so(tmp_path):
    """A warm start that runs out of steps below its target is reported, not passed over: RL from a
    policy that never learned the task would spend its whole budget on all-fail groups."""
    from mutualrl.config import parse_config
    from mutualrl.runtime.policy_setup import build_task_from_config, prepare_policy

    cfg = parse_config("""
name: t
policies:
  - name: tiny
    model: {family: llama, hidden_size: 32, num_layers: 1, num_heads: 4, intermediate_size: 64, max_positions: 32}
    tokenizer: {kind: char}
    warm_start: {target_accuracy: 1.0, max_steps: 2, check_every: 1, batch_size: 4}
task: {name: arithmetic, min_digits: 1, max_digits: 1, train_size: 64, eval_size: 8}
""", "t")
    task, verifier = build_task_from_config(cfg)
    said: list[str] = []
    prepared = prepare_policy(cfg, 0, task, verifier, tmp_path, said.append)
    assert prepared.warm_steps == 2
    assert any("WARNING: warm start stopped at max_steps (2)" in s and "below its target 100%" in s for s in said), said


def test_init_seed_pins_a_policys_starting_point_wherever_it_is_listed(tmp_path):
    """By default a policy's weights are seeded by base_seed + its index, so reordering a pair
    changes them; ``init_seed`` keeps one starting point across pairs and orders."""
    from mutualrl.config import parse_config
    from mutualrl.runtime.policy_setup import build_task_from_config, prepare_policy

    def sources(order: list[str], pinned: bool) -> dict[str, str]:
        pol = {n: f"{{name: {n}, model: {{family: llama, hidden_size: 32, num_layers: 1, num_heads: 4, "
               "intermediate_size: 64, max_positions: 32}, tokenizer: {kind: char}, warm_start: {enabled: "
               f"false}}{', init_seed: 7' if pinned and n == 'a' else ''}}}" for n in order}
        cfg = parse_config("name: t\npolicies: [" + ", ".join(pol[n] for n in order) + "]\n"
                           "task: {name: arithmetic, min_digits: 1, max_digits: 1, train_size: 64, eval_size: 8}\n",
                           "t")
        task, verifier = build_task_from_config(cfg)
        return {p.name: prepare_policy(cfg, i, task, verifier,
                                       tmp_path).arts.source for i, p in enumerate(cfg.policies)}

    assert sources(["a", "b"], False)["a"] != sources(["b", "a"], False)["a"]
    assert sources(["a", "b"], True)["a"] == sources(["b", "a"], True)["a"]


def test_a_loaded_policy_gets_its_learning_rate_by_size_when_it_is_prepared(tmp_path, arithmetic_task):
    """``optim.lr`` unset on a loaded model is settled by its parameter count when it is loaded, and said; a value
    the file sets is kept."""
    from mutualrl.config import parse_config
    from mutualrl.config.schema import PRETRAINED_LR
    from mutualrl.models.families import ModelShape
    from mutualrl.models.policy import load_policy
    from mutualrl.runtime.policy_setup import build_task_from_config, prepare_policy

    arts = load_policy(family="llama", shape=ModelShape(32, 1, 4, 64, 64), tokenizer_kind="char",
                       corpus=arithmetic_task.corpus, corpus_fingerprint=arithmetic_task.fingerprint(), seed=1)
    arts.model.save_pretrained(tmp_path / "m")
    arts.tokenizer.save_pretrained(tmp_path / "m")
    for optim, want in (("", PRETRAINED_LR), ("optim: {lr: 3.0e-6}", 3e-6)):
        cfg = parse_config(f"""
name: t
policies:
  - name: loaded
    model: {{path: {tmp_path / 'm'}}}
    {optim}
task: {{name: arithmetic, min_digits: 1, max_digits: 1, train_size: 64, eval_size: 8, answer_format: last_number}}
""", "t")
        task, verifier = build_task_from_config(cfg)
        said: list[str] = []
        prepare_policy(cfg, 0, task, verifier, tmp_path / "cache", said.append)
        assert cfg.policies[0].optim.lr == want
        assert any("RL learning rate 1e-05" in s for s in said) == (not optim), said
