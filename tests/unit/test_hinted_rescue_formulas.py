"""SGT-R's pure pieces (docs/algorithms.md §3.5) against hand-computed values: the per-token weight toward the
hint-free policy, the rescued rows' advantages, the hint's shrinking share, answer masking that keeps the form, and
the SGT NLL's style guards (§3.3)."""

import math

import pytest
import torch

from mutualrl.grpo import hint_fraction, hint_weights, rescue_advantages, sgt_nll, sgt_token_weights
from mutualrl.tasks.answers import MASK, answer_span, extract_answer, mask_answer, reasoning_before, required_form
from mutualrl.tasks.hints import HINT_TEMPLATE, build_hint, hint_excerpt, hint_prefix, reference_hint


def test_hint_weights_clip_the_ratio_to_the_hint_free_policy_between_floor_and_cap():
    # tokens: likely without the hint as with it (w 1), 100x less likely without (floored to 0.1), 4x more (capped)
    hint_free = torch.tensor([[math.log(0.5), math.log(0.005), math.log(0.8)]])
    behaviour = torch.tensor([[math.log(0.5), math.log(0.5), math.log(0.2)]])
    mask = torch.ones(1, 3)
    w, m = hint_weights(hint_free, behaviour, mask, w_min=0.1, w_max=2.0)
    assert torch.allclose(w, torch.tensor([[1.0, 0.1, 2.0]]))
    assert m["hint_floored_frac"].item() == pytest.approx(1 / 3)
    assert m["hint_capped_frac"].item() == pytest.approx(1 / 3)
    assert m["hint_weight_mean"].item() == pytest.approx((1.0 + 0.1 + 2.0) / 3)
    # Guide's floor of 0 leaves the unlikely-without-hint token nearly nothing: 0.01
    w0, _ = hint_weights(hint_free, behaviour, mask, w_min=0.0, w_max=2.0)
    assert w0[0, 1].item() == pytest.approx(0.01)
    # sequence level: one weight per row from the mean log-ratio (GSPO)
    ws, _ = hint_weights(hint_free, behaviour, mask, w_min=0.1, w_max=2.0, sequence_level=True)
    expected = math.exp((0.0 + math.log(0.01) + math.log(4.0)) / 3)
    assert ws.shape == (1,) and ws.item() == pytest.approx(max(0.1, expected))
    with pytest.raises(ValueError):
        hint_weights(hint_free, behaviour, mask, w_min=1.5, w_max=2.0)


def test_rescue_advantages_push_only_verified_rescues_above_the_own_baseline():
    own_r = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    own_g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    res_r = torch.tensor([1.0, 0.0, 1.0, 0.0])
    res_g = torch.tensor([0, 0, 1, 1])
    adv = rescue_advantages(own_r, own_g, res_r, res_g, norm_by_std=False)
    # group 0: baseline 0 -> success 1, failure 0; group 1: baseline 0.25 -> success 0.75, failure clamped to 0
    assert adv.tolist() == pytest.approx([1.0, 0.0, 0.75, 0.0])
    normed = rescue_advantages(own_r, own_g, res_r, res_g, norm_by_std=True)
    std0 = torch.tensor([0, 0, 0, 0, 1.0, 0]).std().item()  # the group with its rescues, unbiased
    std1 = torch.tensor([1.0, 0, 0, 0, 1.0, 0]).std().item()
    assert normed.tolist() == pytest.approx([1.0 / (std0 + 1e-6), 0.0, 0.75 / (std1 + 1e-6), 0.0], rel=1e-5)
    assert rescue_advantages(own_r, own_g, torch.zeros(0), torch.zeros(0, dtype=torch.long)).numel() == 0


def test_the_hint_shrinks_linearly_and_is_cut_at_a_word_boundary():
    assert hint_fraction(1, 0.75, 0.25, 20) == pytest.approx(0.75)
    assert hint_fraction(11, 0.75, 0.25, 20) == pytest.approx(0.5)
    assert hint_fraction(21, 0.75, 0.25, 20) == pytest.approx(0.25)
    assert hint_fraction(500, 0.75, 0.25, 20) == pytest.approx(0.25)
    assert hint_fraction(7, 0.5, 0.1, 0) == 0.5
    text = "First add the tens, then the ones, then write the sum."
    assert hint_prefix(text, 0.3) == "First add the tens,"
    assert hint_prefix(text, 1.0) == text and hint_prefix(text, 0.0) == ""
    assert hint_prefix("word", 0.01) == "word"


