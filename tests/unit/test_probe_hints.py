"""The probes' response prefix (mutualrl.app.hint_probe, which tools/probe_hints.py uses): the required form's
opening, as a receiver's completion would start with it, and the hint text a receiver is shown in the probe's other
conditions; and the research tool's own synthetic hints."""

from __future__ import annotations

import pytest

from mutualrl.tasks.answers import required_form


@pytest.fixture(scope="module")
def probe():
    from mutualrl.app import hint_probe

    return hint_probe


@pytest.fixture(scope="module")
def tool(load_script):
    return load_script("tools/probe_hints.py")


def test_the_tools_synthetic_hints_are_a_bare_and_a_worked_answer(tool):
    assert tool.synthetic_peers("Calculate 12 + 34.", "46", "answer_tags") == {
        "bare": "<answer>46</answer>", "worked": "12 + 34 = 46\n\n<answer>46</answer>"}
    assert tool.synthetic_peers("Calculate 12 + 34.", "46", "last_number")["worked"] == "12 + 34 = 46"


@pytest.mark.parametrize("fmt, opening", [("answer_tags", "<answer>"), ("boxed", "\\boxed{"), ("last_number", "")])
def test_the_response_prefix_is_the_forms_opening(probe, fmt, opening):
    assert probe.form_opening(fmt) == opening
    assert required_form("46", fmt).startswith(opening)  # a completion opened with it can still end in the form


def test_a_masked_success_carries_work_only_with_a_number_beyond_the_question(probe):
    assert not probe.carries_work("12 + 34 = …", "Calculate 12 + 34.")
    assert probe.carries_work("12 + 30 = 42, 42 + 4 = …", "Calculate 12 + 34.")


def test_a_work_prefix_is_the_peers_text_before_its_answer_cut_at_a_word(probe):
    text = "Subtract 1 from both sides: 3p = 18. Divide both sides by 3: p = 6"
    expected = "Subtract 1 from both sides: 3p = 18. Divide both sides by 3: p = "
    assert probe.work_prefix(text, "last_number", 1.0) == expected
    half = probe.work_prefix(text, "last_number", 0.5)
    assert half == "Subtract 1 from both sides: 3p "  # the first 32 of 65 characters, cut back to a whole word
    assert probe.work_prefix("<answer>46</answer>", "answer_tags", 1.0) == "<answer>"  # a bare success: its form only
    assert probe.work_prefix("no answer here", "answer_tags", 1.0) == ""
    worked = "Step 2: Add 91 and 88\n91 + 88 = 179\n\nTherefore, the final answer is 179."
    assert probe.work_prefix(worked, "last_number", 1.0) == "Step 2: Add 91 and 88\n91 + 88 = 179\n\nTherefore, " \
        "the final answer is "  # without the answer: its final number only
    assert probe.work_prefix(worked, "last_number", 1.0, "179") == "Step 2: Add 91 and 88\n91 + 88 = "  # never it
