"""One real learner step over the in-process SEE: the learning signal moves the right way,
SGT rescues cross tokenizers, and false success claims are rejected."""

import copy
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

from mutualrl.config import AlgorithmConfig, SharingConfig
from mutualrl.config.schema import OptimConfig, SgtConfig
from mutualrl.models import load_policy
from mutualrl.models.families import ModelShape
from mutualrl.models.generation import sequence_logprobs
from mutualrl.see import ExperienceExchange, InProcessBroker
from mutualrl.services.learner import Learner, LearnerSettings, PeerIntake, TokenizerRegistry
from mutualrl.services.rollout import HFEngine, RolloutWorker, SamplingSpec
from mutualrl.tasks import Problem
from mutualrl.tasks.verifiers import ExactMatchVerifier
from mutualrl.thl import ThlBudget
from mutualrl.v1 import experience_pb2 as pb
from mutualrl.weights import WeightStore

SHAPE = ModelShape(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_positions=64)


class _Oracle(ExactMatchVerifier):
    """Rewards completions that start with the answer's first character: frequent enough
    for a random tiny model that groups have mixed rewards."""

    def score(self, problem, completion):
        return 1.0 if completion[:1] == problem.answer[:1] else 0.0


def _policy(name, family, kind, task, seed):
    return load_policy(family=family, shape=SHAPE, tokenizer_kind=kind, corpus=task.corpus,
                       corpus_fingerprint=task.fingerprint(), seed=seed)


class _NeverRight(ExactMatchVerifier):
    """Every completion fails: GRPO sees all-equal groups only."""

    def score(self, problem, completion):
        return 0.0


def _setup(task, mode="sgt", lr=1e-2, warmup_steps=0, bank=0, temperature=1.0, verifier_cls=None,
           state_dtype="float32"):
    ex = ExperienceExchange(InProcessBroker(), "mutualrl:it")
    store = WeightStore()
    reg = TokenizerRegistry()
    pols = {"a": _policy("a", "llama", "char", task, 1), "b": _policy("b", "gpt2", "bpe", task, 2)}
    for p in pols.values():
        reg.register(p.fingerprint, p.tokenizer)
    sharing = SharingConfig(mode=mode, sgt=SgtConfig(weight=1.0, gate_tau=1.0, bank_prompts=bank))
    out = {}
    for name, arts in pols.items():
        verifier = (verifier_cls or _Oracle)()
        eng = HFEngine(arts.model, eos_id=arts.tokenizer.eos_token_id, pad_id=arts.tokenizer.pad_token_id, store=store)
        worker = RolloutWorker(name, eng, arts.tokenizer, verifier, ex, fingerprint=arts.fingerprint,
                               sampling=SamplingSpec(n=8, max_new_tokens=4, temperature=temperature))
        intake = PeerIntake(arts.tokenizer, verifier, reg, ThlBudget())
        settings = LearnerSettings(group_size=8, algorithm=AlgorithmConfig(), sharing=sharing,
                                   optim=OptimConfig(lr=lr, warmup_steps=warmup_steps, state_dtype=state_dtype),
                                   peer_deadline_s=2.0,
                                   temperature=temperature, no_signal_warn_steps=2)
        learner = Learner(name, arts.model, arts.tokenizer, ex, intake, store, settings,
                          peers=[n for n in pols if n != name])
        out[name] = (arts, eng, worker, learner)
    return ex, store, out


