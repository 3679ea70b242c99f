"""vLLM and SGLang rollout backends, driven over their HTTP servers (docs/engines.md §2, §3, §4, §6).

Neither engine installs on CPU machines, so the adapters speak only HTTP to a
server started with the documented launch flags, probe its version and
routes at start-up (§7), and refuse to start, naming what is missing, when a
required capability is absent. Both follow the rules of §6: every sampling
field sent explicitly, processed log-probs, weights loaded from a checkpoint
directory inside pause/resume, the prefix cache flushed, and the new version
published only after the engine reported success. They keep their own
version counter and report the engine's when it has one.

With the ``collective`` weight transport (docs/engines.md §4) the engine's workers join the
learner's weight group once (``join_weight_group``) and each version goes through the engine's
own distributed update route while the learner broadcasts the announced tensors in order.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from typing import Literal

import requests
from typing_extensions import override

from mutualrl.config.engines import ENGINES
from mutualrl.models.generation import GenerationCancelled, Sample
from mutualrl.services.rollout.engine import EngineInfo, EngineSetup, RolloutEngine, SamplingSpec
from mutualrl.weights import COLLECTIVE_SCHEME, TensorManifest, verify_checksum


def _check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise GenerationCancelled("generation not started: the caller cancelled or its deadline passed")


class EngineUnavailable(RuntimeError):
    """The engine server is absent, unreachable, or lacks a capability the adapter needs."""


class _HttpEngine(RolloutEngine):
    """A server engine reached over HTTP at ``engine.url``."""

    @property
    def kind(self) -> str:
        return self.facts.name

    @classmethod
    @override
    def from_config(cls, cfg, setup: EngineSetup) -> _HttpEngine:
        assert cfg.url is not None
        if setup.store.root is None and not setup.collective:
            raise ValueError(f"the {cls.facts.name} engine loads weights from a directory; the run needs a directory "
                             "weight store")
        return cls(cfg.url, cfg.served_model or setup.name, eos_id=setup.tokenizer.eos_token_id).probe()

    @classmethod
    @override
    def probe_config(cls, cfg) -> dict:
        assert cfg.url is not None
        eng = cls(cfg.url, cfg.served_model or "", eos_id=0).probe()
        return {"engine": eng.kind, "version": eng.engine_version, **eng.capabilities}

    @abstractmethod
    def probe(self) -> _HttpEngine:
        """Read the server's version and routes; raise EngineUnavailable naming what is missing."""

    def __init__(self, base_url: str, model: str, *, eos_id: int, timeout_s: float = 600.0,
                 session: requests.Session | None = None):
        self.base = base_url.rstrip("/")
        self.model = model
        self.eos_id = eos_id
        self.timeout = timeout_s
        self.http = session or requests.Session()
        self.version = 0
        self._lock = threading.RLock()  # generation waits while a new version loads
        self.engine_version = "?"
        self.capabilities: dict[str, bool] = {}
        self.group_joined = False

    def _url(self, path: str) -> str:
        return f"{self.base}{path}"

    def _get(self, path: str, **kw) -> requests.Response:
        return self.http.get(self._url(path), timeout=kw.pop("timeout", 10), **kw)

    def _post(self, path: str, json: dict | None = None, **kw) -> requests.Response:
        return self.http.post(self._url(path), json=json if json is not None else {},
                              timeout=kw.pop("timeout", self.timeout), **kw)

    def _ok(self, resp: requests.Response, what: str) -> dict:
        if resp.status_code != 200:
            raise RuntimeError(f"{self.kind} {what} failed: HTTP {resp.status_code} {resp.text[:300]}")
        try:
            body = resp.json() if resp.content else {}
        except ValueError:
            body = {}
        if isinstance(body, dict) and body.get("success") is False:
            raise RuntimeError(f"{self.kind} {what} failed: {body.get('message', body)}")
        return body if isinstance(body, dict) else {"result": body}

    def health(self) -> Literal["ok", "starting", "down"]:
        try:
            code = self._get("/health", timeout=5).status_code
        except requests.RequestException:
            return "down"
        return "ok" if code == 200 else "starting" if code == 503 else "down"

    def info(self) -> EngineInfo:
        return EngineInfo(self.kind, self.engine_version, self.model, self.version, "processed",
                          dict(self.capabilities))

    def _check_newer(self, version: int, uri: str, checksum: str | None,
                     manifest: TensorManifest | None = None) -> bool:
        """Whether ``uri`` is a collective version (then ``manifest`` is required and the bytes go
        straight into the engine's workers: the signed announcement is what vouches for them)."""
        if version <= self.version:
            raise ValueError(f"weights version {version} is not newer than the served {self.version}")
        if uri.startswith(COLLECTIVE_SCHEME):
            if manifest is None:
                raise ValueError(f"{uri}: a collective version needs the announced manifest (names, dtypes, shapes)")
            if not self.group_joined:
                raise RuntimeError(f"{self.kind} has not joined the learner's weight group (join_weight_group)")
            return True
        if uri.startswith("inproc://"):
            raise ValueError(f"{self.kind} loads weights from a checkpoint directory every worker can read; got {uri}")
        if checksum:
            verify_checksum(uri, checksum)  # before the engine sees the files
        return False

    def _version_tuple(self) -> tuple[int, int]:
        parts = [int(x) for x in self.engine_version.split(".")[:2] if x.isdigit()]
        return (parts + [0, 0])[0], (parts + [0, 0])[1]


