"""With a PostgreSQL store, the study graph is checkpointed with PostgresSaver in that database."""

from __future__ import annotations

import os
import uuid

import pytest

from researcher.config import StudyConfig
from researcher.planning import PlanDefaults
from store.testing import postgres_available, start_postgres

TOPIC = "Does the learning rate matter for arithmetic? Compare 0 and 3e-4"


@pytest.fixture
def pg_url(monkeypatch):
    reason = postgres_available()
    if reason:
        if os.environ.get("CI") or os.environ.get("ROOST_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL is required here: {reason}")
        pytest.skip(reason)
    with start_postgres() as pg:
        url = pg.create_database(f"r_{uuid.uuid4().hex[:8]}")
        monkeypatch.setenv("ROOST_DATABASE_URL", url)
        yield url


@pytest.mark.integration
def test_postgres_checkpoints_survive_a_new_process_context(pg_url, fake_program):
    from store.db import dispose_engines
    from store.schema import init_db

    init_db(pg_url, upgrade=True)
    from researcher.runner import checkpointer, create_study, drive, make_context

    sid = create_study(
        StudyConfig(topic=TOPIC, trial_program=fake_program, approve=True, defaults=PlanDefaults(steps=4), poll_s=0.2)
    )
    assert drive(sid, poll_s=0.2).state == "approval"
    dispose_engines()  # as if the process had ended
    ctx = make_context(sid)
    assert ctx.engine.dialect.name == "postgresql"
    with checkpointer(ctx.engine) as saver:
        assert type(saver).__name__ == "PostgresSaver"
        assert saver.get_tuple({"configurable": {"thread_id": str(sid)}}) is not None
    assert drive(sid, poll_s=0.2, resume={"approved": True}).state == "done"
    assert ctx.study().status == "COMPLETED"
