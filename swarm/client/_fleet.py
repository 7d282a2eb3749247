"""`run_fleet`: run a workflow over a dataset, each task n times, with bounded concurrency.

    stats = run_fleet(client, workflow, dataset, n=8, concurrency=8, epochs=1)

Jobs are handed out strictly in dataset order (task 0 × n, task 1 × n, ...), one
at a time to whichever thread is free. That is what makes the server's on-policy
admission safe: a thread blocked on a 429 holds a job for a task the window has
not admitted, and every admitted task's remaining copies were handed out before
it, to threads that are running them. A workflow exception aborts that episode,
is counted, and the job is retried (up to `max_attempts`, so the group can still
complete); the last attempt aborts without releasing the slot, so the group
completes one smaller instead of waiting forever. The fleet never dies of a
workflow error (an error of the fleet itself, such as a task without its `task_id`,
ends the thread that meets it, and the fleet raises `FleetCrashed` once every thread
has); it stops when the server says it is stopping (on any response, a workflow's
model call included: `SwarmClient.stopping`) or is gone, when `stop` is set, after
`epochs`, or after `max_episodes` jobs.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from swarm.children import NONE_RETURNED, WORKFLOW_FAILED
from swarm.client._client import Episode, SwarmClient
from swarm.client._cursor import JobCursor
from swarm.client._retry import ServerStopping, SwarmAPIError, SwarmError, SwarmUnavailable
from swarm.client._turnstile import Turnstile

log = logging.getLogger("swarm.client")
Workflow = Callable[[dict, Episode], "float | list[float] | None"]


@dataclass
class FleetStats:
    """Counts of one fleet run (updated live; `progress` callbacks read it)."""

    finished: int = 0  # episodes finished with a reward
    failed: int = 0  # attempts whose workflow (or finish) raised
    aborted: int = 0  # episodes aborted (failures, and workflows that returned None unfinished)
    given_up: int = 0  # jobs dropped after max_attempts
    lost: int = 0  # episodes lost on the server (lease moved on, server restarted): re-played
    jobs: int = 0  # jobs handed out
    rewards: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the latest few, for humans
    #: the first failure of each kind (exception type and line; a None return), with where it came from: a
    #: fleet's output says it at once instead of a count at the end (`swarm client`, the train log)
    first_of_kind: list[str] = field(default_factory=list)
    policy_version: int = 0  # of the latest claim
    started_at: float = field(default_factory=time.time)
    elapsed: float = 0.0
    #: epochs | max_episodes | stop | server | unreachable | unauthorized | refused (its policy is gone) | failing
    stopped_by: str | None = None
    failing_streak: int = 0  # workflow failures (and None returns) since the last finished episode

    @property
    def reward_mean(self) -> float:
        return sum(self.rewards) / len(self.rewards) if self.rewards else 0.0

    @property
    def episodes(self) -> int:
        return self.finished + self.aborted


#: A job whose episode is lost this many times in a row is given up (a lost episode is not a failure).
MAX_LOST = 20
NONE_TEXT = (
    f"{NONE_RETURNED} ({{task}}): it is aborted, not trained; return a reward, or call episode.finish(...) "
    "before returning (said once)"
)


def failure_kind(exc: BaseException) -> str:
    """A workflow's failures of one kind: the exception's type and the line that raised it."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = f"{tb[-1].filename}:{tb[-1].lineno}" if tb else ""
    return f"{type(exc).__name__}@{where}"


def failure_text(task_id: str, attempt: int, exc: BaseException, frames: int = 4) -> str:
    """The first failure of a kind, with the last frames of its traceback (the workflow's own, mostly)."""
    trace = "".join(traceback.format_exception(exc, limit=-frames)).rstrip()
    said = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    return f"{WORKFLOW_FAILED} ({task_id} attempt {attempt}; the first of this kind, said once): {said}\n{trace}"


def is_lost(exc: BaseException, ep: Episode) -> bool:
    """The episode is gone on the server, or the server went away meanwhile: re-play the job."""
    if ep.lost:
        return True
    status = getattr(exc, "status_code", None)
    if status in (404, 409):  # SwarmAPIError, or the openai package's NotFound/Conflict
        return True
    name = type(exc).__name__  # the openai package's connection errors (not imported here)
    return name in ("APIConnectionError", "APITimeoutError") or isinstance(exc, SwarmUnavailable)


