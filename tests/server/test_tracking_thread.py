"""The MLflow sink opens its run on a thread without letting library warnings escape into the log."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_requests_is_imported_before_the_mlflow_thread_starts(tmp_path: Path) -> None:
    """`import requests` silences urllib3's SOCKS DependencyWarning with a filter it adds itself. Done on
    the MLflow thread, while another thread leaves a `warnings.catch_warnings()` block (torch and
    transformers open them during generation), that filter can be undone mid-import and the warning
    lands in server.log. The sink therefore imports requests on the constructing thread."""
    probe = f"""
import sys, threading
threading.Thread.start = lambda self: None  # the MLflow thread never runs: what was imported before it?
from swarm.server.tracking import MlflowSink
assert "requests" not in sys.modules
MlflowSink({str(tmp_path)!r}, "probe", None, {{}})
print("requests" in sys.modules)
"""
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"
