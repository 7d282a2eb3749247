"""`swarm.engine.batch_rows`: when a row of the continuous batch ends, and what its caller receives."""

from __future__ import annotations

import asyncio

from swarm.engine.base import SamplingParams, TokenChunk
from swarm.engine.batch_rows import Ends, Outbox, Row, append_tokens

EOS = 0
ENDS = Ends({EOS}, lambda ids: "".join(chr(96 + t) for t in ids), max_positions=8)


def _row(got: list[TokenChunk], prompt: int = 2, **knobs: object) -> Row:
    return Row(list(range(1, prompt + 1)), SamplingParams(**knobs), got.append, None)  # type: ignore[arg-type]


def test_each_limit_ends_a_row_with_its_reason() -> None:
    got: list[TokenChunk] = []
    eos, ignoring, stop_id, stop_text, short, long_prompt, going = (
        _row(got),
        _row(got, ignore_eos=True),
        _row(got, stop_token_ids=(5,)),
        _row(got, stop=("bc",)),
        _row(got, max_tokens=1),
        _row(got, prompt=7),
        _row(got),
    )
    stop_text.generated = [2]  # "b" so far; "c" completes the stop string
    rows = [eos, ignoring, stop_id, stop_text, short, long_prompt, going]
    box = Outbox()
    done = append_tokens(rows, [EOS, EOS, 5, 3, 4, 4, 4], [-0.1] * 7, None, ENDS, box)
    box.flush()  # rows without an event loop are called directly
    assert done == [0, 2, 3, 4, 5]
    assert [c.finish_reason for c in got] == ["stop", None, "stop", "stop", "length", "length", None]
    assert all(c.token_ids == [t] for c, t in zip(got, [EOS, EOS, 5, 3, 4, 4, 4]))


def test_a_cancelled_row_is_done_without_a_token_and_top_k_is_cut_per_row() -> None:
    got: list[TokenChunk] = []
    cancelled, two, none = _row(got), _row(got, top_logprobs=2), _row(got)
    cancelled.cancelled = True
    tops = [([4, 5, 6], [-0.1, -0.2, -0.3])] * 3
    done = append_tokens([cancelled, two, none], [4, 4, 4], [-0.1] * 3, tops, ENDS, box := Outbox())
    box.flush()
    assert done == [0] and cancelled.generated == []
    assert [c.top_logprobs for c in got] == [[[(4, -0.1), (5, -0.2)]], None]


def test_chunks_reach_each_event_loop_in_one_callback() -> None:
    loop = asyncio.new_event_loop()
    got: list[TokenChunk] = []
    a, b = _row(got), _row(got)
    a.loop = b.loop = loop
    box = Outbox()
    append_tokens([a, b], [3, 4], [-0.1, -0.2], None, ENDS, box)
    box.flush()
    assert got == []  # not in the worker: on the rows' loop
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert [c.token_ids for c in got] == [[3], [4]]
    loop.close()
    box.add(a, TokenChunk([], [], finish_reason="abort"))
    box.flush()  # a closed loop: nobody listens, nothing raised
