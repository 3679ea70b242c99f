"""Micro-batched updates (docs/algorithms.md §7.2) and bf16 mixed precision (§7.1) on a real tiny model:
the gradient accumulated over micro-batches through ∂L/∂ℓ is the whole-batch update, for every loss term
(token-mean, KL to a reference, several mini-batches with the decoupled objective, SGT's rescue NLL), and a
bf16-mixed learner keeps fp32 weights, measures the sampler/learner gap and corrects for it."""

import copy

import pytest
import torch

from mutualrl.config import AlgorithmConfig, SharingConfig
from mutualrl.config.schema import OptimConfig, SgtConfig
from mutualrl.grpo import grpo_advantages
from mutualrl.models import load_policy
from mutualrl.models.families import ModelShape
from mutualrl.models.precision import resolve_precision
from mutualrl.see import ExperienceExchange, InProcessBroker
from mutualrl.services.learner import Learner, LearnerSettings, PeerIntake, TokenizerRegistry
from mutualrl.services.learner.micro_batches import plan_micro_batches
from mutualrl.services.learner.modes.base import group_ids
from mutualrl.services.learner.objective import OWN, Rows
from mutualrl.services.learner.update import StepInputs
from mutualrl.services.rollout import HFEngine, RolloutWorker, SamplingSpec
from mutualrl.tasks.verifiers import ExactMatchVerifier
from mutualrl.thl import ThlBudget
from mutualrl.weights import WeightStore

SHAPE = ModelShape(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_positions=64)


class _FirstChar(ExactMatchVerifier):
    def score(self, problem, completion):
        return 1.0 if completion[:1] == problem.answer[:1] else 0.0


def test_plan_keeps_every_row_once_within_both_bounds():
    lengths = [9, 3, 17, 4, 4, 30, 8, 12, 5, 6]
    plan = plan_micro_batches(lengths, max_rows=3, max_tokens=40)
    assert sorted(i for mb in plan for i in mb) == list(range(len(lengths)))
    for mb in plan:
        assert len(mb) <= 3
        assert len(mb) == 1 or max(lengths[i] for i in mb) * len(mb) <= 40
    # bucketed by length: each pass's rows are no shorter than the previous pass's
    assert all(max(lengths[i] for i in a) <= min(lengths[i] for i in b) for a, b in zip(plan, plan[1:]))
    assert plan_micro_batches(lengths) == [list(range(len(lengths)))]
    assert plan_micro_batches([50, 2], max_tokens=20) == [[1], [0]]  # a row over the budget goes alone


def _learner(arts, ex, store, algorithm, sharing=None, model=None, **settings):
    intake = PeerIntake(arts.tokenizer, _FirstChar(), TokenizerRegistry(), ThlBudget())
    s = LearnerSettings(group_size=4, algorithm=algorithm, sharing=sharing or SharingConfig(mode="none"),
                        optim=OptimConfig(lr=1e-2), **settings)
    m = model if model is not None else copy.deepcopy(arts.model)
    ref = copy.deepcopy(arts.model).eval() if algorithm.kl_coef > 0 else None
    return Learner("a", m, arts.tokenizer, ex, intake, store, s, peers=[], ref_model=ref)


