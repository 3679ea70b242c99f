"""A service's log lines are JSON with level, time, service and fields — its own and the libraries' alike (the own
intake's refusals, the weights handshake, ...): before, a library logger's warning went through Python's bare
last-resort handler (no level, no time, no reason field) and its INFO lines were lost."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import logging
from mutualrl.runtime.service_common import service_logger
service_logger("a.learner").info("learning", extra={"fields": {"start_step": 1}})
logging.getLogger("mutualrl.learner.own").warning("own rollout m1 refused (too_long): dead-lettered",
    extra={"fields": {"reason": "too_long", "length": 600, "limit": 512}})
logging.getLogger("mutualrl.weights.a").info("weights loaded", extra={"fields": {"version": 3}})
logging.getLogger("mutualrl.learner.own").debug("not shown")
"""


def test_library_loggers_write_the_services_json_lines():
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""  # nothing through the last-resort handler
    lines = [json.loads(line) for line in p.stdout.splitlines()]
    assert [(r["level"], r["service"]) for r in lines] == [("info", "a.learner"), ("warning", "a.learner"),
                                                           ("info", "a.learner")]
    refused = lines[1]
    assert refused["reason"] == "too_long" and refused["length"] == 600 and refused["limit"] == 512
    assert all(isinstance(r["ts"], float) for r in lines) and lines[2]["version"] == 3