class _Fleet:
    def __init__(
        self,
        client: SwarmClient,
        workflow: Workflow,
        dataset: Sequence[dict],
        n: int,
        epochs: int | None,
        stop: threading.Event,
        progress: Callable[[FleetStats], Any] | None,
        max_episodes: int | None,
        max_attempts: int,
        task_family: str,
        cursor: JobCursor | None = None,
        choices: int = 1,
        ordered: bool = False,
        failure_streak: int = 0,
    ) -> None:
        self.client = client
        self.failure_streak = failure_streak
        self.turnstile = Turnstile() if ordered else None  # claims in hand-out order (`_turnstile.py`)
        self.choices = choices
        self.workflow = workflow
        self.dataset = dataset
        self.cursor = cursor if cursor is not None else JobCursor(len(dataset), n, epochs)
        self.stop = stop
        self.progress = progress
        self.max_episodes = max_episodes
        self.max_attempts = max(1, max_attempts)
        self.task_family = task_family
        self.stats = FleetStats()
        self.lock = threading.Lock()
        self.kinds: set[str] = set()  # of failures already shown (`_first_of_kind`)
        self.crashes: list[Exception] = []  # what ended a thread (`guarded_worker`)

    def next_job(self) -> tuple[int, dict, int | None] | None:
        """(job number, task, its claim ticket when ordered): numbered by the cursor, which a restarted
        client resumes."""
        with self.lock:
            if self.stop.is_set():
                return None
            if self.max_episodes is not None and self.stats.jobs >= self.max_episodes:
                self._stopped("max_episodes")
                return None
            job = self.cursor.take()
            if job is None:
                self._stopped("epochs")
                return None
            self.stats.jobs += 1
            ticket = self.turnstile.ticket() if self.turnstile is not None else None
            return job, self.dataset[self.cursor.task_index(job)], ticket

    def _stopped(self, why: str) -> None:
        if self.stats.stopped_by is None:
            self.stats.stopped_by = why

    def _note(self, **counts: int) -> None:
        with self.lock:
            for k, v in counts.items():
                setattr(self.stats, k, getattr(self.stats, k) + v)
            if counts.get("finished"):
                self.stats.failing_streak = 0
            else:  # a failure counts `failed` and `aborted` both: once; a None return `aborted` alone
                self.stats.failing_streak += counts.get("failed", 0) or counts.get("aborted", 0)
            streak = self.stats.failing_streak
        if self.failure_streak and streak >= self.failure_streak:
            self._halt("failing")  # a workflow that fails on every task: not an hour of aborted episodes
        if self.progress is not None:
            try:
                self.progress(self.stats)
            except Exception:
                log.exception("progress callback failed")

    def _error(self, message: str) -> None:
        with self.lock:
            self.stats.errors = (self.stats.errors + [message])[-20:]

    def _first_of_kind(self, kind: str, text: str) -> None:
        with self.lock:
            new = kind not in self.kinds
            if new:
                self.kinds.add(kind)
                self.stats.first_of_kind.append(text)
        if new:  # said now, not after the episode's abort (an HTTP call a stopping fleet may never finish)
            self._note()

    def worker(self) -> None:
        while (job := self.next_job()) is not None:
            number, task, ticket = job
            try:
                if self.run_job(task, ticket):
                    self.cursor.done(number)  # else it stays pending: a restarted client re-plays it
            except ServerStopping:
                self._halt("server")
            except SwarmUnavailable as exc:
                self._error(str(exc))
                self._halt("unreachable")
            except SwarmAPIError as exc:  # the claim itself was refused
                self._error(f"{task.get('task_id')}: {exc}")
                if exc.status_code in (401, 403):
                    self._halt("unauthorized")  # no job can succeed with this token
                elif exc.status_code == 404:  # its policy is gone (`swarm ctl policy remove`, a restart without it):
                    self._halt("refused")  # every claim would be refused at once, hundreds a second, for good
                else:  # counted towards --failure-streak: claims refused on every task end the fleet too
                    self._note(failed=1)
            except SwarmError as exc:  # cancelled while waiting (stop was set)
                if not self.stop.is_set():
                    self._error(str(exc))

    def guarded_worker(self) -> None:
        """`worker`, its thread's end recorded when an error outside the workflow ends it (a task without its
        `task_id`): the first one with its traceback, and `run_fleet` raises once every thread has ended so,
        for a process exiting 0 after all of them had died read as a fleet done with its dataset."""
        try:
            self.worker()
        except Exception as exc:
            with self.lock:
                self.crashes.append(exc)
                first = len(self.crashes) == 1
            self._error(f"fleet thread died: {type(exc).__name__}: {exc}"[:500])
            if first:
                log.error("a fleet thread died: %s: %s", type(exc).__name__, exc, exc_info=exc)

    def _halt(self, why: str) -> None:
        with self.lock:  # a reason to halt outranks running out of jobs
            if self.stats.stopped_by in (None, "epochs", "max_episodes"):
                self.stats.stopped_by = why
        self.stop.set()

    @contextmanager
    def _claim(self, task_id: str, family: str, attempt: int, ticket: int | None) -> Iterator[Episode]:
        """`client.episode(...)`; with a ticket, its claim waits for the ticket's turn (only the claim)."""
        turn: AbstractContextManager[object] = nullcontext()
        if ticket is not None and self.turnstile is not None:
            turn = self.turnstile.turn(ticket, self.stop)
        with ExitStack() as stack:
            with turn:  # left once the claim is answered: the episode itself runs beside later claims
                ep = stack.enter_context(self.client.episode(task_id, family, {"attempt": attempt}, stop=self.stop))
            yield ep

    def run_job(self, task: dict, ticket: int | None = None) -> bool:
        """Play one job; True when it is done (finished, or given up after `max_attempts`). `ticket`: its
        first claim waits for its turn (an ordered fleet)."""
        task_id = str(task["task_id"])
        family = str(task.get("task_family") or self.task_family)
        attempt = lost = 0
        while attempt < self.max_attempts:
            attempt += 1
            last = attempt == self.max_attempts
            with self._claim(task_id, family, attempt, ticket if attempt == 1 and not lost else None) as ep:
                with self.lock:
                    self.stats.policy_version = max(self.stats.policy_version, ep.policy_version)
                ep.choices = self.choices
                try:
                    reward = self.workflow(task, ep)
                    if reward is not None and not ep.done:
                        if isinstance(reward, (list, tuple)):  # one reward per choice of its one call
                            ep.finish_choices(reward)
                        elif self.choices > 1:
                            raise TypeError(
                                f"the workflow returned one reward; with choices={self.choices} "
                                "it must ask for n=episode.choices and return a reward per choice"
                            )
                        elif isinstance(reward, Mapping):  # a team's reward per role
                            ep.finish(reward)
                        else:
                            ep.finish(reward)  # a number: a string or NaN is InvalidReward, said as such
                except ServerStopping:
                    raise
                except Exception as exc:
                    if not getattr(ep, "replayable", True):  # a team finished on some of its servers (`_team.py`):
                        self._error(f"{task_id} attempt {attempt}: {type(exc).__name__}: {exc}"[:500])
                        self._note(aborted=1)  # done: a replay would overfill the groups holding its finished half
                        return True
                    if getattr(self.client, "stopping", False):  # e.g. the model call met the 503 "stopping"
                        ep._abort_quietly("server stopping")  # one try: no reconnecting to a stopped server
                        raise ServerStopping(f"the server is stopping ({type(exc).__name__})") from exc
                    if self.stop.is_set():  # shutting down: the job stays pending for a restart
                        ep._abort_quietly("client stopping")
                        return False
                    if is_lost(exc, ep) and lost < MAX_LOST:
                        lost += 1
                        attempt -= 1  # not the workflow's fault: play it again, same attempt
                        ep._abort_quietly(f"lost: {type(exc).__name__}"[:1000])
                        self._note(lost=1)
                        continue
                    if isinstance(exc, SwarmUnavailable):
                        raise
                    self._error(f"{task_id} attempt {attempt}: {type(exc).__name__}: {exc}"[:500])
                    self._first_of_kind(failure_kind(exc), failure_text(task_id, attempt, exc))
                    reason = f"workflow failed: {type(exc).__name__}: {exc}"[:1000]
                    ep._abort_quietly(reason, release=not last)
                    self._note(failed=1, aborted=1, given_up=int(last))
                    continue
                if ep.result is not None:
                    with self.lock:
                        self.stats.rewards.append(ep.result.reward)
                    self._note(finished=1)
                elif self.stop.is_set():  # the stop gave its open episodes back: not the workflow's doing
                    ep._abort_quietly("client stopping")
                    return False  # pending for a restart, as a workflow interrupted by the stop
                else:
                    ep._abort_quietly("workflow returned None without finishing the episode")
                    self._first_of_kind("None", NONE_TEXT.format(task=task_id))  # before _note: it shows it
                    self._note(aborted=1)
                return True
        return True


