"""MLflow tracking for swarm servers, `swarm train` and the researcher.

Where runs go: `tracking_uri` argument > env `MLFLOW_TRACKING_URI` >
`sqlite:///<data_dir>/mlflow.db` (absolute). For a local backend, experiments are
created with an absolute artifact location, `<data_dir>/mlartifacts`; a tracking
server (`http://...`) decides its own.

Everything goes through an `MlflowClient` bound to an explicit URI (never the
global `mlflow.set_tracking_uri` / active-run state), so one process can hold runs
in several experiments or even several tracking stores at once.

Metrics are buffered and sent with `log_batch` (one call per 1000 values instead of
one per value: ~60x faster on SQLite) by a background thread when the buffer reaches
`flush_size` or every `flush_interval_s`, and synchronously on `flush()` and close.
An unreachable tracking store is retried with back-off; it never raises into the
training loop.

    parent = RunLogger.start("study-7", run_name="study", tags={"roost.study_id": "7"})
    with parent.child("arm=lr-high seed=0", tags={"roost.arm": "lr-high"}) as run:
        run.log_params({"lr": 3e-5, "seed": 0})
        for step in range(100):
            run.log_metrics(step, {"reward": r, "loss": l})
        run.log_artifact(reward_curves({"lr-high": [(steps, values)]}))
    parent.set_terminated()

A model logged with `mlflow.transformers.log_model` takes its card from `model_card(...)`
(built here, from the base model's own card when it has one), so MLflow never looks a
local checkpoint up on the Hugging Face Hub.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import math
import os
import re
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunStatus, RunTag
from mlflow.exceptions import MlflowException
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from store.paths import data_dir, default_model_dir

log = logging.getLogger(__name__)
# MLflow announces its store's migrations at INFO on stderr ("Creating initial MLflow database tables...",
# "Updating database tables"): a user's first `researcher study` or `swarm train` opened with two lines
# about a database they never asked for. Its warnings and errors still show.
logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)

ENV_TRACKING_URI = "MLFLOW_TRACKING_URI"
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_PARAM_LENGTH = 6000
MAX_BUFFER = 200_000  # metrics kept while the tracking store is unreachable


def tracking_uri(uri: str | None = None) -> str:
    """The tracking URI to use (absolute SQLite file in the data dir by default)."""
    if uri:
        return uri
    env = os.environ.get(ENV_TRACKING_URI)
    if env:
        return env
    path = data_dir() / "mlflow.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def is_local(uri: str) -> bool:
    """Whether the tracking store is a local database/file (we then pick artifact paths)."""
    return not uri.startswith(("http://", "https://", "databricks"))


def artifact_location(uri: str | None = None) -> str | None:
    """Absolute artifact root for new experiments in a local store; None for a server."""
    if not is_local(tracking_uri(uri)):
        return None
    root = data_dir() / "mlartifacts"
    root.mkdir(parents=True, exist_ok=True)
    return root.as_uri()


def _experiment_location(uri: str, experiment: str) -> str | None:
    """`<artifact root>/<experiment slug>`, like MLflow's own `<root>/<experiment id>`."""
    root = artifact_location(uri)
    if root is None:
        return None
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", experiment).strip("-.")[:100] or "experiment"
    return f"{root}/{slug}"


def model_card(base_model: Path | None, title: str, description: str) -> Any:
    """A Hugging Face `ModelCard` to pass as `mlflow.transformers.log_model(model_card=...)`.

    Without one MLflow looks the model up on the Hugging Face Hub by its `name_or_path`: for a
    local checkpoint that is a warning on every run ("the model card could not be retrieved
    from the hub"), and for a path that happens to look like a repo id a network round trip.
    The card keeps the base model's metadata, its license above all, when the base directory
    holds a card (README.md, as a Hub download does); the embedded model (`swarm model init`,
    the project's own recipe) carries the project's license. Without a license MLflow still
    warns that it found none, which is then true.
    """
    import huggingface_hub  # lazy: only logging a model needs it (it comes with transformers)

    data = huggingface_hub.ModelCardData(library_name="transformers", pipeline_tag="text-generation")
    body = f"# {title}\n\n{description}\n"
    base = Path(base_model) if base_model is not None else None
    readme = base / "README.md" if base is not None else None
    if readme is not None and readme.is_file():
        card = huggingface_hub.ModelCard.load(readme)  # a local file: never the network
        data = huggingface_hub.ModelCardData(**{**card.data.to_dict(), **data.to_dict()})
        body += f"\n## The base model's card\n\n{card.text}"
    elif base is not None and base.resolve() == default_model_dir().resolve():
        data.license = "apache-2.0"
    return huggingface_hub.ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}")


_clients: dict[str, MlflowClient] = {}
_clients_lock = threading.Lock()


def get_client(uri: str | None = None) -> MlflowClient:
    """A cached client for the URI.

    Opening a new SQLite store runs MLflow's own migrations (seconds). That happens
    here, once per process, under a thread lock and, for a SQLite file, a file lock:
    a swarm server and `swarm train` starting together must not both create it.
    """
    resolved = tracking_uri(uri)
    with _clients_lock:
        client = _clients.get(resolved)
        if client is None:
            with _file_lock(_sqlite_file(resolved)):
                client = MlflowClient(tracking_uri=resolved)
                client.search_experiments(max_results=1)  # create/upgrade the store now
            _clients[resolved] = client
        return client