@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
def test_grpo_step_raises_logprob_of_rewarded_completions(arithmetic_task, state_dtype):
    """With either optimiser state (bf16 moments: docs/algorithms.md §7.4) the step moves the right way."""
    ex, store, pols = _setup(arithmetic_task, mode="none", lr=3e-3, state_dtype=state_dtype)
    arts, eng, worker, learner = pols["a"]
    problems = arithmetic_task.train[:8]
    spy = ex.subscribe("spy", ["rollout"], ["a"])
    worker.run_step(1, problems)
    rolls = [r.payload for r in spy.poll()]
    before = copy.deepcopy(arts.model.state_dict())
    rec = learner.train_step(1, problems)
    assert rec.reward_mean > 0 and rec.weights_version == 1
    assert rec.ratio_mean == pytest.approx(1.0, abs=1e-4)  # on-policy: learner log-probs equal the sampler's
    # the sampling entropy's estimate: the mean −log π of the own rollouts' trained tokens, as sampled
    own_tokens = [lp for r in rolls for lp in r.logprobs]
    assert rec.extra["own_sampled_nll"] == pytest.approx(-sum(own_tokens) / len(own_tokens), rel=1e-5)
    assert rec.extra["own_sampled_nll"] > 0
    assert any(not torch.equal(before[k], v) for k, v in arts.model.state_dict().items())
    if sys.platform.startswith("linux"):  # where its memory went, stage by stage, from the kernel's counters
        peaks = rec.extra["stage_peak_rss_gib"]
        assert set(peaks) == {"intake", "train", "weight_sync"} and all(v > 0 for v in peaks.values())

    # per-prompt advantage sign: rewarded completions gain log-prob, unrewarded lose it (on average)
    by_group: dict[str, list] = {}
    for r in rolls:
        by_group.setdefault(r.prompt_id, []).append(r)
    mixed = [r for g in by_group.values() if 0 < sum(x.reward for x in g) < len(g) for r in g]
    assert mixed, "need at least one group with mixed rewards"
    new_lp, mask = sequence_logprobs(arts.model, [list(r.prompt_token_ids) for r in mixed],
                                     [list(r.token_ids) for r in mixed], pad_id=arts.tokenizer.pad_token_id)
    new_seq = (new_lp * mask).sum(-1)
    old_seq = torch.tensor([sum(r.logprobs) for r in mixed])
    delta = new_seq.detach() - old_seq
    pos = torch.tensor([r.reward > 0 for r in mixed])
    assert delta[pos].mean() > 0 > delta[~pos].mean()

    # the rollout side loads the new version only after it is published
    wp = [m for m in ex.subscribe("a-rollout", ["weights_published"], ["a"]).poll()]
    assert len(wp) == 1 and wp[0].payload.version == 1
    eng.update_weights(wp[0].payload.version, wp[0].payload.uri, wp[0].payload.checksum)
    assert eng.info().weights_version == 1
    with pytest.raises(ValueError, match="not newer"):
        eng.update_weights(1, wp[0].payload.uri)


def test_at_temperature_0_7_the_first_update_is_on_policy(arithmetic_task):
    """The learner scores π_θ at the engine's temperature: the PPO ratio of a step's first update is 1 (it was
    ~0.9 or ~1.1 per token when the learner ignored T, and clipped)."""
    ex, store, pols = _setup(arithmetic_task, mode="none", lr=3e-3, temperature=0.7)
    arts, eng, worker, learner = pols["a"]
    problems = arithmetic_task.train[:8]
    worker.run_step(1, problems)
    rec = learner.train_step(1, problems)
    assert rec.ratio_mean == pytest.approx(1.0, abs=1e-4) and rec.clip_frac == 0.0