@pytest.fixture(scope="module")
def sampled(arithmetic_task):
    """One step's real rollouts of a tiny llama (4 prompts x 4 samples) as a learner's rows."""
    arts = load_policy(family="llama", shape=SHAPE, tokenizer_kind="char", corpus=arithmetic_task.corpus,
                       corpus_fingerprint=arithmetic_task.fingerprint(), seed=3)
    ex = ExperienceExchange(InProcessBroker(), "mutualrl:mb")
    store = WeightStore()
    eng = HFEngine(arts.model, eos_id=arts.tokenizer.eos_token_id, pad_id=arts.tokenizer.pad_token_id, store=store)
    worker = RolloutWorker("a", eng, arts.tokenizer, _FirstChar(), ex, fingerprint=arts.fingerprint,
                           sampling=SamplingSpec(n=4, max_new_tokens=6, temperature=1.0, seed=5))
    spy = ex.subscribe("spy", ["rollout"], ["a"])
    worker.run_step(1, arithmetic_task.train[:4])
    rows = Rows()
    for r in sorted((m.payload for m in spy.poll()), key=lambda r: (r.prompt_id, r.sample_index)):
        rows.add(prompt_token_ids=r.prompt_token_ids, token_ids=r.token_ids, logprobs=r.logprobs,
                 mask=[1.0] * len(r.token_ids), reward=r.reward, prompt_id=r.prompt_id, source_policy="a", kind=OWN,
                 source_mean_logprob=sum(r.logprobs) / len(r.logprobs))
    adv = grpo_advantages(torch.tensor(rows.reward), group_ids(rows)[0])
    adv = adv + torch.linspace(-0.5, 0.5, len(rows))  # every row carries signal, whatever the rewards were
    return arts, ex, store, StepInputs(1, rows, adv, torch.ones(len(rows)), [])


@pytest.mark.parametrize("passes", ["one", "two"])
@pytest.mark.parametrize("algorithm, correction", [
    ({}, False),
    ({"loss_agg": "seq-mean-token-mean", "kl_coef": 0.1}, False),
    ({"minibatch_rows": 8}, True),  # two updates, π_prox recomputed for the second (decoupled objective)
    ({"loss": "gspo", "loss_agg": "seq-mean-token-mean"}, True),  # a sequence-level ratio: still row-local
])
def test_micro_batched_update_equals_the_whole_batch_update(sampled, algorithm, correction, passes, monkeypatch):
    """One pass per micro-batch (every mode's loss is row-local) and the two-pass path (a mode that pools ℓ
    across rows) both give the whole-batch update."""
    arts, ex, store, inputs = sampled
    # every row's whole sequence on both sides: the passes differ only in how they split the chain rule (a shared
    # prompt forward rounds differently in passes that group rows differently, and AdamW's first step amplifies it)
    whole = _learner(arts, ex, store, AlgorithmConfig(**algorithm, share_prompt_forward=False),
                     behaviour_correction=correction)
    micro = _learner(arts, ex, store, AlgorithmConfig(**algorithm, micro_batch_rows=3, micro_batch_tokens=48,
                                                      share_prompt_forward=False),
                     behaviour_correction=correction)
    forwards = []
    monkeypatch.setattr(type(micro.updater.mode), "row_local_loss", passes == "one")
    spied = micro.updater.forward.logprobs
    monkeypatch.setattr(micro.updater.forward, "logprobs", lambda *a, **k: forwards.append(1) or spied(*a, **k))
    assert len(micro.updater.plan(inputs.rows.prompt_token_ids, inputs.rows.token_ids)) > 3
    r_whole = whole.updater.apply(inputs, {"logprob": 0.0})
    r_micro = micro.updater.apply(inputs, {"logprob": 0.0})
    assert r_micro.losses == pytest.approx(r_whole.losses, rel=1e-5, abs=1e-7)
    assert r_micro.grad_norms == pytest.approx(r_whole.grad_norms, rel=1e-4)
    assert r_whole.grad_norms[0] > 0
    for key in ("ratio_mean", "behaviour_gap_p99"):  # the record's metrics are the whole mini-batch's too
        if key in r_whole.per_minibatch[0]:
            assert r_micro.per_minibatch[0][key] == pytest.approx(r_whole.per_minibatch[0][key], rel=1e-4, abs=1e-6)
    plans = [micro.updater.plan(inputs.rows.prompt_token_ids[sl], inputs.rows.token_ids[sl])
             for sl in micro.updater.mode.minibatches(inputs.rows, micro.s.algorithm.minibatch_rows)]
    passes_taken = sum(len(p) for p in plans) * (1 if passes == "one" else 2)
    kl_passes = sum(len(p) for p in plans) if algorithm.get("kl_coef") else 0  # the reference model's forwards
    prox_passes = sum(len(p) for p in plans[1:]) if correction else 0  # π_prox of mini-batches 1.. before updating
    assert len(forwards) == passes_taken + kl_passes + prox_passes
    start = dict(arts.model.named_parameters())
    for (name, a), (_, b) in zip(whole.model.named_parameters(), micro.model.named_parameters()):
        moved = float((a - start[name]).detach().abs().max())
        assert float((a - b).detach().abs().max()) <= 1e-3 * max(moved, 1e-8) + 1e-7, name


