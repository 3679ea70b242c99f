"""A screenshot of TensorBoard showing a run, taken in headless Chromium against a real `tensorboard` server
(docs/tracking.md keeps one of the demo). Needs Debian's chromium (`apt-get install chromium`).

    .venv/bin/python tools/screenshot_tensorboard.py runs/demo docs/images/tensorboard-demo.png
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from mutualrl.app.cli import tensorboard_logdir
from mutualrl.see.server import free_port

# the charts a reader looks at first: reward and held-out accuracy of every policy, overlaid
TAGS = "train/reward_mean|eval/accuracy|by_rollouts/eval_accuracy|sharing/rescues"


def main() -> int:
    """Serve the run's event files, load the scalars page in Chromium, save what it shows."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("png", type=Path)
    ap.add_argument("--size", default="1500,1050")
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("no chromium: apt-get install chromium")
        return 1
    port = free_port()
    tb = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(tensorboard_logdir(args.run)),
                           "--host", "127.0.0.1", "--port", str(port)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                runs = json.loads(urllib.request.urlopen(base + "/data/runs", timeout=2).read())
                if runs:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            print("tensorboard did not list the run's policies")
            return 1
        view = f"_smoothingWeight=0&_ignoreYOutliers=false&tagFilter={urllib.parse.quote(TAGS)}"
        url = f"{base}/?darkMode=false#scalars&{view}"
        args.png.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                            "--disable-background-networking", "--disable-component-update", "--disable-sync",
                            "--hide-scrollbars", f"--user-data-dir={profile}", f"--window-size={args.size}",
                            "--virtual-time-budget=30000", f"--screenshot={args.png.resolve()}", url],
                           check=True, capture_output=True, timeout=180)
        print(f"{args.png} ({', '.join(runs)}) from {url}")
        return 0
    finally:
        tb.terminate()
        tb.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
