"""`researcher study --shared-base`: a study's trials as LoRA policies of one server on one base.

Without it every trial is its own `swarm train`: a server that imports torch, loads the model,
trains it and logs it, next to the other trials' servers doing the same. With it the study
runs ONE `swarm serve` (a scheduler job of its own, key `base-s<study>`) holding the base once,
and each trial is `swarm train --attach <that server's folder> --policy t<trial>`: its own
adapter, optimizer, seed and knobs, added to the server when the trial starts and removed when
it ends, while the trial's job runs only its client fleet (swarm/attach.py). Rows of every
running trial share the server's forward passes.

What cannot differ between policies of one server (the base model, the engine, the timeline
merge, the lease and buffer settings...) cannot be a knob of such a study: `problems` lists
those a design varies, and the study is refused before it starts. The server's first policy,
`base`, is never trained: it serves the base model (a LoRA adapter starts as zero) and keeps the
server up between trials. The server job is started before the first launch (`ensure`), started
again if it died (trials running on it then fail and the analysis counts them as failed), and
cancelled when the study ends (`stop`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from pathlib import Path

from researcher.config import StudyConfig
from scheduler.manager import JobManager
from scheduler.records import JobRecord
from scheduler.spec import JobSpec
from swarm.config.options import cli_leaves, write_config
from swarm.config.policies import PolicySpec, per_policy
from swarm.config.run import ORCHESTRATED, RunConfig, train_server_defaults

log = logging.getLogger(__name__)

#: the LoRA rank of a shared-base study's trials unless a design sets `lora_rank`
RANK = 8
#: the server's own policy, never trained: the base model, and the server kept up between trials
KEEPER = "base"


def _knob_paths() -> dict[str, tuple[str, ...]]:
    """Each knob's setting in `RunConfig` (what `per_policy` judges)."""
    return {leaf.knob: leaf.path for leaf in cli_leaves(RunConfig, RunConfig(), exclude=ORCHESTRATED)}


def problems(knobs: Iterable[str], paths: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """The knobs among `knobs` that cannot differ between policies of one server."""
    paths = paths or _knob_paths()
    return sorted({k for k in knobs if k in paths and not per_policy(paths[k])})


def check_design(knobs: Iterable[str]) -> None:
    """ValueError naming every knob a `--shared-base` study cannot vary, and what it may vary."""
    paths = _knob_paths()
    bad = problems(knobs, paths)
    if bad:
        may = sorted(k for k, p in paths.items() if per_policy(p))
        raise ValueError(
            f"--shared-base: {', '.join(bad)} cannot differ between trials that share one server (its base "
            f"model, engine and serving settings are one for all); a shared-base study may vary {', '.join(may)}"
        )


def check_full_parameter(settings: Iterable[dict]) -> None:
    """ValueError when an arm (or every arm) sets `lora_rank` 0: full fine-tuning changes the base the
    other trials share, so the server would refuse that trial's policy after the study had started."""
    if any(knobs.get("lora_rank") == 0 for knobs in settings):
        raise ValueError(
            "--shared-base: lora_rank=0 is full fine-tuning, which cannot share a base with other trials (its "
            "step would change the base under them); compare ranks of 1 and more (e.g. 'Compare LoRA rank 4 "
            "and 16'), or study full fine-tuning without --shared-base"
        )


def server_dir(cfg: StudyConfig) -> Path:
    """The shared server's out folder (server.json, secrets.json, each trial's policies/t<id>)."""
    return Path(cfg.study_dir) / "base" / "server"


def group_key(study_id: int) -> str:
    return f"base-s{study_id}"


def server_spec(cfg: StudyConfig, study_id: int, attempt: int) -> JobSpec:
    """The server's job: `swarm serve` of the one keeper policy on the study's base, on a free port."""
    out = server_dir(cfg)
    config = train_server_defaults().model_copy(
        update={
            "host": "127.0.0.1",
            "port": 0,  # the bound URL is in server.json
            "out_dir": out,
            "mlflow": False,  # a trial's curve is in the study's store and report; no model is logged per trial
            "policies": [PolicySpec(name=KEEPER)],
            "checkpoint_every": 0,
            **({"model_dir": Path(cfg.model_dir)} if cfg.model_dir else {}),
        }
    )
    config = config.model_copy(update={"lora": config.lora.model_copy(update={"rank": RANK})})
    out.mkdir(parents=True, exist_ok=True)
    (out / "server.json").unlink(missing_ok=True)  # an earlier server's URL: trials wait for the new one
    config_file = write_config(out.parent / "server.yaml", config)
    return JobSpec(
        name=f"roost-s{study_id}-base-{attempt}",
        command=[sys.executable, "-m", "swarm", "serve", "--config", str(config_file)],
        env={"HF_HUB_OFFLINE": "1", **cfg.trial_env},
        time_limit_s=int(cfg.budget.wall_clock_s or 7 * 86400),
        cpus=max(cfg.trial_cpus, 1),
        gpus=cfg.trial_gpus,
        partition=cfg.partition,
        log_dir=str(out.parent / "jobs"),
    )


def ensure(manager: JobManager, cfg: StudyConfig, study_id: int) -> JobRecord:
    """The study's server job, submitted unless one is alive (exactly once per attempt, across crashes)."""
    manager.reconcile([r.id for r in manager.sink.group(group_key(study_id))])
    records = sorted(manager.sink.group(group_key(study_id)), key=lambda r: r.id)
    live = [r for r in records if not r.terminal]
    if live:
        return live[-1]
    attempt = len(records) + 1
    if records:
        last = records[-1]
        log.warning("study %s: the shared server's job %s ended (%s); starting it again", study_id, last.id, last.state)
    rec, how = manager.submit_once(
        server_spec(cfg, study_id, attempt), backend=cfg.backend, group_key=group_key(study_id)
    )
    log.info("study %s: shared server job %s (%s)", study_id, rec.id, how)
    return rec


def stop(manager: JobManager, study_id: int) -> None:
    """Cancel the study's server job (a study's end: its trials are done or cancelled)."""
    try:
        manager.cancel_group(group_key(study_id))
    except Exception as exc:  # noqa: BLE001 - the study ends all the same; the job's time limit stops it
        log.error("study %s: could not cancel the shared server: %s", study_id, exc)


def trial_args(cfg: StudyConfig, trial_id: int) -> list[str]:
    """What makes a trial a policy of the study's server."""
    return ["--attach", str(server_dir(cfg)), "--policy", f"t{trial_id:04d}"]


__all__ = [
    "KEEPER",
    "RANK",
    "check_design",
    "check_full_parameter",
    "ensure",
    "problems",
    "server_dir",
    "stop",
    "trial_args",
]
