"""uvicorn's server, stopping gracefully on SIGHUP as it does on SIGTERM and Ctrl-C.

uvicorn captures SIGINT and SIGTERM: it stops taking requests, the app's shutdown runs
(`stop_policy`: a running step ends and the steps since the last checkpoint are saved), then the
signal is raised again. SIGHUP, which a closed terminal or a dropped ssh session sends to a
`swarm serve` started in it, it leaves at its default: the process died at once, and the steps
trained since the last checkpoint were lost (their episodes replay from the durable buffer, but
the work is done twice). Under `nohup` SIGHUP stays ignored, as the user asked.

Imported only by code that serves (uvicorn is a heavy edge).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

import uvicorn


class HangupServer(uvicorn.Server):
    """`uvicorn.Server` with SIGHUP handled like SIGTERM (where it is not ignored)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            hangup = threading.current_thread() is threading.main_thread() and (
                signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN
            )
            previous = signal.signal(signal.SIGHUP, self.handle_exit) if hangup else None
            try:
                yield
            finally:
                if previous is not None:  # before uvicorn raises the captured signal again: its default ends us
                    signal.signal(signal.SIGHUP, previous)


__all__ = ["HangupServer"]