class VLLMServerEngine(_HttpEngine):
    """``vllm serve MODEL --logprobs-mode processed_logprobs --max-logprobs -1`` with
    ``VLLM_SERVER_DEV_MODE=1`` (for pause/resume and ``collective_rpc``)."""

    facts = ENGINES["vllm"]

    def probe(self) -> "VLLMServerEngine":
        """Check that a vLLM server answers and offers the routes weight reloads need."""
        try:
            resp = self._get("/version")
        except requests.RequestException as e:
            raise EngineUnavailable(f"no vLLM server at {self.base}: {e}") from e
        if resp.status_code != 200:
            raise EngineUnavailable(f"{self.base}/version answered HTTP {resp.status_code}: not a vLLM server")
        self.engine_version = resp.json().get("version", "?")
        self.capabilities = {
            "dev_mode": self._get("/is_paused").status_code != 404,  # pause/resume, collective_rpc (§2 dev routes)
            "weight_version": self._get("/weight_info").status_code != 404,  # ≈0.27+
        }
        if not self.capabilities["dev_mode"]:
            raise EngineUnavailable(
                f"vLLM {self.engine_version} at {self.base} has no dev routes (pause/collective_rpc): "
                "start it with VLLM_SERVER_DEV_MODE=1 so weights can be reloaded"
            )
        return self

    @override
    def generate(self, prompts: list[list[int]], spec: SamplingSpec,
                 cancel: threading.Event | None = None) -> list[list[Sample]]:
        _check_cancel(cancel)  # the server's own request timeout bounds a call already sent
        body = {
            "model": self.model,
            "prompt": prompts,
            "n": spec.n,
            "max_tokens": spec.max_new_tokens,
            "temperature": spec.temperature,
            "top_p": spec.top_p,
            "top_k": spec.top_k if spec.top_k > 0 else -1,
            "min_p": 0.0,
            "seed": spec.seed,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        with self._lock:
            out = self._ok(self._post("/v1/completions", body), "generate")
        choices = sorted(out["choices"], key=lambda c: c["index"])
        if len(choices) != len(prompts) * spec.n:
            raise RuntimeError(f"vLLM returned {len(choices)} choices for {len(prompts)} prompts x n={spec.n}")
        groups = []
        for i in range(len(prompts)):
            group = []
            for c in choices[i * spec.n : (i + 1) * spec.n]:  # prompt-major (§2)
                ids = list(c["token_ids"])
                lps = [float(x) for x in c["logprobs"]["token_logprobs"]]
                if len(lps) != len(ids):
                    raise RuntimeError(f"vLLM returned {len(lps)} log-probs for {len(ids)} tokens")
                group.append(Sample(ids, lps, "stop" if c["finish_reason"] == "stop" else "length"))
            groups.append(group)
        return groups

    def weight_receivers(self) -> int:
        """The engine's workers (TP × PP × DP), from ``GET /get_world_size?include_dp=true`` (≥0.16)."""
        resp = self._get("/get_world_size", params={"include_dp": "true"})
        if resp.status_code == 404:
            raise EngineUnavailable(f"vLLM {self.engine_version} at {self.base} has no /get_world_size: the NCCL "
                                    "weight transfer needs vLLM >= 0.16 started with VLLM_SERVER_DEV_MODE=1 and "
                                    "--weight-transfer-config '{\"backend\":\"nccl\"}'")
        return int(self._ok(resp, "get_world_size")["world_size"])

    def _packed_in_init(self) -> bool:
        return self._version_tuple() >= (0, 28)  # vLLM 0.28 moved `packed` from update_info to init_info (§5)

    def join_weight_group(self, master_address: str, master_port: int, world_size: int, backend: str = "nccl",
                          timeout_s: float | None = None) -> None:
        """``POST /init_weight_transfer_engine``: every worker joins the learner's NCCL group at
        ranks 1.. (blocks until the learner, rank 0, joins too). vLLM's communicator is NCCL only."""
        if backend not in self.facts.collective_backends:
            raise EngineUnavailable(f"vllm takes weights over NCCL only, not {backend}")
        init = {"master_address": master_address, "master_port": master_port, "rank_offset": 1,
                "world_size": world_size}
        if self._packed_in_init():
            init["packed"] = False  # one broadcast per tensor: the wire every receiver of ours speaks
        self._ok(self._post("/init_weight_transfer_engine", {"init_info": init}, timeout=timeout_s or self.timeout),
                 "init_weight_transfer_engine")
        self.group_joined = True

    def _update_from_group(self, version: int, manifest: TensorManifest) -> None:
        """pause(keep) → start_weight_update → update_weights (the learner broadcasts meanwhile) →
        finish_weight_update(version) → reset_prefix_cache → resume."""
        info: dict = {"names": list(manifest.names), "dtype_names": list(manifest.dtypes),
                      "shapes": [list(s) for s in manifest.shapes]}
        if not self._packed_in_init():
            info["packed"] = False
        four_phase = self._version_tuple() >= (0, 22)
        self._ok(self._post("/pause", params={"mode": "keep"}), "pause")
        try:
            if four_phase:
                self._ok(self._post("/start_weight_update", {}), "start_weight_update")
            self._ok(self._post("/update_weights", {"update_info": info}), "update_weights")
            if four_phase:
                body = {"weight_version": str(version)} if self.capabilities.get("weight_version") else {}
                self._ok(self._post("/finish_weight_update", body), "finish_weight_update")
            self._ok(self._post("/reset_prefix_cache"), "reset_prefix_cache")
            if self.capabilities.get("weight_version") and not four_phase:
                self._ok(self._post("/update_weight_version", {"new_version": str(version)}), "update_weight_version")
        finally:
            self._ok(self._post("/resume"), "resume")

    def update_weights(self, version: int, uri: str, checksum: str | None = None,
                       manifest: TensorManifest | None = None) -> None:
        """pause(keep) → collective_rpc reload_weights → reset_prefix_cache → update_weight_version → resume
        (a checkpoint directory), or the NCCL weight-transfer sequence (a collective version)."""
        if self._check_newer(version, uri, checksum, manifest):
            with self._lock:
                self._update_from_group(version, manifest)  # type: ignore[arg-type]
                self.version = version
            return
        with self._lock:
            self._ok(self._post("/pause", params={"mode": "keep"}), "pause")
            try:
                self._ok(self._post("/collective_rpc",
                                    {"method": "reload_weights",
                                     "kwargs": {"weights_path": uri, "is_checkpoint_format": True}}),
                         "reload_weights")
                self._ok(self._post("/reset_prefix_cache"), "reset_prefix_cache")
                if self.capabilities.get("weight_version"):
                    self._ok(self._post("/update_weight_version", {"new_version": str(version)}),
                             "update_weight_version")
            finally:
                self._ok(self._post("/resume"), "resume")
            self.version = version


class SGLangServerEngine(_HttpEngine):
    """``python -m sglang.launch_server --model-path M --weight-version 0`` (optionally
    ``--enable-deterministic-inference`` for per-request seeds)."""

    facts = ENGINES["sglang"]

    def probe(self) -> "SGLangServerEngine":
        """Check that an SGLang server answers and which weight-update routes it has."""
        try:
            resp = self._get("/server_info")
            if resp.status_code == 404:
                resp = self._get("/get_server_info")  # before the rename (§5)
        except requests.RequestException as e:
            raise EngineUnavailable(f"no SGLang server at {self.base}: {e}") from e
        if resp.status_code != 200:
            raise EngineUnavailable(f"{self.base}/server_info answered HTTP {resp.status_code}: not an SGLang server")
        info = resp.json()
        self.engine_version = str(info.get("version", "?"))
        self.capabilities = {
            "model_info": self._get("/model_info").status_code != 404,
            "deterministic_seed": bool(info.get("enable_deterministic_inference", False)),
        }
        return self

    @override
    def generate(self, prompts: list[list[int]], spec: SamplingSpec,
                 cancel: threading.Event | None = None) -> list[list[Sample]]:
        _check_cancel(cancel)
        sampling = {
            "n": 1,  # the docs discourage n > 1: the prompt is repeated instead (§3)
            "max_new_tokens": spec.max_new_tokens,
            "temperature": spec.temperature,
            "top_p": spec.top_p,
            "top_k": spec.top_k if spec.top_k > 0 else -1,
            "min_p": 0.0,
        }
        body: dict = {
            "input_ids": [p for p in prompts for _ in range(spec.n)],
            "sampling_params": sampling,
            "return_logprob": True,
            "logprob_start_len": -1,
            "top_logprobs_num": 0,
        }
        if spec.seed is not None and self.capabilities.get("deterministic_seed"):
            sampling["sampling_seed"] = spec.seed
        with self._lock:
            resp = self._post("/generate", body)
        if resp.status_code != 200:
            raise RuntimeError(f"sglang generate failed: HTTP {resp.status_code} {resp.text[:300]}")
        items = resp.json()
        if isinstance(items, dict):
            items = [items]
        if len(items) != len(prompts) * spec.n:
            raise RuntimeError(f"SGLang returned {len(items)} outputs for {len(prompts)} prompts x n={spec.n}")
        groups = []
        for i in range(len(prompts)):
            group = []
            for it in items[i * spec.n : (i + 1) * spec.n]:
                trip = it["meta_info"]["output_token_logprobs"]  # [[logprob, token_id, text|null], ...]
                ids = [int(t[1]) for t in trip]
                lps = [float(t[0]) for t in trip]
                reason = (it["meta_info"].get("finish_reason") or {}).get("type", "length")
                group.append(Sample(ids, lps, "stop" if reason == "stop" else "length"))
            groups.append(group)
        return groups

    GROUP_NAME = "weight_update_group"

    def weight_receivers(self) -> int:
        """The server's workers: ``tp_size × dp_size`` from ``/server_info``."""
        resp = self._get("/server_info")
        if resp.status_code == 404:
            resp = self._get("/get_server_info")
        info = self._ok(resp, "server_info")
        return int(info.get("tp_size", 1)) * int(info.get("dp_size", 1) or 1)

    def join_weight_group(self, master_address: str, master_port: int, world_size: int, backend: str = "nccl",
                          timeout_s: float | None = None) -> None:
        """``POST /init_weights_update_group``: the workers join the learner's group at ranks 1..
        (blocks until the learner, rank 0, joins too)."""
        body = {"master_address": master_address, "master_port": master_port, "rank_offset": 1,
                "world_size": world_size,
                "group_name": self.GROUP_NAME, "backend": backend}
        self._ok(self._post("/init_weights_update_group", body, timeout=timeout_s or self.timeout),
                 "init_weights_update_group")
        self.group_joined = True

    def update_weights(self, version: int, uri: str, checksum: str | None = None,
                       manifest: TensorManifest | None = None) -> None:
        """pause_generation → update_weights_from_disk, or update_weights_from_distributed while the
        learner broadcasts (both carrying weight_version, flushing the cache) → continue_generation."""
        collective = self._check_newer(version, uri, checksum, manifest)
        if collective:
            assert manifest is not None
            route = "/update_weights_from_distributed"
            body = {"names": list(manifest.names), "dtypes": list(manifest.dtypes),
                    "shapes": [list(s) for s in manifest.shapes],
                    "group_name": self.GROUP_NAME, "weight_version": str(version), "flush_cache": True,
                    "abort_all_requests": False}
        else:
            route = "/update_weights_from_disk"
            body = {"model_path": uri, "weight_version": str(version), "flush_cache": True, "abort_all_requests": False}
        with self._lock:
            paused = self._post("/pause_generation", {"mode": "in_place"}, timeout=60).status_code == 200
            try:
                self._ok(self._post(route, body), route.lstrip("/"))
            finally:
                if paused:
                    self._ok(self._post("/continue_generation", {}), "continue_generation")
            self.version = version
