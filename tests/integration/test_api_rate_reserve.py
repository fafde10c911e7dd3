"""A key's rate budget reserved by a process in chunks (web/api_auth.Reserve), on the real Redis:
a chunk is charged in Redis when reserved and spent locally; it lapses one window after it was
taken; a key whose rate changed does not spend units reserved under the old rate; near the limit
only the one unit a request needs is taken, so the budget stays exact."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from clarion.tasks import runtime
from clarion.web.api_auth import (
    CHUNK_MAX,
    CHUNK_SHARE,
    Reserve,
    authorize_held,
    chunk_size,
    create_key,
)
from clarion.web.api_errors import ApiError
from tests.support.pipeline import frozen_clock

pytestmark = pytest.mark.integration


def _evals() -> int:
    """EVAL calls Redis has served so far (each reservation is one)."""
    stats = runtime.redis().info("commandstats")
    return int(stats.get("cmdstat_eval", {}).get("calls", 0))


def test_chunk_size_is_a_fiftieth_of_the_rate_at_most_64_at_least_one(clarion_env):
    made = create_key("k", ["events:write"], (100, 1)).record
    assert chunk_size(made) == 100 // CHUNK_SHARE == 2
    assert chunk_size(replace(made, rate_limit=30)) == 1  # exact, one unit per request
    assert chunk_size(replace(made, rate_limit=10**6)) == CHUNK_MAX


def test_a_chunk_is_spent_locally_then_lapses_one_window_after_it_was_taken(own_redis):
    record = create_key("k", ["events:write"], (1000, 60)).record  # chunks of 20
    take = runtime.collaborators().limits.take
    reserve = Reserve()
    with frozen_clock(datetime.now(UTC)) as clk:
        before = _evals()
        reserve.take(record, take, clk.read())  # reserves 20, spends one
        spent = sum(reserve.spend(record, clk.read()) for _ in range(30))
        assert spent == chunk_size(record) - 1 == 19
        assert _evals() == before + 1  # one Redis round trip for 20 requests
        reserve.take(record, take, clk.read())  # a new chunk: 19 held again
        clk.advance(59)
        assert reserve.spend(record, clk.read())
        clk.advance(1)  # one window after it was reserved: lapsed
        assert not reserve.spend(record, clk.read())
        reserve.take(record, take, clk.read())
        # the key's rate changed (read again from the table): units of the old rate are not spent
        assert not reserve.spend(replace(record, rate_limit=2000), clk.read())
        assert reserve.spend(record, clk.read())


def test_near_the_limit_one_unit_is_taken_so_the_budget_stays_exact(clarion_env):
    rate = 110  # chunks of 2: 55 chunks would fit, and the last request takes one unit
    record = create_key("k", ["events:write"], (rate, 3600)).record
    take = runtime.collaborators().limits.take
    one, two = Reserve(), Reserve()  # as two processes sharing the Redis budget
    now = datetime.now(UTC)
    accepted, refused = 0, []
    for i in range(rate + 20):
        try:
            (one if i % 3 else two).take(record, take, now)
            accepted += 1
        except ApiError as exc:
            refused.append(exc)
    held = sum(r.spend(record, now) for r in (one, two) for _ in range(CHUNK_MAX))
    assert accepted + held == rate  # charged in Redis = spent + still held, never more
    assert accepted >= rate - 2 * (chunk_size(record) - 1)
    assert refused and {e.status for e in refused} == {429}
    assert all(int(e.headers["Retry-After"]) > 3000 for e in refused)  # Redis's own wait


def test_a_cached_key_with_a_unit_held_is_checked_without_io_and_revocation_still_holds(
    clarion_env,
):
    """authorize_held() answers from this process's cache: None (check in a thread) until the
    key is cached and a unit is held; a revocation in this process drops the cache at once."""
    from clarion.web.api_auth import authorize, revoke_key

    made = create_key("k", ["events:write"], (10_000, 1))
    header = f"Bearer {made.secret}"
    assert authorize_held(header, "events:write") is None  # not cached yet
    assert authorize(header, "events:write").id == made.record.id  # reads, reserves a chunk
    assert authorize_held(header, "events:write") is not None  # cached, a unit held
    with pytest.raises(ApiError, match="lacks the scope recipients:write") as lacking:
        authorize_held(header, "recipients:write")
    assert lacking.value.status == 403
    revoke_key(made.record.prefix)
    assert authorize_held(header, "events:write") is None  # not cached: authorize() reads it
    with pytest.raises(ApiError, match="revoked") as revoked:
        authorize(header, "events:write")
    assert revoked.value.status == 401
