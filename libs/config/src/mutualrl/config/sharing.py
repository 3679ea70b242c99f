"""What policies share and how: the sharing modes' settings, the graph's edges, asynchronous sampling and THL's
budget (docs/algorithms.md §2–§6)."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import ConfigDict, Field, model_validator

from mutualrl.config.strict import Strict as _Strict


class SgtConfig(_Strict):
    """Success-Gated Transfer (docs/algorithms.md §3.3)."""

    variant: Literal["nll", "group_insert"] = Field("nll",
                                                    description="nll: λ·length-normalised NLL term; group_insert: y* "
                                                    "joins the group (ratio 1).")
    weight: float = Field(0.1, ge=0, description="λ_SGT, weight of the rescue NLL term (nll variant).")
    gate_tau: float = Field(0.0, ge=0, le=1, description="Open the gate when own successes <= τ·G (τ=0: only all-fail "
                            "groups).")
    max_per_prompt: int = Field(1, ge=1, description="K_r, rescued successes kept per prompt (see select).")
    bank_prompts: int = Field(0, ge=0, description="Prompts kept in the learner's bank of peers' verified successes "
                              "for prompts it is not training now, released when the prompt comes up again (0: no "
                              "bank). Meant for async.peers bounded, where a peer's successes arrive at other steps.")
    bank_max_age: int = Field(32, ge=0, description="Steps a banked success stays usable.")
    guard: Literal["none", "chord", "luffy"] = Field(
        "chord", description="A per-token style guard on the NLL (nll variant, docs/algorithms.md §3.3): chord weighs "
        "each rescued token by p(1-p) of the receiver's own probability, luffy by p/(p+gamma); a token the receiver "
        "finds very unlikely (a foreign answer form) then weighs ~0. none: the plain NLL, which copied a bare-answer "
        "peer's form into SmolLM2 (docs/results/real/report.md); chord, the default, did not.")
    luffy_gamma: float = Field(0.1, gt=0, description="gamma of the luffy guard's p/(p+gamma).")
    select: Literal["shortest", "any"] = Field(
        "any", description="Which K_r successes of a prompt are kept: any (message order, the default: no preference "
        "for bare answers), or the shortest (the first SGT's choice).")


class SgtRConfig(_Strict):
    """SGT-R: a peer's verified success as a hint in the receiver's prompt; the receiver learns from the
    completions it samples itself (docs/algorithms.md §3.5, our design)."""

    hint: Literal["peer", "reference", "none"] = Field(
        "peer", description="What the rescue samples see: peer — a peer's re-verified success, its answer masked; "
        "reference — the task's own answer (no peer: a control); none — no hint text, k more plain samples of the "
        "prompts a peer solved (resample-only, a control).")
    samples: int = Field(4, ge=1, le=64, description="k, rescue samples per rescued prompt (counted in the policy's "
                         "rollouts: compare at equal rollouts).")
    max_prompts: int = Field(4, ge=1, description="Rescued prompts per step at most (the groups nearest to all-fail "
                             "first).")
    gate_tau: float = Field(0.0, ge=0, le=1, description="Rescue a prompt when own successes <= tau*G (0: all-fail "
                            "groups only).")
    show: Literal["all", "reasoning", "prefix"] = Field(
        "all", description="How much of the peer's text the hint shows: all of it (its answer masked, its form "
        "kept: what a receiver that never writes the required form needs to see), its reasoning (the text before "
        "its final answer), or its first fraction (prefix_start -> prefix_end over prefix_steps, QuestA's "
        "schedule).")
    prefix_start: float = Field(0.75, gt=0, le=1, description="The share of the peer's text shown at step 1.")
    prefix_end: float = Field(0.25, gt=0, le=1, description="The share shown after prefix_steps steps.")
    prefix_steps: int = Field(20, ge=0, description="Steps over which the shown share shrinks (0: prefix_start "
                              "throughout).")
    min_gain: Optional[float] = Field(
        None, description="The information gate: use the hint when it raises the receiver's log-probability of "
        "writing the verified answer in the required form by more than this many nats (delta = log p(answer | x + "
        "hint, the peer's work) - log p(answer | x)); otherwise the rescue is k plain samples. None (the default): "
        "every hint is used and delta is only recorded — on SmolLM2 its sign did not follow what a hint carried "
        "(docs/results/real/sgt-r/README.md).")
    max_hint_tokens: int = Field(256, ge=8, description="A peer's text longer than this (in the receiver's tokens) "
                                 "is refused as a hint (counted: too_long).")
    w_min: float = Field(0.1, ge=0, le=1, description="Floor of a rescued token's weight toward the hint-free policy "
                         "(0 is Guide's correction, which removes exactly the form a cold receiver must learn).")
    w_max: float = Field(2.0, ge=1, description="Cap of a rescued token's weight.")
    train_cut_off: bool = Field(
        False, description="Train a verified rescue sample that the token limit cut off. false (the default): it is "
        "counted (rescue_cut_off) and not trained — its text did not end, so the answer the verifier read is where "
        "it stopped (on products a ramble ending '... results in 312. One method ... This' verified and, trained, "
        "lengthened SmolLM2's answers: docs/results/real/sgt-r/README.md).")

    def check_experiment(self, cfg: Any) -> None:  # cfg: the ExperimentConfig (schema.py imports this module)
        """The rescue round runs the learner's forward passes on one rank: a sharded receiver is refused."""
        names = [p.name for p in cfg.policies]
        for p in cfg.policies:
            if p.resources.learner_gpus > 1 and cfg.sharing.for_receiver(p.name, names)[1].mode == "sgt_r":
                raise ValueError(f"sharing.mode sgt_r: policy {p.name!r} has a sharded learner "
                                 f"(resources.learner_gpus {p.resources.learner_gpus}); SGT-R's rescue round runs "
                                 "on one learner rank and does not support sharded receivers yet")


