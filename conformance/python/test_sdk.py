"""The official Python SDK (runcycles 0.5.3, pinned) against our server.

Each test drives a real flow through the SDK's public API and then checks the outcome on our
server's ledger through the admin lookup. Every response body the SDK (and the admin setup)
receives is also validated against the upstream OpenAPI schemas by the conftest hooks.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from runcycles import (
    Action,
    Amount,
    BudgetExceededError,
    CommitRequest,
    CyclesMetrics,
    CyclesProtocolError,
    Decision,
    DecisionRequest,
    DryRunResult,
    EventCreateRequest,
    ReleaseRequest,
    ReservationCreateRequest,
    ReservationExtendRequest,
    Subject,
    Unit,
    cycles,
    get_cycles_context,
)

from conftest import ledger

if TYPE_CHECKING:
    from conftest import Tenant

ACTION = Action(kind="llm.completion", name="gpt-4o-mini")
RID = r"/v1/reservations/[^/]+"


def usd(amount: int) -> Amount:
    return Amount(unit=Unit.USD_MICROCENTS, amount=amount)


def new_key() -> str:
    return str(uuid.uuid4())


def wait_for(what: str, check: Callable[[], Any], timeout: float = 15.0) -> Any:
    """Polls ``check`` until it returns a truthy value (for effects the SDK applies in threads)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def reserve_request(t: Tenant, estimate: int, **extra: Any) -> ReservationCreateRequest:
    return ReservationCreateRequest(
        idempotency_key=new_key(), subject=Subject(tenant=t.id), action=ACTION, estimate=usd(estimate), **extra
    )


# ── the @cycles decorator ─────────────────────────────────────────────────────────────────────


def test_decorator_commits_the_actual(tenant: Tenant) -> None:
    seen: dict[str, Any] = {}

    @cycles(
        estimate=100_000,
        actual=lambda result: 42_000,
        action_kind="llm.completion",
        action_name="gpt-4o-mini",
        client=tenant.client,
    )
    def call(prompt: str) -> str:
        seen["ctx"] = get_cycles_context()
        seen["held"] = tenant.amounts()
        return prompt.upper()

    assert call("hello") == "HELLO"
    ctx = seen["ctx"]
    assert ctx.decision == Decision.ALLOW
    assert ctx.affected_scopes == [tenant.scope]
    assert seen["held"] == ledger(1_000_000, reserved=100_000)
    assert tenant.amounts() == ledger(1_000_000, spent=42_000)

    commits = tenant.traffic.find("POST", rf"/v1/reservations/{ctx.reservation_id}/commit")
    assert [c.status for c in commits] == [200]
    assert commits[0].body["status"] == "COMMITTED"
    assert commits[0].body["charged"] == {"unit": "USD_MICROCENTS", "amount": 42_000}
    assert commits[0].body["released"] == {"unit": "USD_MICROCENTS", "amount": 58_000}
    # The create response carried remaining_ttl_ms, so the heartbeat never fired an extend.
    assert tenant.traffic.find("POST", rf"{RID}/extend") == []


def test_decorator_exception_releases_the_hold(tenant: Tenant) -> None:
    @cycles(estimate=50_000, action_kind="llm.completion", action_name="gpt-4o-mini", client=tenant.client)
    def boom() -> None:
        assert tenant.amounts()["reserved"] == 50_000
        raise RuntimeError("the model call failed")

    with pytest.raises(RuntimeError, match="the model call failed"):
        boom()
    assert tenant.amounts() == ledger(1_000_000)
    releases = tenant.traffic.find("POST", rf"{RID}/release")
    assert [(r.status, r.request["reason"], r.body["status"]) for r in releases] == [
        (200, "guarded_method_failed", "RELEASED")
    ]
    assert releases[0].body["released"] == {"unit": "USD_MICROCENTS", "amount": 50_000}
    assert tenant.traffic.find("POST", rf"{RID}/commit") == []


