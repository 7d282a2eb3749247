"""`python -m roost_vllm_launch PARENT_PID [vLLM server args...]`: vLLM's OpenAI server, tied to its parent.

The swarm server starts vLLM in a session of its own (so it can stop the whole
group: vLLM forks an engine core and a worker). If the swarm server dies
without closing its engine (SIGKILL, OOM), nothing would stop that group; this
launcher runs vLLM's server in-process with a daemon thread that watches the
parent pid and kills its own process group once the parent is gone. Runs in
vLLM's interpreter; imports nothing of Roost.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import time


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os.killpg(os.getpgid(0), signal.SIGTERM)
    time.sleep(10.0)
    os.killpg(os.getpgid(0), signal.SIGKILL)


def main() -> None:
    parent = int(sys.argv[1])
    sys.argv = ["vllm.entrypoints.openai.api_server", *sys.argv[2:]]
    threading.Thread(target=_watch_parent, args=(parent,), name="roost-parent-watch", daemon=True).start()
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