def run_fleet(
    client: SwarmClient,
    workflow: Workflow,
    dataset: Sequence[dict],
    n: int = 8,
    concurrency: int = 8,
    epochs: int | None = None,
    stop: threading.Event | None = None,
    progress: Callable[[FleetStats], Any] | None = None,
    max_episodes: int | None = None,
    max_attempts: int = 3,
    task_family: str = "default",
    cursor: JobCursor | None = None,
    choices: int = 1,
    ordered: bool = False,
    failure_streak: int = 0,
) -> FleetStats:
    """Run `workflow(task, episode) -> reward | None` over `dataset`, each task `n` times.

    `choices=k` (k > 1): each episode samples its group in one call. The fleet sets
    `episode.choices = k`; a workflow that honours it asks for `n=k` and returns a list of
    k rewards, which finish the episode with `choice_rewards` (the server then takes one
    episode per group: run it with group size 1, and `n=1` here).

    `epochs=None` loops over the dataset until something else stops the fleet.
    Blocks until done; Ctrl-C (or SIGTERM under `swarm client`) sets `stop`, gives
    the open episodes back (aborts them, so their slots reopen at once) and waits
    for the threads. `cursor` numbers the jobs; a `JobCursor` with a state file
    lets a restarted fleet re-play its unfinished jobs and continue after them. `ordered`
    (a deterministic run): claims go in hand-out order, one at a time (`_turnstile.py`).
    Lost episodes (404/409: the lease moved on or the server restarted; or the
    server unreachable mid-episode) are re-played without counting an attempt.
    `failure_streak=k` (k > 0): k workflow failures (or None returns) with no episode finished
    between them stop the fleet (`stopped_by="failing"`): a workflow that fails on every task.
    """
    if n < 1 or concurrency < 1 or choices < 1:
        raise ValueError("n, concurrency and choices must be >= 1")
    stop = stop if stop is not None else threading.Event()
    fleet = _Fleet(
        client,
        workflow,
        dataset,
        n,
        epochs,
        stop,
        progress,
        max_episodes,
        max_attempts,
        task_family,
        cursor,
        choices,
        ordered,
        failure_streak,
    )
    threads = [
        threading.Thread(target=fleet.guarded_worker, name=f"fleet-{i}", daemon=True) for i in range(concurrency)
    ]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    except KeyboardInterrupt:
        fleet._halt("stop")
        _give_back(client, threads)
    if stop.is_set():
        fleet._stopped("stop")
    fleet.stats.elapsed = time.time() - fleet.stats.started_at
    if len(fleet.crashes) == len(threads):
        first = fleet.crashes[0]
        raise FleetCrashed(
            f"every fleet thread died ({len(threads)}), the first of {type(first).__name__}: {first}"
        ) from first
    return fleet.stats


class FleetCrashed(RuntimeError):
    """Every thread of a fleet ended on an error of its own, not of the workflow (a task without its
    `task_id`): nothing more would be played, and its process must not exit as a fleet done with its dataset."""


#: After Ctrl-C, how long the fleet waits for its workflows to notice before it exits anyway.
STOP_GRACE_S = 30.0


def _give_back(client: SwarmClient, threads: list[threading.Thread], grace_s: float = STOP_GRACE_S) -> None:
    """Abort every open episode so the running workflows' next calls fail fast, until the threads end.

    Aborting once is not enough: a claim the server granted just before the
    interrupt may reach its thread only afterwards, and its workflow would then
    play on unhindered. So the open episodes are given back again every round.
    A second Ctrl-C, or `grace_s`, ends the wait (the threads are daemons).
    """
    abort_open = getattr(client, "abort_open", None)
    deadline = time.monotonic() + grace_s
    while alive := [t for t in threads if t.is_alive()]:
        if abort_open is not None:
            abort_open("client interrupted")
        if time.monotonic() > deadline:
            log.warning("%d workflow(s) still running %.0fs after the stop; exiting without them", len(alive), grace_s)
            return
        alive[0].join(0.2)
