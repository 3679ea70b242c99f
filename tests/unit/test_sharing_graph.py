"""The sharing graph (`sharing.edges`): who learns from whom under which mode, checked when the experiment
loads, and what each learner then runs under."""

import pytest

from mutualrl.config import ConfigError, parse_config

POLICY = "{{name: {n}, model: {{family: llama}}, tokenizer: {{kind: char}}}}"
HEAD = "name: g\npolicies: [" + ", ".join(POLICY.format(n=n) for n in "abc") + "]\n"


def _cfg(sharing: str):
    return parse_config(HEAD + f"sharing: {sharing}\n", "t", check_paths=False)


def test_without_edges_every_policy_learns_from_every_other_under_the_mode():
    cfg = _cfg("{mode: sgt}")
    peers, sharing = cfg.sharing.for_receiver("b", ["a", "b", "c"])
    assert peers == ["a", "c"] and sharing.mode == "sgt" and sharing is cfg.sharing
    assert cfg.sharing.describe() == "sgt"


def test_edges_give_each_learner_its_sources_mode_and_settings():
    cfg = _cfg("{mode: sgt, sgt: {weight: 0.1}, edges: ["
               "{from: a, to: b}, {from: c, to: b, sgt: {weight: 0.5}},"
               "{from: b, to: a, mode: xgrpo, xgrpo: {variant: calibrated}}]}")
    names = ["a", "b", "c"]
    peers, b = cfg.sharing.for_receiver("b", names)
    assert peers == ["a", "c"] and b.mode == "sgt" and b.sgt.weight == 0.5  # the edge's settings
    peers, a = cfg.sharing.for_receiver("a", names)
    assert peers == ["b"] and a.mode == "xgrpo" and a.xgrpo.variant == "calibrated"
    peers, c = cfg.sharing.for_receiver("c", names)
    assert peers == [] and c.mode == "none"  # no incoming edge: it learns alone
    assert b.edges is None and cfg.sharing.modes_used(names) == {"sgt", "xgrpo", "none"}
    assert cfg.sharing.describe() == "graph: a->b sgt, c->b sgt, b->a xgrpo"


@pytest.mark.parametrize("edges, message", [
    ("[{from: a, to: z}]", "names no policy 'z'"),
    ("[{from: a, to: a}]", "is a loop"),
    ("[{from: a, to: b}, {from: a, to: b}]", "listed twice"),
    ("[{from: a, to: b}, {from: c, to: b, mode: xgrpo}]", "incoming edges under sgt, xgrpo"),
    ("[{from: a, to: b, sgt: {weight: 0.2}}, {from: c, to: b, sgt: {weight: 0.3}}]", "set different sgt settings"),
    ("[{from: a, to: b, mode: xgrpo, sgt: {weight: 0.2}}]", "mode xgrpo takes no sgt settings"),
    ("[{from: a, to: b, mode: none}]", "shares nothing"),
    ("[{from: a, to: b, weight: 2}]", "weight"),
])
def test_a_bad_graph_is_refused_with_a_clear_message(edges, message):
    with pytest.raises(ConfigError, match=message):
        _cfg("{mode: sgt, edges: " + edges + "}")


def test_an_edge_needs_a_mode_of_its_own_or_the_default():
    with pytest.raises(ConfigError, match="has no mode"):
        _cfg("{edges: [{from: a, to: b}]}")
    cfg = _cfg("{edges: [{from: a, to: b, mode: naive}]}")
    assert cfg.sharing.for_receiver("b", ["a", "b", "c"])[1].mode == "naive"