def test_micro_batches_carry_the_sgt_rescue_term(arithmetic_task):
    """The rescue NLL (its own forward on the rescued rows) joins the micro-batched update like the whole one."""
    from mutualrl.grpo.sgt import RescueItem

    arts = load_policy(family="llama", shape=SHAPE, tokenizer_kind="char", corpus=arithmetic_task.corpus,
                       corpus_fingerprint=arithmetic_task.fingerprint(), seed=4)
    tok = arts.tokenizer
    rows = Rows()
    for i in range(6):
        comp = tok(str(i), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.add(prompt_token_ids=tok("1+2=")["input_ids"], token_ids=comp, logprobs=[-2.0] * len(comp),
                 mask=[1.0] * len(comp), reward=float(i == 3), prompt_id="p", source_policy="a", kind=OWN,
                 source_mean_logprob=-2.0)
    rescue = RescueItem(prompt_id="p", prompt_token_ids=tok("1+2=")["input_ids"],
                        token_ids=tok("3", add_special_tokens=False)["input_ids"] + [tok.eos_token_id],
                        source_policy="b", message_id="m1")
    inputs = StepInputs(1, rows, grpo_advantages(torch.tensor(rows.reward), torch.zeros(6, dtype=torch.long)),
                        torch.ones(6), [rescue])
    ex, store = ExperienceExchange(InProcessBroker(), "mutualrl:mb2"), WeightStore()
    sharing = SharingConfig(mode="sgt", sgt=SgtConfig(weight=1.0))
    whole = _learner(arts, ex, store, AlgorithmConfig(share_prompt_forward=False), sharing)
    micro = _learner(arts, ex, store, AlgorithmConfig(micro_batch_rows=2, share_prompt_forward=False), sharing)
    r_whole, r_micro = (x.updater.apply(inputs, {"logprob": 0.0}) for x in (whole, micro))
    assert r_whole.per_minibatch[0]["sgt_nll"] > 0
    assert r_micro.losses == pytest.approx(r_whole.losses, rel=1e-5)
    for a, b in zip(whole.model.parameters(), micro.model.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("micro_batch_rows", [None, 8])
def test_a_shared_prompt_forward_gives_the_whole_sequences_update(sampled, micro_batch_rows, monkeypatch):
    """The learner's default, one forward per distinct prompt in a pass (docs/algorithms.md §7.2), trains what every
    row's whole sequence trains, to float rounding: the same loss, gradient norm and ratio, the weights within a few
    parts in 10⁴ of the step (AdamW's first step, lr·sign(g) on tiny gradients, amplifies rounding); its passes ran
    fewer rows than there are rows."""
    from mutualrl.models import generation

    arts, ex, store, inputs = sampled
    full = _learner(arts, ex, store, AlgorithmConfig(share_prompt_forward=False, micro_batch_rows=micro_batch_rows))
    shared = _learner(arts, ex, store, AlgorithmConfig(micro_batch_rows=micro_batch_rows))
    assert shared.s.algorithm.share_prompt_forward and shared.updater.forward.share_prompts
    prompt_rows = []
    real = generation._shared_prompt_logprobs
    monkeypatch.setattr(generation, "_shared_prompt_logprobs",
                        lambda model, prompts, *a: prompt_rows.append(len({tuple(q) for q in prompts}))
                        or real(model, prompts, *a))
    r_full = full.updater.apply(inputs, {"logprob": 0.0})
    assert not prompt_rows
    r_shared = shared.updater.apply(inputs, {"logprob": 0.0})
    assert prompt_rows and sum(prompt_rows) < len(inputs.rows.token_ids)  # a prompt ran once for several rows
    assert r_shared.losses == pytest.approx(r_full.losses, rel=1e-5, abs=1e-7)
    assert r_shared.grad_norms == pytest.approx(r_full.grad_norms, rel=1e-4)
    assert r_shared.per_minibatch[0]["ratio_mean"] == pytest.approx(r_full.per_minibatch[0]["ratio_mean"], rel=1e-5)
    start = dict(arts.model.named_parameters())
    for (name, a), (_, b) in zip(full.model.named_parameters(), shared.model.named_parameters()):
        moved = float((a - start[name]).detach().abs().max())
        assert float((a - b).detach().abs().max()) <= 1e-2 * max(moved, 1e-8) + 1e-7, name


def test_bf16_mixed_keeps_fp32_weights_and_corrects_for_the_sampler(sampled):
    """bf16-mixed: the forward under bf16 autocast against the fp32 sampler's log-probs — the gap is measured
    (mean, p99) and the decoupled objective anchors the clip at the learner's own numbers (ratio 1)."""
    arts, ex, store, inputs = sampled
    bf16 = resolve_precision("bf16-mixed", pretrained=True, device="cpu")
    learner = _learner(arts, ex, store, AlgorithmConfig(), precision=bf16, behaviour_correction=True)
    result = learner.updater.apply(inputs, {"logprob": 0.0})
    first = result.per_minibatch[0]
    assert all(p.dtype == torch.float32 for p in learner.model.parameters())
    assert 0 < first["behaviour_gap_mean"] <= first["behaviour_gap_p99"] < 1.0
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # clip anchored at π_prox = the learner's own
    assert 0 < first["is_weight_mean"] < 2.0
    exact = _learner(arts, ex, store, AlgorithmConfig())
    gap = exact.updater.apply(inputs, {"logprob": 0.0}).per_minibatch[0]
    assert gap["behaviour_gap_p99"] < 1e-4 < first["behaviour_gap_p99"]  # fp32 on both sides: the same numbers


def test_auto_correction_turns_on_past_the_bound(sampled, caplog):
    arts, ex, store, inputs = sampled
    learner = _learner(arts, ex, store, AlgorithmConfig(), behaviour_gap_bound=0.1)
    bad = copy.deepcopy(inputs)
    bad.rows.logprobs = [[lp - 0.5 for lp in row] for row in bad.rows.logprobs]  # another engine's numbers
    with caplog.at_level("WARNING", logger="mutualrl.learner"):
        learner.updater.apply(bad, {"logprob": 0.0})
    assert learner.updater.decoupled and learner.state_dict()["behaviour_correction"] is True
    assert any("behaviour correction is on" in r.getMessage() for r in caplog.records)


def test_a_bf16_engine_samples_a_bf16_copy_and_a_shared_one_under_autocast(sampled):
    arts, _, store, _ = sampled
    bf16 = resolve_precision("bf16-mixed", pretrained=True, device="cpu")
    tok = arts.tokenizer
    own = HFEngine(arts.model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, store=store, precision=bf16)
    assert {p.dtype for p in own.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in arts.model.parameters()} == {torch.float32}  # the learner's module is untouched
    shared = HFEngine(arts.model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, store=store, share=True,
                      precision=bf16)
    prompt = tok("1+2=")["input_ids"]
    for eng in (own, shared):
        out = eng.generate([prompt], SamplingSpec(n=2, max_new_tokens=4, seed=1))
        assert len(out[0]) == 2 and all(len(s.token_ids) == len(s.logprobs) > 0 for s in out[0])