class PrpConfig(_Strict):
    """Peer Rollout Pooling (docs/algorithms.md §3.3)."""

    ratio_level: Literal["sequence", "token"] = Field("sequence",
                                                      description="Density ratio per sequence (exp(ℓ̄_n − ℓ̄_m), "
                                                      "robust to THL) or per token.")
    truncation: float = Field(1.0, gt=0, description="C of min(w, C): 1 HACPO-style, 2 TIS.")
    weight: float = Field(1.0, ge=0, description="λ_PRP, weight of the peer-row loss.")


class XgrpoConfig(_Strict):
    """Cross-policy advantage sharing (docs/algorithms.md §3.3)."""

    variant: Literal["pooled", "calibrated", "leave_self_out"] = Field("pooled",
        description="How peer AdvantageStats enter the baseline.")
    peer_weight: float = Field(1.0, ge=0, description="λ, weight of each peer sample in the pooled baseline and scale.")


class CapabilityConfig(_Strict):
    """Capability tracker (docs/algorithms.md §2.2), used by hacpo and xgrpo's calibrated variant."""

    window: int = Field(5, ge=1, description="K, batches in the moving average (the current one included).")
    metric: Literal["positive_rate", "reward_mean"] = Field("positive_rate",
                                                            description="Per-batch capability measure.")
    minimum: float = Field(1e-8, gt=0, description="Floor on P̂.")
    ratio_min: float = Field(0.1, gt=0, le=1, description="Lower clip of capability ratios.")
    ratio_max: float = Field(10.0, ge=1, description="Upper clip of capability ratios.")
    warmup_steps: int = Field(0, ge=0, description="Ratios are 1.0 while steps <= warmup_steps.")


class HacpoConfig(_Strict):
    """HACPO (docs/algorithms.md §2.7; defaults from §2.8)."""

    alpha: float = Field(1.0, ge=0, description="Exponent of the exponential IS s·sg[s]^α on cross rows.")
    delta: float = Field(0.2, ge=0, le=1, description="Stepwise clipping: cross lower bound 1 − δ at mini-batch 0.")
    delta_step: float = Field(0.025, ge=0, description="Stepwise clipping: lower bound grows by δ_step per mini-batch.")
    self_clip_low: float = Field(3e-4, ge=0, description="GSPO ε_l on self rows.")
    self_clip_high: float = Field(4e-4, ge=0, description="GSPO ε_h on self rows.")
    max_abs_log_ratio: float = Field(10.0, gt=0, description="Clamp of the sequence log-ratio before exp.")
    binary_baseline_guard: bool = Field(True, description="Weighted baseline > 1 falls back to the learner's own mean "
                                        "(§2.3).")
    schedule: Literal["paper", "rows"] = Field(
        "paper",
        description="paper: own rows in self_minibatches equal parts, then each source's rows in "
                    "cross_minibatches parts (one source per mini-batch, as the authors run it); rows: "
                    "consecutive algorithm.minibatch_rows, which must not straddle own and peer rows.")
    self_minibatches: int = Field(2, ge=1, description="paper schedule: updates on own rows per step.")
    cross_minibatches: int = Field(2, ge=1, description="paper schedule: updates on each source's rows per step.")
    scale_lr: bool = Field(
        True, description="paper schedule: divide each policy's optim.lr by the updates a step takes (self + cross "
                          "per peer), so a HACPO step moves the weights about as far as one GRPO update. At the "
                          "unscaled lr the 4 updates per step collapsed the weaker policy of the evidence suite (21% "
                          "-> 13% held-out in 60 steps); scaled it held and gained (21% -> 24%).")

    def check_experiment(self, cfg: Any) -> None:  # cfg: the ExperimentConfig (schema.py imports this module)
        """What HACPO needs of the rest of the experiment (checked when the mode is selected)."""
        if self.schedule == "rows":
            own = cfg.budget.prompts_per_step * cfg.budget.group_size
            mb = cfg.algorithm.minibatch_rows
            if mb is None or own % mb or mb % cfg.budget.group_size:
                raise ValueError(f"sharing.hacpo.schedule rows: algorithm.minibatch_rows ({mb}) must divide the {own} "
                                 f"own rows per step and be a multiple of group_size ({cfg.budget.group_size}), or "
                                 "mini-batches would mix own and peer rows (use sharing.hacpo.schedule: paper)")
        # HACPO's cross-agent ratio uses the peer's log-probs as π_old of the source model; a
        # sampler at another temperature or with top-k/top-p reports log-probs of a different
        # distribution, so HACPO would weigh peer rows by the wrong ratio
        for p in cfg.policies:
            e = p.engine
            if e.temperature != 1.0 or e.top_k or e.top_p < 1.0:
                raise ValueError(f"sharing.mode hacpo: policy {p.name!r} samples with temperature {e.temperature}, "
                                 f"top_k {e.top_k}, top_p {e.top_p}; its log-probs are not the model's (HACPO needs "
                                 "temperature 1 without top-k/top-p)")


