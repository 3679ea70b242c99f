"""A stand-in for a vLLM or SGLang server's weight-update side, run as its own process by
tests/integration/test_engine_weight_groups.py: it answers the documented routes
(docs/engines.md §2, §3) and, like the engine's workers, joins the learner's group on the init
route and takes one broadcast per announced tensor on the update route.

SGLang's workers build their group with torch's rendezvous and group helper (the recipe of
``mutualrl.weights.groups.named_torch_group``); vLLM's build a StatelessProcessGroup with PyNccl,
which needs vLLM and a GPU — this stand-in takes its place with a gloo group and the same wire
(one broadcast per tensor, packed off).

Usage: python _fake_weight_engine.py {sglang|vllm} VERSION  (prints the port, then serves)."""

from __future__ import annotations

import sys
import threading
from http.server import ThreadingHTTPServer

import torch
from json_http import json_handler  # beside this file (run as a script, its directory is on the path)

from mutualrl.weights import TensorManifest, tensor_checksum, weight_group
from mutualrl.weights.groups import named_torch_group
from mutualrl.weights.transport import GroupChannel

KIND, VERSION = sys.argv[1], sys.argv[2]
state: dict = {"group": None, "received": None, "version": None, "paused": False, "calls": []}
lock = threading.Lock()


def _receive(names, dtypes, shapes) -> dict:
    manifest = TensorManifest(tuple(names), tuple(dtypes), tuple(tuple(s) for s in shapes))
    channel = GroupChannel(state["group"])
    got = {}
    for name, t in zip(manifest.names, manifest.empty()):
        channel.broadcast(t)
        got[name] = t
    return got


def _sglang(path: str, body: dict) -> tuple[int, dict]:
    if path == "/server_info":
        return 200, {"version": VERSION, "tp_size": 1, "dp_size": 1}
    if path == "/model_info":
        return 200, {"weight_version": state["version"] or "default"}
    if path == "/pause_generation":
        state["paused"] = True
        return 200, {}
    if path == "/continue_generation":
        state["paused"] = False
        return 200, {}
    if path == "/init_weights_update_group":
        need = {"master_address", "master_port", "rank_offset", "world_size", "group_name", "backend"}
        if not need <= body.keys() or body["rank_offset"] != 1 or body["world_size"] != 2:
            return 400, {"success": False, "message": f"bad init body {body}"}
        state["group"] = named_torch_group(body["master_address"], body["master_port"], 1, body["world_size"],
                                           body["backend"], body["group_name"], 60)
        return 200, {"success": True, "message": "joined"}
    if path == "/update_weights_from_distributed":
        if state["group"] is None or not state["paused"]:
            return 400, {"success": False, "message": "no group" if state["group"] is None else "not paused"}
        if (body.get("group_name") != "weight_update_group" or not body.get("flush_cache")
            or "weight_version" not in body):
            return 400, {"success": False, "message": f"bad update body {sorted(body)}"}
        got = _receive(body["names"], body["dtypes"], body["shapes"])
        state["received"], state["version"] = tensor_checksum(got), body["weight_version"]
        return 200, {"success": True, "message": "updated"}
    return 404, {"detail": "Not Found"}


def _vllm(path: str, body: dict, query: str) -> tuple[int, dict]:
    new = tuple(int(x) for x in VERSION.split(".")[:2]) >= (0, 28)
    if path == "/version":
        return 200, {"version": VERSION}
    if path == "/is_paused":
        return 200, {"is_paused": state["paused"]}
    versioned = tuple(int(x) for x in VERSION.split(".")[:2]) >= (0, 27)  # weight versions ≈0.27 (docs/engines.md §2)
    if path == "/weight_info" and versioned:
        return 200, {"weight_version": state["version"] or "default"}
    if path == "/update_weight_version" and versioned:
        state["version"] = body["new_version"]
        return 200, {}
    if path == "/get_world_size":
        return 200, {"world_size": 1}
    if path == "/pause":
        state["paused"] = "mode=keep" in query
        return (200, {"status": "paused"}) if state["paused"] else (400, {"error": "expected mode=keep"})
    if path in ("/resume", "/reset_prefix_cache"):
        if path == "/resume":
            state["paused"] = False
        return 200, {}
    if path == "/init_weight_transfer_engine":
        init = body.get("init_info", {})
        need = {"master_address", "master_port", "rank_offset", "world_size"}
        if not need <= init.keys() or init["rank_offset"] != 1 or ("packed" in init) != new:
            return 400, {"error": f"bad init_info {init}"}
        state["group"] = weight_group(init["master_address"], init["master_port"], 1, init["world_size"], "gloo", 60)
        return 200, {}
    if path == "/start_weight_update":
        return (200, {}) if body == {} and state["paused"] else (400, {"error": "start needs {} while paused"})
    if path == "/update_weights":
        info = body.get("update_info", {})
        if ("packed" in info) == new or not {"names", "dtype_names", "shapes"} <= info.keys():
            return 400, {"error": f"bad update_info {sorted(info)}"}
        got = _receive(info["names"], info["dtype_names"], info["shapes"])
        state["received"] = tensor_checksum(got)
        return 200, {}
    if path == "/finish_weight_update":
        state["version"] = body.get("weight_version", state["version"])
        return 200, {}
    return 404, {"detail": "Not Found"}


def respond(method: str, path: str, query: str, body: dict) -> tuple[int, dict]:
    if path == "/_state":
        return 200, {"received": state["received"], "version": state["version"], "calls": state["calls"]}
    with lock:
        state["calls"].append(path)
    return _sglang(path, body) if KIND == "sglang" else _vllm(path, body, query)


if __name__ == "__main__":
    torch.set_num_threads(1)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), json_handler(respond))
    print(httpd.server_address[1], flush=True)
    httpd.serve_forever()