def _sqlite_file(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


@contextmanager
def _file_lock(path: Path | None) -> Iterator[None]:
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_experiment(client: MlflowClient, name: str, location: str | None = None) -> str:
    """The id of experiment `name`, created (with `location` as artifact root) if absent."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return str(exp.experiment_id)
    try:
        return str(client.create_experiment(name, artifact_location=location))
    except MlflowException:  # created concurrently by another process
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return str(exp.experiment_id)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _metric_value(value: Any) -> float | None:
    """float(value) for numbers, numpy and 0-d torch scalars; None for None."""
    if value is None:
        return None
    if hasattr(value, "item"):
        value = value.item()
    return float(value)


class RunLogger:
    """One MLflow run: params, buffered metrics, artifacts, final status.

    Thread-safe: the swarm server logs from request handlers and its trainer.
    Use `RunLogger.start(...)` (new or resumed run) or `parent.child(...)`.
    As a context manager it ends the run FINISHED, or FAILED on an exception.

    Metrics: `log_metrics` only appends to a buffer. A background thread sends it
    with `log_batch` when it holds `flush_size` values or every `flush_interval_s`,
    so a slow or unreachable tracking server never stalls training; failures are
    logged and retried with back-off (unsent values stay buffered, the oldest are
    dropped beyond `MAX_BUFFER`). `flush()` and `set_terminated()` send
    synchronously and raise on failure. `flush_interval_s=0` disables the thread:
    every flush then happens in the caller, on size, on `flush()` and on close.
    """

    def __init__(
        self,
        client: MlflowClient,
        run_id: str,
        *,
        flush_size: int = MAX_METRICS_PER_BATCH,
        flush_interval_s: float = 5.0,
    ) -> None:
        self.client = client
        self.run_id = run_id
        run = client.get_run(run_id)
        self.experiment_id = str(run.info.experiment_id)
        self.flush_size = max(1, flush_size)
        self.flush_interval_s = flush_interval_s
        self._buffer: list[Metric] = []
        self._lock = threading.Lock()  # guards _buffer and _closed
        self._send_lock = threading.Lock()  # one log_batch at a time, in order
        self._closed = False
        self._kick = threading.Event()
        self._thread: threading.Thread | None = None
        if flush_interval_s > 0:
            self._thread = threading.Thread(target=self._sender, name=f"mlflow-metrics-{run_id[:8]}", daemon=True)
            self._thread.start()
        atexit.register(self._atexit)

    # ------------------------------------------------------------ opening runs

    @classmethod
    def start(
        cls,
        experiment: str,
        run_name: str | None = None,
        *,
        parent_run_id: str | None = None,
        tags: Mapping[str, Any] | None = None,
        run_id: str | None = None,
        tracking_uri: str | None = None,
        artifact_location: str | None = None,
        **options: Any,
    ) -> RunLogger:
        """Start a new run in `experiment`, or resume `run_id` (status back to RUNNING).

        `parent_run_id` makes it a nested child (tag `mlflow.parentRunId`): a study's
        run is the parent, each trial a child. `options`: `flush_size`,
        `flush_interval_s`.
        """
        client = get_client(tracking_uri)
        if run_id is not None:
            client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
            if tags:
                for k, v in tags.items():
                    client.set_tag(run_id, k, str(v))
            return cls(client, run_id, **options)
        location = artifact_location or _experiment_location(client.tracking_uri, experiment)
        experiment_id = ensure_experiment(client, experiment, location)
        all_tags = {k: str(v) for k, v in (tags or {}).items()}
        if parent_run_id:
            all_tags[MLFLOW_PARENT_RUN_ID] = parent_run_id
        run = client.create_run(experiment_id, run_name=run_name, tags=all_tags)
        return cls(client, run.info.run_id, **options)

    def child(self, run_name: str | None = None, *, tags: Mapping[str, Any] | None = None, **options: Any) -> RunLogger:
        """A nested child run of this one, in the same experiment."""
        all_tags = {k: str(v) for k, v in (tags or {}).items()}
        all_tags[MLFLOW_PARENT_RUN_ID] = self.run_id
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=all_tags)
        opts = {"flush_size": self.flush_size, "flush_interval_s": self.flush_interval_s, **options}
        return type(self)(self.client, run.info.run_id, **opts)

    @property
    def tracking_uri(self) -> str:
        return str(self.client.tracking_uri)

    # ------------------------------------------------------------ logging

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log parameters (immutable in MLflow: re-logging a different value fails)."""
        items = [Param(str(k), str(v)[:MAX_PARAM_LENGTH]) for k, v in params.items()]
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[i : i + MAX_PARAMS_PER_BATCH])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        items = [RunTag(str(k), str(v)) for k, v in tags.items()]
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, tags=items[i : i + MAX_PARAMS_PER_BATCH])

    def log_metrics(self, step: int, metrics: Mapping[str, Any], *, timestamp_ms: int | None = None) -> None:
        """Buffer one step's metrics (None values are skipped). Never one call per value."""
        ts = timestamp_ms if timestamp_ms is not None else _now_ms()
        batch = []
        for key, value in metrics.items():
            v = _metric_value(value)
            if v is not None:
                batch.append(Metric(str(key), v, ts, int(step)))
        with self._lock:
            if self._closed:
                raise RuntimeError(f"run {self.run_id} is closed")
            self._buffer.extend(batch)
            full = len(self._buffer) >= self.flush_size
        if full:
            if self._thread is not None:
                self._kick.set()
            else:
                self._send()

    def log_metric(self, key: str, value: Any, step: int) -> None:
        self.log_metrics(step, {key: value})

    def flush(self) -> None:
        """Send every buffered metric now (log_batch, 1000 per call); raises on failure."""
        self._send()

    def _send(self) -> None:
        """Drain the buffer in chunks. Only this method removes from the buffer's head,
        and only one call runs at a time, so appends during a send are safe."""
        with self._send_lock:
            while True:
                with self._lock:
                    chunk = self._buffer[:MAX_METRICS_PER_BATCH]
                if not chunk:
                    return
                try:
                    self.client.log_batch(self.run_id, metrics=chunk)
                except Exception:
                    with self._lock:
                        excess = len(self._buffer) - MAX_BUFFER
                        if excess > 0:  # the store has been gone for long: shed the oldest
                            del self._buffer[:excess]
                    if excess > 0:
                        log.warning("run %s: dropped %d unsent metrics", self.run_id, excess)
                    raise
                with self._lock:
                    del self._buffer[: len(chunk)]

    def _sender(self) -> None:
        failures = 0
        while not self._closed:
            if failures:  # back off; a full buffer does not hammer a failing store
                deadline = time.monotonic() + min(60.0, self.flush_interval_s * 2 ** min(failures, 8))
                while not self._closed and (left := deadline - time.monotonic()) > 0:
                    self._kick.wait(left)
                    self._kick.clear()
            else:
                self._kick.wait(self.flush_interval_s)
                self._kick.clear()
            if self._closed:
                return  # set_terminated sends the rest itself
            try:
                self._send()
                failures = 0
            except Exception as err:  # keep the buffer; retry later
                failures += 1
                log.warning("run %s: sending metrics failed (%s); retrying", self.run_id, err)

    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        """Upload a file (or a directory's files) into the run's artifacts."""
        p = Path(path)
        if p.is_dir():
            self.client.log_artifacts(self.run_id, str(p), artifact_path)
        else:
            self.client.log_artifact(self.run_id, str(p), artifact_path)

    def log_json(self, obj: Any, artifact_file: str = "summary.json") -> None:
        """Write `obj` as JSON into the artifact `artifact_file` (e.g. a summary)."""
        self._upload_text(json.dumps(obj, indent=2, sort_keys=True, default=str), artifact_file)

    def log_jsonl(self, records: Iterable[Mapping[str, Any]], artifact_file: str) -> None:
        """Write records as JSON lines into `artifact_file` (token-level sample logs)."""
        text = "".join(json.dumps(r, default=str) + "\n" for r in records)
        self._upload_text(text, artifact_file)

    def log_samples(self, step: int, samples: Iterable[Mapping[str, Any]]) -> None:
        """Token-level samples of one step, as `samples/step_000042.jsonl`."""
        self.log_jsonl(samples, f"samples/step_{int(step):06d}.jsonl")

    def _upload_text(self, text: str, artifact_file: str) -> None:
        rel = Path(artifact_file)
        with tempfile.TemporaryDirectory(prefix="roost-artifact-") as tmp:
            local = Path(tmp) / rel.name
            local.write_text(text)
            parent = str(rel.parent) if str(rel.parent) not in ("", ".") else None
            self.client.log_artifact(self.run_id, str(local), parent)

    def final_metrics(self) -> dict[str, float]:
        """The latest value of every metric of the run (flushes first)."""
        self.flush()
        data = self.client.get_run(self.run_id).data
        return {k: float(v) for k, v in data.metrics.items() if not math.isnan(float(v))}

    # ------------------------------------------------------------ ending

    def set_terminated(self, status: str = "FINISHED") -> None:
        """Send what is buffered, then end the run: FINISHED, FAILED or KILLED."""
        RunStatus.from_string(status)  # validate before anything else
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._kick.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        atexit.unregister(self._atexit)
        self._send()
        self.client.set_terminated(self.run_id, status=status)

    close = set_terminated

    def _atexit(self) -> None:
        try:
            self._send()
        except Exception as err:  # interpreter is exiting; say so, don't crash
            log.warning("run %s: could not send metrics at exit: %s", self.run_id, err)

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            status = "FINISHED"
        elif issubclass(exc_type, KeyboardInterrupt):
            status = "KILLED"
        else:
            status = "FAILED"
        self.set_terminated(status)

    def __repr__(self) -> str:
        return f"RunLogger(run_id={self.run_id!r}, tracking_uri={self.tracking_uri!r})"