ModeName = Literal["none", "naive", "prp", "xgrpo", "sgt", "sgt_r", "hacpo"]
"""The sharing modes (their classes: services/learner/modes; a test checks this literal against the registry)."""

MODE_SECTIONS = ("sgt", "sgt_r", "prp", "xgrpo", "hacpo")
"""The modes that have a settings section of their own."""


class EdgeConfig(_Strict):
    """One directed edge of the sharing graph: ``to``'s learner uses ``from``'s experience under ``mode``,
    with that mode's settings (unset: ``sharing.mode`` and the ``sharing.<mode>`` section)."""
    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)
    source: str = Field(..., alias="from", description="The policy whose experience travels.")
    to: str = Field(..., description="The policy whose learner uses it.")
    mode: Optional[ModeName] = Field(None, description="The mode on this edge (unset: sharing.mode).")
    sgt: Optional[SgtConfig] = None
    sgt_r: Optional[SgtRConfig] = None
    prp: Optional[PrpConfig] = None
    xgrpo: Optional[XgrpoConfig] = None
    hacpo: Optional[HacpoConfig] = None

    @model_validator(mode="after")
    def _settings_of_its_mode(self) -> "EdgeConfig":
        given = [m for m in MODE_SECTIONS if getattr(self, m) is not None]
        if self.mode is not None and any(m != self.mode for m in given):
            raise ValueError(f"edge {self.source} -> {self.to}: mode {self.mode} takes no "
                             f"{', '.join(m for m in given if m != self.mode)} settings")
        if self.mode == "none":
            raise ValueError(f"edge {self.source} -> {self.to}: an edge with mode none shares nothing; leave it out")
        return self


class SharingConfig(_Strict):
    """Which experience the policies exchange (docs/algorithms.md §3.3) and each mode's settings."""
    mode: ModeName = Field(
        "none", description="How learners use peer experience: none | naive | prp | xgrpo | sgt | sgt_r | hacpo. Every "
                            "policy learns from every other under it, unless `edges` says who learns from whom."
    )
    sgt: SgtConfig = Field(default_factory=SgtConfig)
    sgt_r: SgtRConfig = Field(default_factory=SgtRConfig)
    prp: PrpConfig = Field(default_factory=PrpConfig)
    xgrpo: XgrpoConfig = Field(default_factory=XgrpoConfig)
    hacpo: HacpoConfig = Field(default_factory=HacpoConfig)
    capability: CapabilityConfig = Field(default_factory=CapabilityConfig)
    max_version_lag: int = Field(1, ge=0, description="Δ_max: ignore peer experience older than this many steps.")
    edges: Optional[list[EdgeConfig]] = Field(
        None, description="The sharing graph: who learns from whom, under which mode (unset: every policy from "
                          "every other under `mode`). A learner combines its incoming edges under one mode.")

    def edge_mode(self, edge: EdgeConfig) -> str:
        """The mode on ``edge`` (its own, else ``mode``)."""
        return edge.mode or self.mode

    def for_receiver(self, receiver: str, policies: list[str]) -> tuple[list[str], "SharingConfig"]:
        """The peers ``receiver``'s learner reads, and the sharing settings it runs under: without edges every
        other policy and this config; with edges the sources of its incoming edges, under their mode and
        settings (a policy with none learns alone, mode none)."""
        if self.edges is None:
            return [p for p in policies if p != receiver], self
        incoming = [e for e in self.edges if e.to == receiver]
        if not incoming:
            return [], self.model_copy(update={"mode": "none", "edges": None})
        mode = self.edge_mode(incoming[0])
        update: dict = {"mode": mode, "edges": None}
        sections = [getattr(e, mode, None) for e in incoming if getattr(e, mode, None) is not None]
        if sections:  # the edges that set them agree (checked with the experiment)
            update[mode] = sections[0]
        return [e.source for e in incoming], self.model_copy(update=update)

    def describe(self) -> str:
        """The sharing as a short label: the mode, or the graph's edges."""
        if self.edges is None:
            return self.mode
        return "graph: " + ", ".join(f"{e.source}->{e.to} {self.edge_mode(e)}" for e in self.edges)

    def modes_used(self, policies: list[str]) -> set[str]:
        """Every mode some learner runs under."""
        return {self.for_receiver(p, policies)[1].mode for p in policies}