def test_decorator_uses_the_estimate_when_no_actual_is_given(tenant: Tenant) -> None:
    @cycles(estimate=lambda n: n * 1_000, client=tenant.client)
    def work(n: int) -> int:
        return n

    assert work(7) == 7
    assert tenant.amounts() == ledger(1_000_000, spent=7_000)
    (commit,) = tenant.traffic.find("POST", rf"{RID}/commit")
    # The SDK marks estimate-as-actual commits; the server must accept that metadata.
    assert commit.request["metadata"] == {"actual_source": "estimate"}
    assert commit.status == 200


def test_async_decorator_commits_and_releases(tenant: Tenant) -> None:
    async def scenario() -> None:
        client = tenant.async_client()
        try:

            @cycles(estimate=20_000, actual=lambda result: 5_000, client=client)
            async def call() -> str:
                await asyncio.sleep(0)
                return "ok"

            @cycles(estimate=30_000, client=client)
            async def fail() -> None:
                raise RuntimeError("async failure")

            assert await call() == "ok"
            with pytest.raises(RuntimeError, match="async failure"):
                await fail()
        finally:
            await client.aclose()

    asyncio.run(scenario())
    assert tenant.amounts() == ledger(1_000_000, spent=5_000)
    assert [c.status for c in tenant.traffic.find("POST", rf"{RID}/commit")] == [200]
    releases = tenant.traffic.find("POST", rf"{RID}/release")
    assert [(r.status, r.request["reason"]) for r in releases] == [(200, "guarded_method_failed")]


# ── the low-level client and streaming ────────────────────────────────────────────────────────


def test_low_level_reserve_extend_commit(tenant: Tenant) -> None:
    c = tenant.client
    r = c.create_reservation(reserve_request(tenant, 30_000, ttl_ms=60_000))
    assert r.status == 200, r.body
    rid = r.body["reservation_id"]
    expires = r.body["expires_at_ms"]
    assert 0 < r.body["remaining_ttl_ms"] <= 60_000
    assert r.body["reserved"] == {"unit": "USD_MICROCENTS", "amount": 30_000}
    assert r.request_id and r.cycles_tenant == tenant.id
    assert tenant.amounts() == ledger(1_000_000, reserved=30_000)

    e = c.extend_reservation(rid, ReservationExtendRequest(idempotency_key=new_key(), extend_by_ms=5_000))
    assert e.status == 200, e.body
    assert e.body["status"] == "ACTIVE"
    assert e.body["expires_at_ms"] == expires + 5_000
    assert e.body["remaining_ttl_ms"] > 60_000
    g = c.get_reservation(rid)
    assert (g.status, g.body["status"], g.body["expires_at_ms"]) == (200, "ACTIVE", expires + 5_000)

    metrics = CyclesMetrics(tokens_input=10, tokens_output=20, latency_ms=0, model_version="m-1")
    cm = c.commit_reservation(
        rid, CommitRequest(idempotency_key=new_key(), actual=usd(12_000), metrics=metrics, metadata={"k": "v"})
    )
    assert cm.status == 200, cm.body
    assert cm.body["status"] == "COMMITTED"
    assert cm.body["charged"]["amount"] == 12_000
    assert cm.body["released"]["amount"] == 18_000
    assert tenant.amounts() == ledger(1_000_000, spent=12_000)

    late = c.commit_reservation(rid, CommitRequest(idempotency_key=new_key(), actual=usd(1)))
    assert (late.status, late.body["error"]) == (409, "RESERVATION_FINALIZED")


def test_low_level_release(tenant: Tenant) -> None:
    c = tenant.client
    r = c.create_reservation(reserve_request(tenant, 25_000))
    rid = r.body["reservation_id"]
    rel = c.release_reservation(rid, ReleaseRequest(idempotency_key=new_key(), reason="not needed"))
    assert rel.status == 200, rel.body
    assert rel.body["status"] == "RELEASED"
    assert rel.body["released"] == {"unit": "USD_MICROCENTS", "amount": 25_000}
    assert tenant.amounts() == ledger(1_000_000)
    assert c.get_reservation(rid).body["status"] == "RELEASED"