def test_steps_without_a_mixed_group_are_counted_and_warned_about(arithmetic_task, caplog):
    ex, store, pols = _setup(arithmetic_task, mode="none", verifier_cls=_NeverRight)
    arts, eng, worker, learner = pols["a"]
    problems = arithmetic_task.train[:4]
    runs = []
    with caplog.at_level("WARNING", logger="mutualrl.learner"):
        for step in (1, 2):
            worker.run_step(step, problems)
            rec = learner.train_step(step, problems)
            runs.append((rec.signal_groups, rec.no_signal_steps))
    assert runs == [(0, 1), (0, 2)]
    warned = [r for r in caplog.records if "GRPO has no signal" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelname == "WARNING" and "2 steps in a row" in warned[0].getMessage()


def test_sgt_rescues_cross_tokenizers_and_rejects_false_claims(arithmetic_task):
    ex, store, pols = _setup(arithmetic_task, mode="sgt")
    problems = [Problem("12+34=", "46"), Problem("5+5=", "10")]
    # learner "a" sees an all-fail own group on both prompts (rewards all 0)
    a_arts, _, _, a_learner = pols["a"]
    tok = a_arts.tokenizer
    for p in problems:
        ids = tok(p.prompt)["input_ids"]
        comp = tok("0", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        for i in range(8):
            ex.publish(pb.Rollout(prompt_id=p.prompt_id, prompt_text=p.prompt, prompt_token_ids=ids, token_ids=comp,
                                  logprobs=[-1.0] * len(comp), reward=0.0, step=1, sample_index=i, group_size=8), "a")
    # peer "b" (BPE vocabulary) claims one true success and one false one
    b_tok = pols["b"][0].tokenizer
    b_fp = pols["b"][0].fingerprint
    for p, claim in ((problems[0], "46"), (problems[1], "11")):
        ids = b_tok(claim, add_special_tokens=False)["input_ids"] + [b_tok.eos_token_id]
        ex.publish(pb.VerifiedSuccess(prompt_id=p.prompt_id, prompt_text=p.prompt, completion_text=claim, token_ids=ids,
                                      logprobs=[-0.5] * len(ids), reward=1.0, step=1, tokenizer_fingerprint=b_fp), "b")
    a_learner.intake.verifier = ExactMatchVerifier()  # the receiver's own exact verifier re-checks claims
    rec = a_learner.train_step(1, problems)
    assert rec.rescue_count == 1
    assert rec.peer_rejected == {"reverify_failed": 1}
    assert rec.extra["sgt_nll"] is not None and rec.extra["sgt_nll"] > 0
    assert rec.thl_residual == 0.0


def test_a_banked_peer_success_rescues_its_prompt_when_it_comes_up_steps_later(arithmetic_task):
    """SGT under bounded peers (docs/algorithms.md §6): a peer's verified success for a prompt this learner is
    not training now is banked, then released, re-verified and trained on when that prompt comes up."""
    ex, store, pols = _setup(arithmetic_task, mode="sgt", bank=16)
    a_arts, _, _, a_learner = pols["a"]
    tok = a_arts.tokenizer
    later, now = Problem("12+34=", "46"), Problem("5+5=", "10")

    def own_all_fail(p, step):
        ids = tok(p.prompt)["input_ids"]
        comp = tok("0", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        for i in range(8):
            ex.publish(pb.Rollout(prompt_id=p.prompt_id, prompt_text=p.prompt, prompt_token_ids=ids, token_ids=comp,
                                  logprobs=[-1.0] * len(comp), reward=0.0, step=step, sample_index=i, group_size=8),
                       "a")

    b_tok, b_fp = pols["b"][0].tokenizer, pols["b"][0].fingerprint
    ids = b_tok("46", add_special_tokens=False)["input_ids"] + [b_tok.eos_token_id]
    ex.publish(pb.VerifiedSuccess(prompt_id=later.prompt_id, prompt_text=later.prompt, completion_text="46",
                                  token_ids=ids, logprobs=[-0.5] * len(ids), reward=1.0, step=1,
                                  tokenizer_fingerprint=b_fp), "b")
    a_learner.intake.verifier = ExactMatchVerifier()
    own_all_fail(now, 1)
    rec = a_learner.train_step(1, [now])  # the success is for another prompt: banked, not rejected
    assert rec.extra["bank_successes"] == 1 and rec.extra["bank_released"] == 0 and rec.rescue_count == 0
    assert rec.peer_rejected == {}
    own_all_fail(later, 3)
    rec = a_learner.train_step(3, [later])  # two steps later (over max_version_lag 1), its prompt comes up
    assert rec.extra["bank_released"] == 1 and rec.extra["bank_successes"] == 0
    assert rec.rescue_count == 1 and rec.extra["sgt_nll"] > 0
    assert a_learner.last_used["peer"] == []  # acknowledged when banked, at step 1: not listed twice


def test_learner_waits_for_its_deadline_then_trains_on_what_arrived(arithmetic_task):
    ex, store, pols = _setup(arithmetic_task, mode="none")
    arts, eng, worker, learner = pols["a"]
    learner.s.peer_deadline_s = 0.3
    problems = arithmetic_task.train[:4]
    worker.run_step(1, problems[:2])  # only half of the expected rollouts ever arrive
    rec = learner.train_step(1, problems)
    assert rec.weights_version == 1 and rec.reward_mean >= 0
    # nothing at all arrives: the step is skipped instead of deadlocking
    rec = learner.train_step(2, problems)
    assert rec.skipped is True


def _own_all_fail(ex, arts, problems, step=1):
    """Eight failing own rollouts per prompt, with the model's true behaviour log-probs (on-policy)."""
    tok = arts.tokenizer
    for p in problems:
        ids = tok(p.prompt)["input_ids"]
        comp = tok("0", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        with torch.no_grad():
            lp, _ = sequence_logprobs(arts.model, [ids], [comp], pad_id=tok.pad_token_id)
        for i in range(8):
            ex.publish(pb.Rollout(prompt_id=p.prompt_id, prompt_text=p.prompt, prompt_token_ids=ids, token_ids=comp,
                                  logprobs=lp[0].tolist(),
                                  reward=0.0, step=step, sample_index=i, group_size=8, finish_reason="stop"), "a")


@pytest.mark.parametrize("mode", ["naive", "prp", "hacpo"])
def test_peer_rollouts_are_converted_reverified_and_bad_ones_counted(arithmetic_task, mode):
    ex, store, pols = _setup(arithmetic_task, mode=mode)
    problems = [Problem("12+34=", "46"), Problem("5+5=", "10")]
    a_arts, _, _, a_learner = pols["a"]
    a_learner.intake.verifier = ExactMatchVerifier()
    _own_all_fail(ex, a_arts, problems)
    b_tok, b_fp = pols["b"][0].tokenizer, pols["b"][0].fingerprint
    for p in problems:  # a complete peer group per prompt: one true success, seven failures
        for i in range(8):
            text = p.answer if i == 0 else "7"
            ids = b_tok(text, add_special_tokens=False)["input_ids"] + [b_tok.eos_token_id]
            ex.publish(pb.Rollout(prompt_id=p.prompt_id, prompt_text=p.prompt, completion_text=text, token_ids=ids,
                                  logprobs=[-0.7] * len(ids),
                                  reward=1.0 if i == 0 else 0.0, step=1, sample_index=i, group_size=8,
                                  finish_reason="stop", tokenizer_fingerprint=b_fp), "b")
    bad = [
        pb.Rollout(prompt_id=problems[0].prompt_id, prompt_text=problems[0].prompt, completion_text="99",
                   token_ids=b_tok("99", add_special_tokens=False)["input_ids"],
                   logprobs=[-0.1], reward=1.0, step=1, sample_index=9, group_size=8, tokenizer_fingerprint=b_fp),
                   # ids and log-probs differ in length
        pb.Rollout(prompt_id="nope", prompt_text="1+1=", completion_text="2", token_ids=[5], logprobs=[-0.1],
                   reward=1.0, step=1, tokenizer_fingerprint=b_fp),
        pb.Rollout(prompt_id=problems[1].prompt_id, prompt_text=problems[1].prompt, completion_text="10", token_ids=[5],
                   logprobs=[-0.1], reward=1.0, step=1, tokenizer_fingerprint="unknown-vocab"),
    ]
    for m in bad:
        ex.publish(m, "b")
    rec = a_learner.train_step(1, problems)
    assert rec.peer_rows == 16 and rec.shared_in == 16
    assert rec.peer_rejected == {"malformed": 1, "unknown_prompt": 1, "unknown_tokenizer": 1}
    assert rec.thl_residual == 0.0 and rec.thl_non_canonical == 0
    assert torch.isfinite(torch.tensor(rec.loss))
    if mode == "hacpo":
        assert rec.extra["cross_rows"] == 16 and rec.extra["self_rows"] == 16
        # own capability 0, peer 1/8: the floor keeps ω finite and the ratio clip bounds it at 10
        assert rec.extra["omega_mean"] == pytest.approx(10.0)
    if mode == "prp":
        assert rec.extra["peer_weight_mean"] > 0


def test_forged_peer_reward_is_rescored_by_the_receiver(arithmetic_task):
    ex, store, pols = _setup(arithmetic_task, mode="naive")
    problems = [Problem("12+34=", "46")]
    a_arts, _, _, a_learner = pols["a"]
    a_learner.intake.verifier = ExactMatchVerifier()
    _own_all_fail(ex, a_arts, problems)
    b_tok, b_fp = pols["b"][0].tokenizer, pols["b"][0].fingerprint
    ids = b_tok("45", add_special_tokens=False)["input_ids"] + [b_tok.eos_token_id]
    ex.publish(pb.Rollout(prompt_id=problems[0].prompt_id, prompt_text=problems[0].prompt, completion_text="45",
                          token_ids=ids, logprobs=[-0.5] * len(ids),
                          reward=1.0, step=1, sample_index=0, group_size=1, finish_reason="stop",
                          tokenizer_fingerprint=b_fp), "b")
    intake = a_learner.intake.rollouts([r for r in a_learner.peer_sub.poll()], 1, {p.prompt_id: p for p in problems})
    assert intake.rejected == {} and intake.rescored == 1  # re-scored and used, not rejected
    assert [r.reward for r in intake.rows] == [0.0]  # the false success is trained on as a failure
    assert intake.claims == {"b": 1} and intake.failures == {"b": 1}  # ... and it counts against the peer


def test_xgrpo_uses_peer_stats_and_rejects_invalid_ones(arithmetic_task):
    ex, store, pols = _setup(arithmetic_task, mode="xgrpo")
    problems = [Problem("12+34=", "46"), Problem("5+5=", "10")]
    a_arts, _, _, a_learner = pols["a"]
    _own_all_fail(ex, a_arts, problems)
    ex.publish(pb.AdvantageStats(prompt_id=problems[0].prompt_id, step=1, count=8, mean=0.5, std=0.53,
                                 success_rate=0.5), "b")
    ex.publish(pb.AdvantageStats(prompt_id=problems[1].prompt_id, step=1, count=8, mean=float("nan"), std=0.1,
                                 success_rate=0.5), "b")
    rec = a_learner.train_step(1, problems)
    assert rec.shared_in == 1 and rec.peer_rejected == {"invalid_stats": 1}
    # the all-fail own group on prompt 0 got a negative advantage (GRPO would give 0): the update moved
    assert rec.grad_norm > 0 and rec.extra["xgrpo_baseline_mean"] > 0


class _Everything(ExactMatchVerifier):
    def score(self, problem, completion):
        return 1.0


def test_no_optimiser_step_without_gradient_signal(arithmetic_task):
    # a real step first (AdamW gets momentum), then a step whose groups are all rewarded alike:
    # every advantage is 0, the gradient is 0, and AdamW's momentum must not move the weights
    ex, store, pols = _setup(arithmetic_task, mode="none", lr=3e-3)
    arts, eng, worker, learner = pols["a"]
    problems = arithmetic_task.train[:8]
    worker.run_step(1, problems)
    learner.train_step(1, problems)
    # the learner re-scores own rewards with its verifier
    worker.verifier = learner.intake.verifier = _Everything()
    worker.run_step(2, problems)
    before = copy.deepcopy(arts.model.state_dict())
    rec = learner.train_step(2, problems)
    assert all(torch.equal(before[k], v) for k, v in arts.model.state_dict().items())
    assert rec.empty_updates == rec.updates >= 1


def test_learning_rate_warms_up_linearly_from_the_step(arithmetic_task):
    ex, store, pols = _setup(arithmetic_task, mode="none", lr=4e-3, warmup_steps=4)
    arts, eng, worker, learner = pols["a"]
    for step in (1, 2):
        problems = arithmetic_task.train[8 * step: 8 * step + 8]
        worker.run_step(step, problems)
        learner.train_step(step, problems)
        assert learner.updater.opt.param_groups[0]["lr"] == pytest.approx(4e-3 * step / 4)


class _HostReads(TorchFunctionMode):
    """Counts reads of floating-point tensor values back to Python (``float(t)``, ``t.item()``,
    ``t.tolist()``): on a GPU each one waits for the device to drain its queue."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("item", "tolist", "__float__") and args and isinstance(args[0],
                torch.Tensor) and args[0].is_floating_point():
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("minibatch_rows", [None, 16])
def test_step_reads_device_values_back_once(arithmetic_task, minibatch_rows):
    """Losses, gradient norms, skip decisions and every diagnostic stay tensors until one read at
    the end of the step, however many mini-batches it has (1 or 4 here)."""
    ex, store, pols = _setup(arithmetic_task, mode="none", lr=3e-3)
    arts, eng, worker, learner = pols["a"]
    learner.s.algorithm = AlgorithmConfig(minibatch_rows=minibatch_rows)
    problems = arithmetic_task.train[:8]
    worker.run_step(1, problems)
    with _HostReads() as reads:
        rec = learner.train_step(1, problems)
    assert rec.updates == (1 if minibatch_rows is None else 4)
    assert rec.loss is not None and rec.grad_norm > 0 and isinstance(rec.clip_frac, float)
    assert reads.count == 1


@pytest.mark.parametrize("shares_host,free,trimmed", [(True, 0.3, 2), (True, 0.8, 0), (False, 0.3, 0)])
def test_a_learner_returns_its_freed_pages_where_it_shares_a_host_short_of_memory(arithmetic_task, monkeypatch,
                                                                                 shares_host, free, trimmed):
    """A learner in its own process (`up`) trims after its update and its publish while under half of its memory is
    free; with more free, or beside every other policy in one process (`run`), it keeps the pages for its next
    update (mutualrl.runtime.memory)."""
    import mutualrl.runtime.memory as memory

    trims = []
    monkeypatch.delenv(memory.RETURN_FREED_MEMORY_ENV, raising=False)
    monkeypatch.setattr(memory, "_libc_trim", lambda: lambda pad: trims.append(pad) or 1)
    monkeypatch.setattr(memory, "free_memory_share", lambda: free)
    ex, store, pols = _setup(arithmetic_task, mode="none", lr=3e-3)
    arts, eng, worker, learner = pols["a"]
    learner.s.return_freed_memory = shares_host
    assert learner.s.trim_when_free_below == 0.5  # the default
    problems = arithmetic_task.train[:8]
    worker.run_step(1, problems)
    learner.train_step(1, problems)
    assert len(trims) == trimmed  # after the update and after the publish, or never


def test_non_finite_loss_raises_and_leaves_the_weights(arithmetic_task, monkeypatch):
    ex, store, pols = _setup(arithmetic_task, mode="none", lr=3e-3)
    arts, eng, worker, learner = pols["a"]
    problems = arithmetic_task.train[:8]
    worker.run_step(1, problems)
    real = learner.mode.loss

    def poisoned(x):
        out = real(x)
        out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(learner.mode, "loss", poisoned)
    before = copy.deepcopy(arts.model.state_dict())
    with pytest.raises(FloatingPointError, match="non-finite loss or gradient at step 1"):
        learner.train_step(1, problems)
    assert all(torch.equal(before[k], v) for k, v in arts.model.state_dict().items())
