"""Per-step metrics to MLflow, off the training path; the trained model at the end.

The server's source of truth stays `metrics.jsonl`; MLflow is a view of it for
humans (the UI) and for the researcher (metric histories). MLflow is imported
and the run opened on a background thread, and metrics go through
`store.tracking.RunLogger`, which batches them (`log_batch`), so neither server
start-up nor a training step ever waits on the tracking backend. A restarted
server with the same `out_dir` continues the same run (`RUN_FILE` holds its id,
and tells `swarm train` which run it is).

A server that stops having reached `max_steps` logs its last checkpoint to the
run as a transformers-flavour model (`log_final_model`), as its last act before
the run is ended. It is done here, not by the program that started the server,
because this process has torch, transformers and MLflow loaded already: the same
work in `swarm train` spent ~10 s importing them and ~3 s of MLflow scanning the
installed packages. `swarm train` adds its own part through `EXTRA_FILE` (its
parameters, `run.yaml`, the words of the model card) and follows the logging
through `MODEL_FILE`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from swarm.config.server import ServerConfig

log = logging.getLogger("swarm.server.tracking")
RUN_FILE = "mlflow_run.json"
#: what the program that started the server adds to its run, written before it starts: `params` (logged with
#: the server's own), `artifacts` (files logged with the final model), `model_card` (`title`, `description`)
EXTRA_FILE = "mlflow_extra.json"
#: the final model's logging as it goes, `{"state": "logging" | "logged" | "failed", ...}` (`model_uri`,
#: `seconds` once logged, `error` when not), so that `swarm train` can say what the server is doing
MODEL_FILE = "mlflow_model.json"


class MlflowSink:
    """The server's MLflow run: params at open, metrics and checkpoint tags as they come, and, at a
    close after `final_step` was checkpointed, the trained model (from `base_model`)."""

    def __init__(
        self,
        out_dir: Path,
        experiment: str,
        run_name: str | None,
        params: dict[str, Any],
        parent_run_id: str | None = None,
        tracking_uri: str | None = None,
        final_step: int | None = None,
        base_model: Path | None = None,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.extra = _read_json(self.out_dir / EXTRA_FILE)
        self.final_step, self.base_model = final_step, base_model
        self.last_checkpoint: tuple[int, Path] | None = None
        self._logger: Any = None
        self._pending: list[tuple[str, tuple]] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        # `import requests` (MLflow's HTTP client) adds the warnings filter that silences urllib3's SOCKS
        # DependencyWarning, then imports the module that raises it. On the MLflow thread, a
        # `catch_warnings()` block another thread leaves in between (torch and transformers open them
        # while generating) restores the filters without it, and the warning lands in server.log: so
        # requests is imported here, on the starting thread, before that thread exists (~0.1 s).
        import requests  # noqa: F401  # lazy: MLflow's HTTP client, only when MLflow tracking is on

        self._thread = threading.Thread(
            target=self._open,
            name="mlflow-open",
            daemon=True,
            args=(experiment, run_name, params, parent_run_id, tracking_uri),
        )
        self._thread.start()

    def _open(
        self, experiment: str, run_name: str | None, params: dict[str, Any], parent: str | None, uri: str | None
    ) -> None:
        try:
            from store.tracking import RunLogger  # lazy: importing MLflow takes seconds; this is its thread

            run_file = self.out_dir / RUN_FILE
            run_id = json.loads(run_file.read_text())["run_id"] if run_file.exists() else None
            logger = RunLogger.start(
                experiment,
                run_name,
                parent_run_id=parent,
                run_id=run_id,
                tracking_uri=uri,
                tags={"roost.out_dir": str(self.out_dir)},
            )
            extra = {str(k): v for k, v in self.extra.get("params", {}).items()}
            if run_id is None:
                logger.log_params({**extra, **params})  # the server's own settings win a clash
                self.out_dir.mkdir(parents=True, exist_ok=True)
                run_file.write_text(json.dumps({"run_id": logger.run_id, "tracking_uri": logger.tracking_uri}))
            elif extra:  # a resumed run has them (MLflow params never change), but a failed start may not
                logged = logger.client.get_run(logger.run_id).data.params
                logger.log_params({k: v for k, v in extra.items() if k not in logged})
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
        numeric = {
            k: float(v)
            for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "time")
        }
        self._do("metrics", step, numeric)

    def checkpoint(self, step: int, path: Path) -> None:
        self.last_checkpoint = (step, Path(path))
        self._do("tag", "roost.last_checkpoint", str(path))
        self._do("metrics", step, {"checkpoint_step": float(step)})

    def close(self, status: str = "FINISHED", timeout: float = 30.0) -> None:
        """End the run; first, if the server reached `final_step` and checkpointed it, log the model."""
        self._ready.wait(timeout)
        if self._logger is None:
            return
        final = self.last_checkpoint
        if status == "FINISHED" and final is not None and self.final_step is not None and final[0] >= self.final_step:
            self._log_final_model(final[1])
        try:
            self._logger.set_terminated(status)
        except Exception:
            log.exception("could not close the mlflow run")

    def _log_final_model(self, checkpoint: Path) -> None:
        """`log_final_model`, saying how it goes in the log and in `MODEL_FILE`; never an error."""
        if not (checkpoint / "config.json").exists() or not _has_weights(checkpoint):
            return  # not a Hugging Face model: the fake engine's checkpoint has its config and tokenizer, no weights
        state = self.out_dir / MODEL_FILE
        run_id = self._logger.run_id
        _write_json(state, {"state": "logging", "run_id": run_id, "checkpoint": str(checkpoint)})
        log.info("logging the trained model (%s) to MLflow run %s…", checkpoint.name, run_id)
        started = time.monotonic()
        card = self.extra.get("model_card") or {
            "title": f"{self.out_dir.name}: trained by `swarm serve`",
            "description": f"Fine-tuned from `{self.base_model}` by a Roost swarm server; its settings are the "
            f"run's parameters.",
        }
        try:
            uri = log_final_model(
                self._logger,
                checkpoint,
                self.base_model,
                card["title"],
                card["description"],
                [Path(a) for a in self.extra.get("artifacts", [])],
            )
        except Exception as exc:  # noqa: BLE001 - tracking must never fail a finished run
            log.exception("could not log the trained model to MLflow")
            _write_json(
                state,
                {
                    "state": "failed",
                    "run_id": run_id,
                    "error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                },
            )
            return
        seconds = round(time.monotonic() - started, 1)
        _write_json(state, {"state": "logged", "run_id": run_id, "model_uri": uri, "seconds": seconds})
        log.info("logged the trained model to MLflow in %.1fs: %s", seconds, uri)


def _has_weights(checkpoint: Path) -> bool:
    """Weights in any of the forms transformers and peft save (sharded, a LoRA adapter, a .bin)."""
    return any(checkpoint.glob("*.safetensors")) or any(checkpoint.glob("*.bin"))


class TeeLog:
    """metrics.jsonl first (the source of truth), then MLflow."""

    def __init__(self, primary: Any, sink: MlflowSink) -> None:
        self.primary, self.sink = primary, sink
        self.path = getattr(primary, "path", None)

    def write(self, record: dict[str, Any]) -> None:
        self.primary.write(record)
        self.sink.write(record)


def server_sink(config: ServerConfig, out_dir: Path) -> MlflowSink:
    """The run's MLflow view: every setting it runs with but the secrets as params (train knobs as
    `train.*`, the engine's own nested settings as `vllm.*` / `verl.*`, only that engine's); the model
    is logged at a stop after `max_steps`."""
    nested = ("train", *(e for e in ("vllm", "verl") if config.engine == e))
    params = {
        **config.model_dump(mode="json", exclude={"token", "admin_token", "secret", "train", "vllm", "verl"}),
        **{f"{part}.{k}": v for part in nested for k, v in getattr(config, part).model_dump(mode="json").items()},
    }
    return MlflowSink(
        out_dir,
        config.mlflow_experiment,
        config.mlflow_run_name or out_dir.name,
        params,
        parent_run_id=config.mlflow_parent_run_id,
        final_step=config.max_steps,
        base_model=Path(config.model_dir),
    )


def log_final_model(
    logger: Any, checkpoint: Path, base_model: Path | None, title: str, description: str, artifacts: list[Path]
) -> str:
    """Log `checkpoint` into `logger`'s run (a `store.tracking.RunLogger`) as a transformers-flavour
    text-generation model, with `artifacts` beside it; returns the model URI.

    The model card is made here (`store.tracking.model_card`), so MLflow does not look the checkpoint up
    on the Hugging Face Hub. The requirements are pinned to the torch and transformers this process runs,
    so MLflow's check of them against the installed packages, a scan of every installed distribution
    (~3 s), can find nothing and is skipped (`_no_requirements_check`).
    """
    import mlflow  # lazy: loaded already (the run is open); only its transformers flavour is new
    import torch  # lazy: loaded already by the engine that wrote the checkpoint
    import transformers  # lazy: as above

    from store.tracking import model_card  # lazy: imports MLflow

    for path in artifacts:
        logger.log_artifact(path)
    card = model_card(base_model, title, description)
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # "Loading weights"... would only be noise in the log
    previous = mlflow.get_tracking_uri() if mlflow.tracking.is_tracking_uri_set() else None
    # `log_model` takes the store from the global URI and the experiment (where the model and its artifacts
    # go) from the active run: without one it is the Default experiment, under the working directory
    mlflow.set_tracking_uri(logger.tracking_uri)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint)
        tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
        with mlflow.start_run(run_id=logger.run_id), _no_requirements_check():
            info = mlflow.transformers.log_model(
                transformers_model={"model": model, "tokenizer": tokenizer},
                name="model",
                task="text-generation",
                model_card=card,
                model_config={"max_new_tokens": 64},
                pip_requirements=[
                    f"torch=={torch.__version__.split('+')[0]}",
                    f"transformers=={transformers.__version__}",
                ],
            )
    finally:
        mlflow.set_tracking_uri(previous)
        if bars:
            transformers.utils.logging.enable_progress_bar()
    return str(info.model_uri)


@contextmanager
def _no_requirements_check() -> Iterator[None]:
    """MLflow warns when a model's pinned requirements do not match the installed packages, after mapping
    every installed distribution to its modules (`importlib.metadata.packages_distributions`, ~3 s under
    load). Pins read from the running modules match by construction, so the check is switched off while
    the model is logged. Should MLflow move the function, nothing is patched and the check just runs."""
    import mlflow.utils.environment as environment  # lazy: MLflow, imported by the caller already

    check = getattr(environment, "warn_dependency_requirement_mismatches", None)
    if check is None:
        yield
        return
    environment.warn_dependency_requirement_mismatches = lambda requirements: None
    try:
        yield
    finally:
        environment.warn_dependency_requirement_mismatches = check


def _read_json(path: Path) -> dict[str, Any]:
    """A small JSON file's object, or {} when it is missing or unreadable (it only adds to the run)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace `path` whole (a reader polling it never sees half a file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)