def test_stream_reservation_commits_measured_usage(tenant: Tenant) -> None:
    with tenant.client.stream_reservation(action=ACTION, estimate=usd(40_000)) as stream:
        assert stream.decision == Decision.ALLOW
        assert tenant.amounts() == ledger(1_000_000, reserved=40_000)
        stream.usage.add_input_tokens(120)
        stream.usage.add_output_tokens(80)
        stream.usage.set_actual_cost(9_000)
    assert stream.settlement_error is None
    assert tenant.amounts() == ledger(1_000_000, spent=9_000)
    (commit,) = tenant.traffic.find("POST", rf"{RID}/commit")
    assert commit.status == 200
    assert commit.request["metrics"]["tokens_output"] == 80

    with pytest.raises(KeyError):
        with tenant.client.stream_reservation(action=ACTION, estimate=usd(10_000)):
            raise KeyError("stream broke")
    assert tenant.amounts() == ledger(1_000_000, spent=9_000)
    releases = tenant.traffic.find("POST", rf"{RID}/release", 200)
    assert [r.request["reason"] for r in releases] == ["stream_failed"]


# ── decide, dry run, events, balances, reads ──────────────────────────────────────────────────


def test_decide_allows_and_denies_without_holding(tenant: Tenant) -> None:
    c = tenant.client

    def decide(estimate: int) -> Any:
        return c.decide(
            DecisionRequest(idempotency_key=new_key(), subject=Subject(tenant=tenant.id), action=ACTION, estimate=usd(estimate))
        )

    allow = decide(1_000)
    assert allow.status == 200, allow.body
    assert allow.body["decision"] == "ALLOW"
    deny = decide(5_000_000)
    assert deny.status == 200, deny.body
    assert deny.body["decision"] == "DENY"
    assert deny.body["reason_code"] == "BUDGET_EXCEEDED"
    assert tenant.amounts() == ledger(1_000_000)


def test_dry_run_does_not_execute_or_hold(tenant: Tenant) -> None:
    ran: list[int] = []

    @cycles(estimate=5_000, dry_run=True, client=tenant.client)
    def guarded() -> str:
        ran.append(1)
        return "executed"

    result = guarded()
    assert isinstance(result, DryRunResult)
    assert result.decision == Decision.ALLOW
    assert result.affected_scopes == [tenant.scope]
    assert ran == []
    (create,) = tenant.traffic.find("POST", "/v1/reservations", 200)
    assert create.request["dry_run"] is True
    assert "reservation_id" not in create.body and "expires_at_ms" not in create.body

    @cycles(estimate=5_000_000, dry_run=True, client=tenant.client)
    def too_big() -> None:
        ran.append(2)

    with pytest.raises(CyclesProtocolError, match="Dry-run denied") as denied:
        too_big()
    assert denied.value.reason_code == "BUDGET_EXCEEDED"
    assert ran == []
    assert tenant.amounts() == ledger(1_000_000)
    assert tenant.client.list_reservations().body["reservations"] == []


def test_events_charge_directly(tenant: Tenant) -> None:
    r = tenant.client.create_event(
        EventCreateRequest(
            idempotency_key=new_key(),
            subject=Subject(tenant=tenant.id),
            action=ACTION,
            actual=usd(7_000),
            metrics=CyclesMetrics(tokens_input=5),
            client_time_ms=int(time.time() * 1000),
        )
    )
    assert r.status == 201, r.body
    assert r.body["status"] == "APPLIED"
    assert r.body["event_id"]
    assert tenant.amounts() == ledger(1_000_000, spent=7_000)


