"""The gRPC ``RolloutService`` of one policy, in front of any :class:`RolloutEngine`.

Validates every request before touching the engine (a malformed request gets
``INVALID_ARGUMENT`` and the server keeps serving), refuses to sample for a
weights version it has not finished loading (``FAILED_PRECONDITION``; the
engine's lock makes a load and a generation never interleave), and counts
what it serves in Prometheus metrics named ``mutualrl_rollout_*``.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import threading
import time
from concurrent import futures
from typing import Callable

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from transformers import PreTrainedTokenizerBase
from typing_extensions import override

from mutualrl.models.generation import GenerationCancelled
from mutualrl.models.policy import PromptStyle, encode_prompt
from mutualrl.services.rollout.engine import RolloutEngine, SamplingSpec
from mutualrl.v1 import rollout_service_pb2 as rpb
from mutualrl.v1 import rollout_service_pb2_grpc as rgrpc


class RequestError(ValueError):
    """A request the server refuses, with the gRPC status to answer."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


class ServingMetrics:
    """The gRPC server's Prometheus series: calls, completions, generate latency and the weights version served
    (the rollout service's own step series are :class:`~mutualrl.services.rollout.metrics.RolloutMetrics`)."""
    def __init__(self, policy: str, registry: CollectorRegistry):
        self.policy = policy
        self.requests = Counter("mutualrl_rollout_requests", "RolloutService calls by method and status code.",
                                ["policy", "method", "code"], registry=registry)
        self.completions = Counter("mutualrl_rollout_completions", "Completions sampled.", ["policy"],
                                   registry=registry)
        self.tokens = Counter("mutualrl_rollout_tokens", "Completion tokens sampled.", ["policy"], registry=registry)
        self.latency = Histogram("mutualrl_rollout_generate_seconds", "Generate latency.", ["policy"],
                                 registry=registry)
        self.version = Gauge("mutualrl_weights_version", "Weights version served.", ["policy", "role"],
                             registry=registry)
        self.sync = Gauge("mutualrl_weights_sync_seconds", "Seconds the last weights version took to publish "
                          "(learner) or to load into the engine (rollout).", ["policy", "role"], registry=registry)
        # series exist from the start (at 0): dashboards show "no calls yet", not "no data"
        for method in ("Generate", "UpdateWeights", "Health"):
            self.requests.labels(policy, method, "OK")
        for m in (self.completions, self.tokens, self.latency):
            m.labels(policy)
        self.version.labels(policy, "rollout")
        self.sync.labels(policy, "rollout")


def validate_generate(req: rpb.GenerateRequest, vocab_size: int, limits: dict[str, int]) -> None:
    """Raises RequestError(INVALID_ARGUMENT) naming the first bad field."""
    bad = grpc.StatusCode.INVALID_ARGUMENT
    if not req.prompts:
        raise RequestError(bad, "prompts is empty")
    if len(req.prompts) > limits["max_prompts"]:
        raise RequestError(bad, f"{len(req.prompts)} prompts exceed the limit of {limits['max_prompts']}")
    if not req.HasField("sampling"):
        raise RequestError(bad, "sampling is required (docs/engines.md §6: every field explicit)")
    s = req.sampling
    if not 1 <= s.n <= limits["max_n"]:
        raise RequestError(bad, f"sampling.n must be in [1, {limits['max_n']}]; got {s.n}")
    if not 1 <= s.max_new_tokens <= limits["max_new_tokens"]:
        raise RequestError(bad, f"sampling.max_new_tokens must be in [1, {limits['max_new_tokens']}]; got "
                           f"{s.max_new_tokens}")
    if not (math.isfinite(s.temperature) and s.temperature >= 0):
        raise RequestError(bad, f"sampling.temperature must be finite and >= 0; got {s.temperature}")
    if not (math.isfinite(s.top_p) and 0 < s.top_p <= 1):
        raise RequestError(bad, f"sampling.top_p must be in (0, 1]; got {s.top_p}")
    for i, p in enumerate(req.prompts):
        if not p.token_ids and not p.text:
            raise RequestError(bad, f"prompts[{i}] has neither text nor token_ids")
        if p.token_ids and (min(p.token_ids) < 0 or max(p.token_ids) >= vocab_size):
            raise RequestError(bad, f"prompts[{i}].token_ids outside the vocabulary [0, {vocab_size})")