@pytest.mark.parametrize("fmt,text,masked", [
    ("last_number", "12 + 34 = 46", "12 + 34 = " + MASK),
    ("last_number", "46 is it: 12 + 34 = 46", MASK + " is it: 12 + 34 = " + MASK),
    ("answer_tags", "12 + 34 is <answer>46</answer>", "12 + 34 is <answer>" + MASK + "</answer>"),
    ("boxed", "so \\boxed{46}.", "so \\boxed{" + MASK + "}."),
    ("last_line", "12 + 34\n46", "12 + 34\n" + MASK),
    ("whole", "46", MASK),
])
def test_masking_keeps_the_answers_form_and_removes_its_content(fmt, text, masked):
    gives = lambda t: extract_answer(t, fmt) == "46"  # noqa: E731 - the verifier's check, in one line
    out, was = mask_answer(text, fmt, gives, "46")
    assert (out, was) == (masked, True)
    assert not gives(out)


def test_a_hint_that_gives_nothing_away_is_left_as_it_is_and_numbers_containing_the_answer_stay():
    gives = lambda t: extract_answer(t, "last_number") == "46"  # noqa: E731
    assert mask_answer("add 12 and 34, not 146 or 4.6", "last_number", gives, "46") == (
        "add 12 and 34, not 146 or 4.6", False)


def test_answer_spans_and_required_forms():
    assert answer_span("a <answer> x </answer>", "answer_tags") == (10, 13)
    assert answer_span("no number", "last_number") is None
    assert required_form("46", "answer_tags") == "<answer>46</answer>"
    assert required_form("46", "boxed") == "\\boxed{46}"
    assert required_form("46", "last_number") == "46"


def test_a_built_hint_sits_in_the_fixed_frame_with_its_answer_masked():
    gives = lambda t: extract_answer(t, "answer_tags") == "46"  # noqa: E731
    peer = "Add the tens: 10 + 30 = 40. Add the ones: 2 + 4 = 6. <answer>46</answer>"
    h = build_hint("What is 12 + 34?", peer, show="all", fraction=1.0, answer_format="answer_tags",
                   gives_answer=gives, answer="46")
    assert h.masked and "<answer>" + MASK + "</answer>" in h.text and "46" not in h.text
    assert h.question.startswith("What is 12 + 34?\n\n") and h.question.endswith("<hint>\n" + h.text + "\n</hint>")
    assert hint_excerpt(peer, "reasoning", 1.0, "answer_tags").endswith("<answer>")
    bare = build_hint("What is 12 + 34?", "<answer>46</answer>", show="all", fraction=1.0,
                      answer_format="answer_tags", gives_answer=gives, answer="46")
    assert bare.text == "<answer>" + MASK + "</answer>"  # a bare answer leaves only its form
    ref = reference_hint("What is 12 + 34?", "46")
    assert "46" in ref.text and not ref.masked
    assert HINT_TEMPLATE.count("{hint}") == 1


def test_sgt_style_guards_weigh_tokens_by_the_receivers_own_probability():
    logp = torch.log(torch.tensor([[0.5, 0.01, 0.99]]))
    assert torch.allclose(sgt_token_weights(logp, "chord"), torch.tensor([[0.25, 0.0099, 0.0099]]), atol=1e-6)
    assert torch.allclose(sgt_token_weights(logp, "luffy", 0.1),
                          torch.tensor([[0.5 / 0.6, 0.01 / 0.11, 0.99 / 1.09]]), atol=1e-6)
    assert torch.equal(sgt_token_weights(logp, "none"), torch.ones_like(logp))
    mask = torch.ones_like(logp)
    plain = sgt_nll(logp, mask).item()
    guarded = sgt_nll(logp, mask, sgt_token_weights(logp, "chord")).item()
    assert plain == pytest.approx(-logp.sum().item() / 3)
    assert guarded == pytest.approx(-(logp * sgt_token_weights(logp, "chord")).sum().item() / 3)
    with pytest.raises(ValueError):
        sgt_token_weights(logp, "other")


@pytest.mark.parametrize("fmt,text,work", [
    ("answer_tags", "12 + 34 = 46. <answer>46</answer>", "12 + 34 = 46."),
    ("answer_tags", "<answer>46</answer>", ""),
    ("last_number", "46", ""),
    ("last_number", "12+34=46", "12+34="),
    ("boxed", "so \\boxed{46}", "so"),
    ("answer_tags", "no answer here", "no answer here"),
])
def test_the_work_before_an_answer_excludes_the_answer_and_its_forms_opening(fmt, text, work):
    assert reasoning_before(text, fmt) == work