def test_get_balances_reports_the_ledger(tenant: Tenant) -> None:
    c = tenant.client
    rid = c.create_reservation(reserve_request(tenant, 3_000)).body["reservation_id"]
    c.create_event(
        EventCreateRequest(idempotency_key=new_key(), subject=Subject(tenant=tenant.id), action=ACTION, actual=usd(2_000))
    )
    r = c.get_balances(tenant=tenant.id)
    assert r.status == 200, r.body
    (root,) = [b for b in r.body["balances"] if b["scope_path"] == tenant.scope]
    assert root["remaining"] == {"unit": "USD_MICROCENTS", "amount": 995_000}
    assert root["reserved"]["amount"] == 3_000
    assert root["spent"]["amount"] == 2_000
    assert root["allocated"]["amount"] == 1_000_000
    assert tenant.amounts() == ledger(1_000_000, spent=2_000, reserved=3_000)
    with pytest.raises(ValueError):
        c.get_balances()
    c.release_reservation(rid, ReleaseRequest(idempotency_key=new_key()))


def test_list_and_get_reservations(tenant: Tenant) -> None:
    c = tenant.client
    done = c.create_reservation(reserve_request(tenant, 1_000)).body["reservation_id"]
    c.commit_reservation(done, CommitRequest(idempotency_key=new_key(), actual=usd(400)))
    live = c.create_reservation(reserve_request(tenant, 2_000)).body["reservation_id"]

    everything = c.list_reservations(tenant=tenant.id)
    assert everything.status == 200, everything.body
    statuses = {r["reservation_id"]: r["status"] for r in everything.body["reservations"]}
    assert statuses == {done: "COMMITTED", live: "ACTIVE"}

    active = c.list_reservations(status="ACTIVE")
    assert [r["reservation_id"] for r in active.body["reservations"]] == [live]
    assert active.body["reservations"][0]["reserved"] == {"unit": "USD_MICROCENTS", "amount": 2_000}

    page = c.list_reservations(limit="1")
    assert len(page.body["reservations"]) == 1
    assert page.body["has_more"] is True and page.body["next_cursor"]
    rest = c.list_reservations(limit="1", cursor=page.body["next_cursor"])
    ids = {page.body["reservations"][0]["reservation_id"], rest.body["reservations"][0]["reservation_id"]}
    assert ids == {done, live}

    detail = c.get_reservation(done)
    assert detail.status == 200, detail.body
    assert detail.body["status"] == "COMMITTED"
    assert detail.body["committed"] == {"unit": "USD_MICROCENTS", "amount": 400}
    assert detail.body["subject"] == {"tenant": tenant.id}
    assert detail.body["action"] == {"kind": "llm.completion", "name": "gpt-4o-mini"}
    assert detail.body["scope_path"] == tenant.scope
    assert "finalized_at_ms" in detail.body

    missing = c.get_reservation("rsv_does_not_exist")
    assert (missing.status, missing.body["error"]) == (404, "NOT_FOUND")
    assert tenant.amounts() == ledger(1_000_000, spent=400, reserved=2_000)


# ── errors and recovery ───────────────────────────────────────────────────────────────────────


def test_budget_exceeded_raises_the_typed_error(make_tenant: Callable[..., Tenant]) -> None:
    tenant = make_tenant(allocated=10_000)
    ran: list[int] = []

    @cycles(estimate=50_000, client=tenant.client)
    def expensive() -> None:
        ran.append(1)

    with pytest.raises(BudgetExceededError) as exc:
        expensive()
    assert exc.value.status == 409
    assert exc.value.error_code == "BUDGET_EXCEEDED"
    assert exc.value.is_budget_exceeded()
    assert ran == []
    assert tenant.amounts() == ledger(10_000)

    # Spend exactly the whole budget; the next call is refused before it runs.
    @cycles(estimate=10_000, client=tenant.client)
    def exact() -> str:
        return "ok"

    assert exact() == "ok"
    with pytest.raises(BudgetExceededError):
        exact()
    assert tenant.amounts() == ledger(10_000, spent=10_000)