class RolloutServicer(rgrpc.RolloutServiceServicer):
    """The rollout gRPC service: Generate, UpdateWeights and Health over the engine."""
    def __init__(
        self,
        policy: str,
        engine: RolloutEngine,
        tokenizer: PreTrainedTokenizerBase,
        fingerprint: str,
        registry: CollectorRegistry | None = None,
        prompt_style: PromptStyle | None = None,
        max_prompts: int = 4096,
        max_n: int = 256,
        max_new_tokens: int = 8192,
        max_context: int | None = None,
        announced: Callable[[], tuple[int, str] | None] | None = None,
        update_token: str | None = None,
    ):
        """``max_context``: the model's context in tokens (prompt + completion); ``announced``
        returns the newest (version, checksum) this policy's learner announced on SEE, the only
        version ``UpdateWeights`` accepts when given (SEE announcements are signed; the gRPC
        port is not the place to decide which weights a policy serves)."""
        self.max_context = max_context
        self.announced = announced
        self.update_token = update_token  # UpdateWeights needs "authorization: Bearer <token>" when set
        self.policy = policy
        self.engine = engine
        self.tok = tokenizer
        self.fingerprint = fingerprint
        self.prompt_style = prompt_style
        self.limits = {"max_prompts": max_prompts, "max_n": max_n, "max_new_tokens": max_new_tokens}
        self.registry = registry or CollectorRegistry()
        self.metrics = ServingMetrics(policy, self.registry)
        self.metrics.version.labels(policy, "rollout").set(engine.info().weights_version)

    def _abort(self, context: grpc.ServicerContext, method: str, err: RequestError):
        self.metrics.requests.labels(self.policy, method, err.code.name).inc()
        context.abort(err.code, str(err))

    @override
    def Generate(self, request: rpb.GenerateRequest,
                 context: grpc.ServicerContext) -> rpb.GenerateResponse:  # noqa: N802 - gRPC API
        t0 = time.monotonic()
        try:
            validate_generate(request, len(self.tok), self.limits)
            served = self.engine.info().weights_version
            if request.min_weights_version > served:
                raise RequestError(grpc.StatusCode.FAILED_PRECONDITION, "weights version "
                                   f"{request.min_weights_version} is not loaded "
                                   f"(serving {served})")
        except RequestError as e:
            return self._abort(context, "Generate", e)
        s = request.sampling
        prompt_ids = [list(p.token_ids) if p.token_ids else encode_prompt(self.tok, p.text,
            self.prompt_style) for p in request.prompts]
        if self.max_context is not None:
            for i, ids in enumerate(prompt_ids):
                if len(ids) + s.max_new_tokens > self.max_context:
                    return self._abort(context, "Generate", RequestError(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"prompts[{i}]: {len(ids)} prompt tokens + max_new_tokens {s.max_new_tokens} exceed the "
                        f"model's context of {self.max_context} tokens"))
        spec = SamplingSpec(n=s.n, max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_k=s.top_k,
                            top_p=s.top_p, seed=s.seed or None)
        version = self.engine.info().weights_version
        gone = threading.Event()  # set by gRPC when the client cancels or its deadline passes
        context.add_callback(gone.set)
        try:
            groups = self.engine.generate(prompt_ids, spec, cancel=gone)
        except GenerationCancelled as e:
            return self._abort(context, "Generate", RequestError(grpc.StatusCode.CANCELLED, str(e)))
        resp = rpb.GenerateResponse(weights_version=version)
        n_tokens = 0
        for p, ids, group in zip(request.prompts, prompt_ids, groups):
            g = resp.groups.add(prompt_id=p.prompt_id, prompt_token_ids=ids)
            for smp in group:
                text = self.tok.decode(smp.token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
                g.completions.add(token_ids=smp.token_ids, logprobs=smp.logprobs, text=text,
                                  finish_reason=smp.finish_reason)
                n_tokens += len(smp.token_ids)
        self.metrics.requests.labels(self.policy, "Generate", "OK").inc()
        self.metrics.completions.labels(self.policy).inc(len(prompt_ids) * s.n)
        self.metrics.tokens.labels(self.policy).inc(n_tokens)
        self.metrics.latency.labels(self.policy).observe(time.monotonic() - t0)
        return resp

    @override
    def UpdateWeights(self, request: rpb.UpdateWeightsRequest,
                      context: grpc.ServicerContext) -> rpb.UpdateWeightsResponse:  # noqa: N802
        current = self.engine.info().weights_version
        try:
            if self.update_token is not None:
                given = dict(context.invocation_metadata()).get("authorization", "")
                if not hmac.compare_digest(given.encode(), f"Bearer {self.update_token}".encode()):
                    raise RequestError(grpc.StatusCode.UNAUTHENTICATED, "UpdateWeights needs the run's bearer token "
                                       "(authorization metadata)")
            if not request.uri:
                raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, "uri is required")
            if request.uri.startswith("collective://"):
                raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, "a collective version is taken from the "
                                   "learner's broadcast when it is announced on "
                                   "SEE; UpdateWeights loads checkpoint directories "
                                   "only")
            if request.version <= current:
                raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, f"version {request.version} is not newer than the "
                                   f"served {current}")
            if self.announced is not None:
                newest = self.announced()
                if newest is None or request.version != newest[0]:
                    raise RequestError(grpc.StatusCode.FAILED_PRECONDITION,
                                       f"version {request.version} was not announced on SEE (newest announced: "
                                       f"{newest[0] if newest else 'none'})")
                if newest[1] and request.checksum != newest[1]:
                    raise RequestError(grpc.StatusCode.FAILED_PRECONDITION, f"checksum of version {request.version} "
                                       "differs from its SEE announcement")
            try:
                self.engine.update_weights(request.version, request.uri, request.checksum or None)
            except FileNotFoundError as e:
                raise RequestError(grpc.StatusCode.NOT_FOUND, str(e)) from e
            except ValueError as e:  # checksum mismatch, weights that do not fit the model
                raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from e
        except RequestError as e:
            return self._abort(context, "UpdateWeights", e)
        version = self.engine.info().weights_version
        self.metrics.version.labels(self.policy, "rollout").set(version)
        self.metrics.requests.labels(self.policy, "UpdateWeights", "OK").inc()
        return rpb.UpdateWeightsResponse(version=version)

    @override
    def Health(self, request: rpb.HealthRequest, context: grpc.ServicerContext) -> rpb.HealthResponse:  # noqa: N802
        info = self.engine.info()
        return rpb.HealthResponse(
            status=self.engine.health(), weights_version=info.weights_version,
            engine=f"{info.engine} {info.engine_version}",
            model=info.model, tokenizer_fingerprint=self.fingerprint,
        )

    def health_dict(self) -> dict:
        """The rollout service's health as JSON."""
        info = self.engine.info()
        return {"status": self.engine.health(), "policy": self.policy, "role": "rollout",
                "weights_version": info.weights_version}


def update_weights_token(learner_key: bytes, policy: str) -> str:
    """The bearer token UpdateWeights takes: derived from the policy's learner's signing key
    (the one weight announcements are signed with), so the learner — and its rollout service,
    which holds that key to verify announcements — can compute it, and nobody without it."""
    return hmac.new(learner_key, b"update-weights:" + policy.encode(), hashlib.sha256).hexdigest()


def serve(servicer: RolloutServicer, host: str = "127.0.0.1", port: int = 0, max_workers: int = 4,
          tls: tuple[bytes, bytes] | None = None) -> tuple[grpc.Server, int]:
    """Start the gRPC server; returns it and the bound port (``port=0`` picks a free one).
    ``tls``: (PEM certificate chain, PEM private key) — the port then speaks TLS only."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers),
                         options=[("grpc.max_receive_message_length", 64 << 20),
                                  ("grpc.max_send_message_length", 64 << 20)])
    rgrpc.add_RolloutServiceServicer_to_server(servicer, server)
    if tls is not None:
        bound = server.add_secure_port(f"{host}:{port}", grpc.ssl_server_credentials([(tls[1], tls[0])]))
    else:
        bound = server.add_insecure_port(f"{host}:{port}")
    server.start()
    return server, bound
