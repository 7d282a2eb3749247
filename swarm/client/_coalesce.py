"""Coalescing: the claims (or finishes) that a client's threads send at the same moment go as one request.

A fleet runs many episodes at once, and each one's claim and finish used to be
an HTTP request of its own: per episode, two requests' worth of client CPU
(httpx, JSON, GIL hand-offs between 64 threads) and of server CPU (routing,
validation, one fsync per finish). Here the first thread to find no request of
its kind in flight sends it; threads arriving meanwhile queue, and when the
answer is in, the first of them sends everything queued as one batch
(`POST /swarm/v1/claims` or `/finishes`). Nothing waits on a timer: a lone
request goes at once, by its single route, exactly as before; batches form only
while a request is already on the wire (Nagle's rule, without the delay).

Every item is answered as its single route would have answered it (status,
body, Retry-After), so the callers' retry rules (`_retry.py`) are unchanged: a
transport error reaches each caller of that batch, each retries with its own
idempotency key. A server without the batch routes (404/405) gets single
requests from then on.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import httpx

from swarm.protocol import MAX_BATCH


class ItemResponse:
    """One batch item's answer, shaped like the `httpx.Response` that the retry rules read."""

    def __init__(self, status_code: int, body: Any, retry_after: int | float | None = None) -> None:
        self.status_code = status_code
        self._body = body
        self.headers = {"retry-after": str(retry_after)} if retry_after is not None else {}

    def json(self) -> Any:
        return self._body

    @property
    def text(self) -> str:
        return json.dumps(self._body)


@dataclass
class Item:
    """One request: its single route (`path`, Bearer `key`, `body`) and its batch entry."""

    path: str
    key: str
    body: dict
    entry: dict


class _Slot:
    __slots__ = ("item", "done", "lead", "response", "error")

    def __init__(self, item: Item) -> None:
        self.item = item
        self.done = threading.Event()
        self.lead = False  # handed the sender's role: send what is queued
        self.response: Any = None
        self.error: BaseException | None = None


class Coalescer:
    """Requests of one kind from many threads: one on the wire at a time, the rest batched behind it."""

    def __init__(self, http: httpx.Client, token: str, batch_path: str, field: str) -> None:
        self._http = http
        self._token = token
        self._batch_path = batch_path
        self._field = field
        self._lock = threading.Lock()
        self._queue: list[_Slot] = []
        self._busy = False
        self.batching = True  # False once the server turned out not to know the batch route
        self.sent = 0  # HTTP requests (the benchmark compares them with items)
        self.items = 0

    def call(self, item: Item) -> Any:
        """Send `item` (alone or in a batch): its response, or the transport error of its request."""
        slot = _Slot(item)
        with self._lock:
            self._queue.append(slot)
            lead = not self._busy
            self._busy = True
        if not lead:
            slot.done.wait()
            if not slot.lead:
                return self._outcome(slot)
        self._send_queued()
        return self._outcome(slot)

    @staticmethod
    def _outcome(slot: _Slot) -> Any:
        if slot.error is not None:
            raise slot.error
        return slot.response

    def _send_queued(self) -> None:
        """Send the queue's head (this thread's own slot first), then hand the role on."""
        with self._lock:
            batch = self._queue[:MAX_BATCH]
            del self._queue[:MAX_BATCH]
        try:
            answers = self._send([s.item for s in batch])
            for s, a in zip(batch, answers):
                s.response = a
        except BaseException as exc:  # a transport error: every caller retries on its own
            for s in batch:
                s.error = exc
        with self._lock:
            self.sent += 1
            self.items += len(batch)
            nxt = self._queue[0] if self._queue else None
            if nxt is None:
                self._busy = False
            else:
                nxt.lead = True
        for s in batch[1:]:
            s.done.set()
        if nxt is not None:
            nxt.done.set()

    def _send(self, items: list[Item]) -> list[Any]:
        if len(items) == 1 or not self.batching:
            return [self._single(i) for i in items]
        r = self._http.post(
            self._batch_path,
            json={self._field: [i.entry for i in items]},
            headers={"Authorization": f"Bearer {self._token}"},
        )
        if r.status_code in (404, 405):  # an older server: no batch routes
            self.batching = False
            return [self._single(i) for i in items]
        if r.status_code != 200:  # the whole batch was refused (auth, stopping, 5xx): each item sees it
            return [r] * len(items)
        results = r.json()["results"]
        return [ItemResponse(x["status"], x["body"], x.get("retry_after")) for x in results]

    def _single(self, item: Item) -> httpx.Response:
        return self._http.post(item.path, json=item.body, headers={"Authorization": f"Bearer {item.key}"})