def test_expired_commit_recovers_via_event(tenant: Tenant) -> None:
    """The lease (1 s, no grace) lapses while the function runs; the SDK's commit gets 410 and
    it records the spend through POST /v1/events with the commit's idempotency key."""

    @cycles(
        estimate=10_000,
        actual=lambda result: 7_000,
        ttl_ms=1_000,
        grace_period_ms=0,
        action_kind="llm.completion",
        action_name="gpt-4o-mini",
        client=tenant.client,
    )
    def slow() -> str:
        time.sleep(2.2)
        return "done"

    assert slow() == "done"

    def recovered() -> bool:
        applied = tenant.traffic.find("POST", "/v1/events", 201)
        return bool(applied) and tenant.amounts()["spent"] == 7_000

    wait_for("the event fallback", recovered)
    assert tenant.amounts() == ledger(1_000_000, spent=7_000)

    (create,) = tenant.traffic.find("POST", "/v1/reservations")
    rid = create.body["reservation_id"]
    # A 1 s lease is below the SDK's retry-safety budget: at most one immediate extension.
    assert len(tenant.traffic.find("POST", rf"{RID}/extend")) <= 1
    (commit,) = tenant.traffic.find("POST", rf"/v1/reservations/{rid}/commit")
    assert (commit.status, commit.body["error"]) == (410, "RESERVATION_EXPIRED")
    (event,) = tenant.traffic.find("POST", "/v1/events")
    assert event.status == 201
    assert event.body["status"] == "APPLIED"
    assert event.request["idempotency_key"] == commit.request["idempotency_key"]
    assert event.request["actual"] == {"unit": "USD_MICROCENTS", "amount": 7_000}
    assert event.request["metadata"]["recovered_reservation_id"] == rid
    assert event.request["metadata"]["recovery_reason"] == "commit_after_reservation_expired"
    detail = tenant.client.get_reservation(rid)
    assert detail.status == 410 or detail.body["status"] == "EXPIRED", detail.body


def test_idempotent_replays_charge_once(tenant: Tenant) -> None:
    c = tenant.client
    reserve = {
        "idempotency_key": "replay-reserve",
        "subject": {"tenant": tenant.id},
        "action": {"kind": "llm.completion", "name": "gpt-4o-mini"},
        "estimate": {"unit": "USD_MICROCENTS", "amount": 5_000},
    }
    first = c.create_reservation(reserve)
    second = c.create_reservation(reserve)
    assert (first.status, second.status) == (200, 200)
    rid = first.body["reservation_id"]
    assert second.body["reservation_id"] == rid
    assert second.body["expires_at_ms"] == first.body["expires_at_ms"]
    assert tenant.amounts() == ledger(1_000_000, reserved=5_000)

    # A same-key extend replay answers the first extension and does not extend twice.
    extend = {"idempotency_key": "replay-extend", "extend_by_ms": 1_000}
    first_ext = c.extend_reservation(rid, extend)
    second_ext = c.extend_reservation(rid, extend)
    assert (first_ext.status, second_ext.status) == (200, 200)
    assert first_ext.body["expires_at_ms"] == first.body["expires_at_ms"] + 1_000
    assert second_ext.body["expires_at_ms"] == first_ext.body["expires_at_ms"]
    assert c.get_reservation(rid).body["expires_at_ms"] == first_ext.body["expires_at_ms"]

    commit = {"idempotency_key": "replay-commit", "actual": {"unit": "USD_MICROCENTS", "amount": 3_000}}
    first = c.commit_reservation(rid, commit)
    second = c.commit_reservation(rid, commit)
    assert (first.status, second.status) == (200, 200)
    assert second.body == first.body
    assert tenant.amounts() == ledger(1_000_000, spent=3_000)

    changed = c.commit_reservation(rid, {**commit, "actual": {"unit": "USD_MICROCENTS", "amount": 4_000}})
    assert (changed.status, changed.body["error"]) == (409, "IDEMPOTENCY_MISMATCH")

    event = {
        "idempotency_key": "replay-event",
        "subject": {"tenant": tenant.id},
        "action": {"kind": "llm.completion", "name": "gpt-4o-mini"},
        "actual": {"unit": "USD_MICROCENTS", "amount": 1_500},
    }
    first = c.create_event(event)
    second = c.create_event(event)
    assert (first.status, second.status) == (201, 201)
    assert second.body["event_id"] == first.body["event_id"]
    assert tenant.amounts() == ledger(1_000_000, spent=4_500)