class AsyncConfig(_Strict):
    """Asynchronous training (docs/algorithms.md §6): how far sampling may run ahead of training, and
    whether learners wait for their peers."""
    max_staleness: int = Field(0, ge=0, le=64, description="k: step t may be sampled with any weights version "
                               ">= t-1-k, so generation overlaps training (0 = strictly alternating).")
    peers: Literal["lockstep", "bounded"] = Field(
        "lockstep", description="lockstep: a learner waits (up to launcher.peer_deadline_s) for its peers to sample "
                                "the step; bounded: it never waits and uses the peer experience within "
                                "sharing.max_version_lag of its own step.")
    is_cap: float = Field(2.0, gt=1.0, description="Truncation of the decoupled objective's behaviour weight "
                                                   "pi_prox/pi_behaviour (used when max_staleness > 0 or "
                                                   "algorithm.behaviour_correction is on).")

    @property
    def pipelined(self) -> bool:
        """Whether rollouts may be sampled with weights older than the previous step's."""
        return self.max_staleness > 0


class ThlConfig(_Strict):
    """How peer text is retokenised and when a converted message is rejected (docs/algorithms.md §3.2)."""
    max_unaligned: float = Field(0.02, ge=0, le=1, description="Reject converted messages whose unaligned-byte "
                                 "fraction exceeds this.")
    require_roundtrip: bool = Field(True, description="Reject messages whose text does not survive the receiver's "
                                    "encode/decode.")
    placement: Literal["spread", "last"] = Field("spread",
                                                 description="Where a group's transported log-prob goes: spread over "
                                                 "its tokens or on the last.")


def check_graph(sharing: SharingConfig, names: list[str]) -> None:
    """Edges between known policies, each once, none to itself; a learner's incoming edges under one mode with
    one set of settings (it combines them under one objective)."""
    seen: set[tuple[str, str]] = set()
    for e in sharing.edges or []:
        for end in (e.source, e.to):
            if end not in names:
                raise ValueError(f"sharing.edges: {e.source} -> {e.to} names no policy {end!r} (policies: "
                                 f"{', '.join(names)})")
        if e.source == e.to:
            raise ValueError(f"sharing.edges: {e.source} -> {e.to} is a loop; a policy's own rollouts are always used")
        if (e.source, e.to) in seen:
            raise ValueError(f"sharing.edges: {e.source} -> {e.to} is listed twice")
        seen.add((e.source, e.to))
        if sharing.edge_mode(e) == "none":
            raise ValueError(f"sharing.edges: {e.source} -> {e.to} has no mode (set it, or sharing.mode)")
    for receiver in names:
        incoming = [e for e in sharing.edges or [] if e.to == receiver]
        modes = {sharing.edge_mode(e) for e in incoming}
        if len(modes) > 1:
            raise ValueError(f"sharing.edges: {receiver}'s learner has incoming edges under "
                             f"{', '.join(sorted(modes))}; a learner combines its peers under one mode")
        sections = {repr(getattr(e, sharing.edge_mode(e), None)) for e in incoming
                    if getattr(e, sharing.edge_mode(e), None) is not None}
        if len(sections) > 1:
            raise ValueError(f"sharing.edges: {receiver}'s incoming edges set different {next(iter(modes))} "
                             "settings; a learner runs one set (put them on one edge, or in sharing."
                             f"{next(iter(modes))})")
