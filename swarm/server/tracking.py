"""Per-step metrics to MLflow, off the training path.

The server's source of truth stays `metrics.jsonl`; MLflow is a view of it for
humans (the UI) and for the researcher (metric histories). MLflow is imported
and the run opened on a background thread, and metrics go through
`store.tracking.RunLogger`, which batches them (`log_batch`), so neither server
start-up nor a training step ever waits on the tracking backend. A restarted
server with the same `out_dir` continues the same run.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger("swarm.server.tracking")
RUN_FILE = "mlflow_run.json"


class MlflowSink:
    def __init__(self, out_dir: Path, experiment: str, run_name: str | None, params: dict[str, Any],
                 parent_run_id: str | None = None, tracking_uri: str | None = None) -> None:
        self.out_dir = Path(out_dir)
        self._logger: Any = None
        self._pending: list[tuple[str, tuple]] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._open, name="mlflow-open", daemon=True,
                                        args=(experiment, run_name, params, parent_run_id, tracking_uri))
        self._thread.start()

    def _open(self, experiment: str, run_name: str | None, params: dict[str, Any], parent: str | None,
              uri: str | None) -> None:
        try:
            from store.tracking import RunLogger  # lazy: importing MLflow takes seconds; this is its thread

            run_file = self.out_dir / RUN_FILE
            run_id = json.loads(run_file.read_text())["run_id"] if run_file.exists() else None
            logger = RunLogger.start(experiment, run_name, parent_run_id=parent, run_id=run_id,
                                     tracking_uri=uri, tags={"roost.out_dir": str(self.out_dir)})
            if run_id is None:
                logger.log_params(params)
                self.out_dir.mkdir(parents=True, exist_ok=True)
                run_file.write_text(json.dumps({"run_id": logger.run_id, "tracking_uri": logger.tracking_uri}))
            with self._lock:
                self._logger = logger
                pending, self._pending = self._pending, []
            for kind, args in pending:
                self._apply(kind, args)
            log.info("mlflow run %s at %s", logger.run_id, logger.tracking_uri)
        except Exception:
            log.exception("mlflow tracking unavailable; metrics stay in metrics.jsonl only")
        finally:
            self._ready.set()

    def _do(self, kind: str, *args: Any) -> None:
        with self._lock:
            if self._logger is None and not self._ready.is_set():
                self._pending.append((kind, args))
                return
        self._apply(kind, args)

    def _apply(self, kind: str, args: tuple) -> None:
        if self._logger is None:
            return
        try:
            if kind == "metrics":
                self._logger.log_metrics(*args)
            elif kind == "tag":
                self._logger.client.set_tag(self._logger.run_id, *args)
        except Exception:
            log.exception("mlflow %s failed", kind)

    def write(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        numeric = {k: float(v) for k, v in record.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "time")}
        self._do("metrics", step, numeric)

    def checkpoint(self, step: int, path: Path) -> None:
        self._do("tag", "roost.last_checkpoint", str(path))
        self._do("metrics", step, {"checkpoint_step": float(step)})

    def close(self, status: str = "FINISHED", timeout: float = 30.0) -> None:
        self._ready.wait(timeout)
        if self._logger is not None:
            try:
                self._logger.set_terminated(status)
            except Exception:
                log.exception("could not close the mlflow run")


class TeeLog:
    """metrics.jsonl first (the source of truth), then MLflow."""

    def __init__(self, primary: Any, sink: MlflowSink) -> None:
        self.primary, self.sink = primary, sink
        self.path = getattr(primary, "path", None)

    def write(self, record: dict[str, Any]) -> None:
        self.primary.write(record)
        self.sink.write(record)
