"""The audit log, GET /v1/admin/audit/logs, against the upstream schemas and the spec's query
contract: every response below goes through a client whose bodies are validated (conftest),
so each list is also a schema check of AuditLogListResponse and each refusal of ErrorResponse.

The module writes one known set of entries (``world``) and reads it back through every filter,
every sort in both directions, the cursor, and the refusals. Its entries are told apart from
the rest of the session's by their time window (``from``/``to``), itself taken from them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
import pytest

from conftest import ADMIN_KEY, UNIT, Server, install_hooks

LOGS = "/v1/admin/audit/logs"
# A field the test does not pin (a refusal's resource id, a bulk entry's actor).
ANY = object()


def ok(r: httpx.Response, status: int = 200) -> Any:
    assert r.status_code == status, r.text
    return r.json()


def client(server: Server, headers: dict[str, str]) -> httpx.Client:
    http = httpx.Client(base_url=server.base_url, headers=headers, timeout=10.0)
    install_hooks(http, "admin")
    return http


@dataclass
class Write:
    """One audited request of the world and the entry it must have left."""

    response: httpx.Response
    expect: dict[str, Any]
    entry: dict[str, Any] | None = None

    @property
    def request_id(self) -> str:
        return self.response.headers["x-request-id"]


@dataclass
class World:
    tenant_a: str
    tenant_b: str
    key_id: str
    key_secret: str
    policy_id: str
    writes: list[Write]
    window: dict[str, str]

    @property
    def entries(self) -> list[dict[str, Any]]:
        return [w.entry for w in self.writes if w.entry is not None]


def page(server: Server, **params: Any) -> dict[str, Any]:
    return ok(server.admin.get(LOGS, params=params))


def every(server: Server, **params: Any) -> list[dict[str, Any]]:
    """Every entry listed for ``params``, following the cursor."""
    logs: list[dict[str, Any]] = []
    params = {"limit": 100, **params}
    while True:
        p = page(server, **params)
        logs.extend(p["logs"])
        if not p["has_more"]:
            assert "next_cursor" not in p or p["next_cursor"], p
            return logs
        assert p["next_cursor"], p
        params["cursor"] = p["next_cursor"]


def ids(logs: list[dict[str, Any]]) -> list[str]:
    return [e["log_id"] for e in logs]


@pytest.fixture(scope="module")
def world(server: Server) -> Iterator[World]:
    admin = server.admin
    prefix = f"aud-{uuid.uuid4().hex[:8]}"
    a, b = f"{prefix}-a", f"{prefix}-b"
    writes: list[Write] = []

    def wrote(r: httpx.Response, **expect: Any) -> httpx.Response:
        writes.append(Write(r, expect))
        return r

    # Entries of earlier tests end before this millisecond.
    time.sleep(0.01)
    wrote(admin.post("/v1/admin/tenants", json={"tenant_id": a, "name": "Audit A"}),
          operation="createTenant", resource_type="tenant", resource_id=a, tenant_id=a, status=201,
          actor="admin")
    wrote(admin.post("/v1/admin/tenants", json={"tenant_id": b, "name": "Audit B"}),
          operation="createTenant", resource_type="tenant", resource_id=b, tenant_id=b, status=201,
          actor="admin")
    wrote(admin.post("/v1/admin/tenants", json={"tenant_id": a, "name": "Another A"}),
          operation="createTenant", resource_type="tenant", resource_id=ANY, tenant_id="__admin__",
          status=409, error_code="DUPLICATE_RESOURCE", actor="admin")
    key = wrote(admin.post("/v1/admin/api-keys", json={"tenant_id": a, "name": "auditor"}),
                operation="createApiKey", resource_type="api_key", tenant_id=a, status=201,
                actor="admin").json()
    writes[-1].expect["resource_id"] = key["key_id"]
    for tid in (a, b):
        body = {"tenant_id": tid, "scope": f"tenant:{tid}", "unit": UNIT,
                "allocated": {"unit": UNIT, "amount": 1_000}}
        wrote(admin.post("/v1/admin/budgets", json=body),
              operation="createBudget", resource_type="budget", resource_id=f"tenant:{tid}",
              tenant_id=tid, status=201, actor="admin_on_behalf_of")
    which = {"scope": f"tenant:{a}", "unit": UNIT}
    budget = dict(operation=ANY, resource_type="budget", resource_id=f"tenant:{a}", tenant_id=a,
                  status=200, actor="admin_on_behalf_of")
    wrote(admin.patch("/v1/admin/budgets", params=which,
                      json={"overdraft_limit": {"unit": UNIT, "amount": 10}}),
          **{**budget, "operation": "updateBudget"})
    wrote(admin.post("/v1/admin/budgets/freeze", params=which, json={"reason": "audit"}),
          **{**budget, "operation": "freezeBudget"})
    wrote(admin.post("/v1/admin/budgets/unfreeze", params=which, json={"reason": "audit"}),
          **{**budget, "operation": "unfreezeBudget"})
    with client(server, {"X-Cycles-API-Key": key["key_secret"]}) as tenant:
        policy = wrote(tenant.post("/v1/admin/policies",
                                   json={"name": "audited", "scope_pattern": f"tenant:{a}/*"}),
                       operation="createPolicy", resource_type="policy", tenant_id=a,
                       key_id=key["key_id"], status=201, actor="api_key").json()
        writes[-1].expect["resource_id"] = policy["policy_id"]
        # The admin key's alone.
        wrote(tenant.patch("/v1/admin/budgets", params=which,
                           json={"overdraft_limit": {"unit": UNIT, "amount": 20}}),
              operation="updateBudget", resource_type="budget", resource_id=ANY, tenant_id=a,
              key_id=key["key_id"], status=401, error_code="UNAUTHORIZED", actor="api_key")
    with client(server, {"X-Admin-API-Key": ADMIN_KEY + "-wrong"}) as stranger:
        wrote(stranger.post("/v1/admin/tenants", json={"tenant_id": f"{prefix}-c", "name": "C"}),
              operation="createTenant", resource_type="tenant", resource_id=ANY,
              tenant_id="__unauth__", status=401, error_code="UNAUTHORIZED",
              actor="unauthenticated")
    wrote(admin.patch(f"/v1/admin/tenants/{b}", json={"status": "SUSPENDED"}),
          operation="updateTenant", resource_type="tenant", resource_id=b, tenant_id=b, status=200,
          actor="admin")
    wrote(admin.post("/v1/admin/tenants/bulk-action", json={
        "filter": {"search": b}, "action": "REACTIVATE", "idempotency_key": uuid.uuid4().hex}),
          operation="bulkActionTenants", resource_type="tenant", resource_id="bulk-action",
          tenant_id="__admin__", status=200, actor=ANY)
    wrote(admin.post("/v1/auth/validate", json={"key_secret": key["key_secret"]}),
          operation="validateApiKey", resource_type="api_key", resource_id=ANY,
          tenant_id="__admin__", status=200, actor="admin")
    wrote(admin.patch(f"/v1/admin/api-keys/{key['key_id']}", json={"name": "auditor-2"}),
          operation="updateApiKey", resource_type="api_key", resource_id=key["key_id"],
          tenant_id=a, status=200, actor="admin")
    for w in writes:
        assert w.response.status_code == w.expect["status"], w.response.text
    # Entries of later tests start after the last of these.
    time.sleep(0.01)

    for w in writes:
        found = page(server, request_id=w.request_id)["logs"]
        assert len(found) == 1, (w.request_id, found)
        w.entry = found[0]
    stamps = sorted((w.entry["timestamp"] for w in writes), key=datetime.fromisoformat)
    window = {"from": stamps[0], "to": stamps[-1]}
    w = World(a, b, key["key_id"], key["key_secret"], policy["policy_id"], writes, window)
    # The window holds this module's entries and nothing else.
    assert sorted(ids(every(server, **window))) == sorted(ids(w.entries))
    yield w


def test_each_write_has_one_entry_with_its_facts(world: World) -> None:
    for w in world.writes:
        e, x = w.entry, w.expect
        assert e is not None
        seen = {
            "operation": e["operation"],
            "resource_type": e.get("resource_type"),
            "resource_id": e.get("resource_id"),
            "tenant_id": e["tenant_id"],
            "key_id": e.get("key_id"),
            "status": e["status"],
            "error_code": e.get("error_code"),
            "actor": (e.get("metadata") or {}).get("actor_type"),
        }
        want = {"key_id": None, "error_code": None, **x}
        for name, value in want.items():
            if value is not ANY:
                assert seen[name] == value, (name, e)
        assert e["request_id"] == w.request_id, e
        assert e["trace_id"] == w.response.headers["x-cycles-trace-id"], e
        assert e["log_id"].startswith("log_"), e
        datetime.fromisoformat(e["timestamp"])
        assert e["source_ip"] == "127.0.0.1", e
        assert e["user_agent"].startswith("python-httpx/"), e
        if e["status"] >= 400:
            meta = e["metadata"]
            assert meta["method"] == w.response.request.method, e
            assert meta["path"] == w.response.request.url.path, e
            assert meta["error_message"] == w.response.json()["message"], e
    bulk = next(w.entry for w in world.writes if w.expect["operation"] == "bulkActionTenants")
    assert bulk["metadata"]["succeeded_ids"] == [world.tenant_b], bulk
    assert bulk["metadata"]["total_matched"] == 1, bulk


# (parameters, which of the world's entries they select)
FILTERS: list[tuple[str, Any, Any]] = [
    ("tenant", lambda w: {"tenant_id": w.tenant_a}, lambda w, e: e["tenant_id"] == w.tenant_a),
    ("admin sentinel", lambda w: {"tenant_id": "__admin__"},
     lambda w, e: e["tenant_id"] == "__admin__"),
    ("unauth sentinel", lambda w: {"tenant_id": "__unauth__"},
     lambda w, e: e["tenant_id"] == "__unauth__"),
    ("key", lambda w: {"key_id": w.key_id}, lambda w, e: e.get("key_id") == w.key_id),
    ("resource id", lambda w: {"resource_id": f"tenant:{w.tenant_a}"},
     lambda w, e: e.get("resource_id") == f"tenant:{w.tenant_a}"),
    ("resource id of a key", lambda w: {"resource_id": w.key_id},
     lambda w, e: e.get("resource_id") == w.key_id),
    ("operation", lambda w: {"operation": "createBudget"},
     lambda w, e: e["operation"] == "createBudget"),
    ("operation IN-list", lambda w: {"operation": "createTenant,createApiKey"},
     lambda w, e: e["operation"] in ("createTenant", "createApiKey")),
    ("operation IN-list, repeated", lambda w: [("operation", "createTenant"),
                                              ("operation", "createApiKey")],
     lambda w, e: e["operation"] in ("createTenant", "createApiKey")),
    ("operation IN-list with spaces", lambda w: {"operation": " createTenant , updateTenant "},
     lambda w, e: e["operation"] in ("createTenant", "updateTenant")),
    ("resource type", lambda w: {"resource_type": "api_key"},
     lambda w, e: e.get("resource_type") == "api_key"),
    ("resource type IN-list", lambda w: {"resource_type": "budget,policy"},
     lambda w, e: e.get("resource_type") in ("budget", "policy")),
    ("error code", lambda w: {"error_code": "UNAUTHORIZED"},
     lambda w, e: e.get("error_code") == "UNAUTHORIZED"),
    ("error code IN-list", lambda w: {"error_code": "DUPLICATE_RESOURCE,UNAUTHORIZED"},
     lambda w, e: e.get("error_code") in ("DUPLICATE_RESOURCE", "UNAUTHORIZED")),
    ("an unknown error code matches nothing", lambda w: {"error_code": "NO_SUCH_CODE"},
     lambda w, e: False),
    ("error code is case-sensitive", lambda w: {"error_code": "unauthorized"}, lambda w, e: False),
    ("excluded code: successes pass", lambda w: {"error_code_exclude": "UNAUTHORIZED"},
     lambda w, e: e.get("error_code") != "UNAUTHORIZED"),
    ("excluded codes", lambda w: {"error_code_exclude": "UNAUTHORIZED,DUPLICATE_RESOURCE"},
     lambda w, e: e.get("error_code") is None),
    ("IN-list less NOT-IN list",
     lambda w: {"error_code": "DUPLICATE_RESOURCE,UNAUTHORIZED",
                "error_code_exclude": "UNAUTHORIZED"},
     lambda w, e: e.get("error_code") == "DUPLICATE_RESOURCE"),
    ("search: a resource id, any case", lambda w: {"search": w.tenant_b.upper()},
     lambda w, e: w.tenant_b in (e.get("resource_id") or "")),
    ("search: an error code", lambda w: {"search": "duplicate"},
     lambda w, e: e.get("error_code") == "DUPLICATE_RESOURCE"),
    ("search: an operation", lambda w: {"search": "FREEZEbudget"},
     lambda w, e: "freezebudget" in e["operation"].lower()),
    ("search: a log id", lambda w: {"search": w.entries[4]["log_id"]},
     lambda w, e: e["log_id"] == w.entries[4]["log_id"]),
    ("search: blank is no search", lambda w: {"search": "   "}, lambda w, e: True),
    ("trace id", lambda w: {"trace_id": w.entries[2]["trace_id"]},
     lambda w, e: e["trace_id"] == w.entries[2]["trace_id"]),
    ("request id", lambda w: {"request_id": w.entries[3]["request_id"]},
     lambda w, e: e["request_id"] == w.entries[3]["request_id"]),
    ("filters AND-ed", lambda w: {"tenant_id": w.tenant_a, "resource_type": "budget",
                                  "operation": "updateBudget,freezeBudget"},
     lambda w, e: e["tenant_id"] == w.tenant_a and e.get("resource_type") == "budget"
     and e["operation"] in ("updateBudget", "freezeBudget")),
    ("an unknown parameter is ignored", lambda w: {"colour": "blue"}, lambda w, e: True),
]


@pytest.mark.parametrize("name,params,selects", FILTERS, ids=[f[0] for f in FILTERS])
def test_filters(server: Server, world: World, name: str, params: Any, selects: Any) -> None:
    p = params(world)
    pairs = list(p.items()) if isinstance(p, dict) else p
    r = server.admin.get(LOGS, params=[*pairs, *world.window.items(), ("limit", 100)])
    body = ok(r)
    want = [e for e in world.entries if selects(world, e)]
    assert sorted(ids(body["logs"])) == sorted(ids(want)), name
    assert body["has_more"] is False


def test_time_window_bounds_are_inclusive(server: Server, world: World) -> None:
    stamps = sorted({e["timestamp"] for e in world.entries}, key=datetime.fromisoformat)
    mid = stamps[len(stamps) // 2]
    at = datetime.fromisoformat(mid)
    both = every(server, **{"from": mid, "to": mid})
    assert sorted(ids(both)) == sorted(
        ids([e for e in world.entries if datetime.fromisoformat(e["timestamp"]) == at]))
    since = every(server, **{"from": mid, "to": world.window["to"]})
    assert sorted(ids(since)) == sorted(
        ids([e for e in world.entries if datetime.fromisoformat(e["timestamp"]) >= at]))
    until = every(server, **{"from": world.window["from"], "to": mid})
    assert sorted(ids(until)) == sorted(
        ids([e for e in world.entries if datetime.fromisoformat(e["timestamp"]) <= at]))


def test_status_filters(server: Server, world: World) -> None:
    """Exact, and inclusive bounds; the bounds 100 and 599 themselves are allowed."""
    for params, selects in [
        ({"status": 201}, lambda e: e["status"] == 201),
        ({"status": 401}, lambda e: e["status"] == 401),
        ({"status_min": 400}, lambda e: e["status"] >= 400),
        ({"status_max": 299}, lambda e: e["status"] <= 299),
        ({"status_min": 400, "status_max": 401}, lambda e: 400 <= e["status"] <= 401),
        ({"status_min": 409, "status_max": 409}, lambda e: e["status"] == 409),
        ({"status_min": 500, "status_max": 599}, lambda e: False),
        ({"status_min": 100, "status_max": 599}, lambda e: True),
        ({"status_min": 400, "error_code_exclude": "UNAUTHORIZED"}, lambda e: e["status"] == 409),
    ]:
        got = every(server, **params, **world.window)
        want = [e for e in world.entries if selects(e)]
        assert sorted(ids(got)) == sorted(ids(want)), params


def test_admin_writes_for_a_tenant_are_filed_under_it(server: Server, world: World) -> None:
    """A fund of a tenant's budget and a force release of its reservation, with the admin key:
    on the tenant's behalf, like the admin's budget updates, so under the tenant's id (where
    the tenant's Activity looks), not __admin__."""
    admin = server.admin
    scope = f"tenant:{world.tenant_a}"
    fund = admin.post("/v1/admin/budgets/fund",
                      params={"tenant_id": world.tenant_a, "scope": scope, "unit": UNIT},
                      json={"operation": "CREDIT", "amount": {"unit": UNIT, "amount": 5},
                            "idempotency_key": uuid.uuid4().hex})
    ok(fund)
    # The runtime plane, its bodies validated against the protocol's schemas.
    tenant, operator = (
        httpx.Client(base_url=server.base_url, timeout=10.0, headers=headers)
        for headers in ({"X-Cycles-API-Key": world.key_secret}, {"X-Admin-API-Key": ADMIN_KEY}))
    install_hooks(tenant, "runtime")
    install_hooks(operator, "runtime")
    with tenant, operator:
        reservation = ok(tenant.post("/v1/reservations", json={
            "idempotency_key": uuid.uuid4().hex, "subject": {"tenant": world.tenant_a},
            "action": {"kind": "llm.completion", "name": "audit"},
            "estimate": {"unit": UNIT, "amount": 1}, "ttl_ms": 60_000}))
        release = operator.post(f"/v1/reservations/{reservation['reservation_id']}/release",
                                json={"idempotency_key": uuid.uuid4().hex})
        ok(release)
    for r, operation, kind, resource in [
        (fund, "fundBudget", "budget", scope),
        (release, "releaseReservation", "reservation", reservation["reservation_id"]),
    ]:
        [e] = page(server, request_id=r.headers["x-request-id"])["logs"]
        seen = (e["operation"], e.get("resource_type"), e.get("resource_id"),
                e["metadata"].get("actor_type"), e["tenant_id"])
        assert seen == (operation, kind, resource, "admin_on_behalf_of", world.tenant_a), e
        assert e["request_id"] in {
            x["request_id"] for x in every(server, tenant_id=world.tenant_a)}, e


SORTS = ["timestamp", "operation", "resource_type", "tenant_id", "key_id", "status"]


def sort_key(e: dict[str, Any], by: str) -> Any:
    if by == "timestamp":
        return datetime.fromisoformat(e["timestamp"])
    return e.get(by)


def ordered(values: list[Any], descending: bool) -> bool:
    """Monotone in the direction, an absent value (None) sorting either first or last."""
    present = [v for v in values if v is not None]
    if present != sorted(present, reverse=descending):
        return False
    flags = [v is None for v in values]
    # All the absent ones together, at one end.
    return flags == sorted(flags) or flags == sorted(flags, reverse=True)


@pytest.mark.parametrize("direction", ["asc", "desc"])
@pytest.mark.parametrize("by", SORTS)
def test_sorts_and_their_cursor(server: Server, world: World, by: str, direction: str) -> None:
    """Pages of three, each following the previous page's cursor: together the world, once
    each, in the order asked for."""
    params = {"sort_by": by, "sort_dir": direction, "limit": 3, **world.window}
    seen: list[dict[str, Any]] = []
    pages = 0
    while True:
        p = page(server, **params)
        pages += 1
        assert len(p["logs"]) <= 3
        seen.extend(p["logs"])
        if not p["has_more"]:
            break
        assert len(p["logs"]) == 3
        params["cursor"] = p["next_cursor"]
    assert pages == -(-len(world.entries) // 3)
    assert sorted(ids(seen)) == sorted(ids(world.entries)), "every entry once"
    assert ordered([sort_key(e, by) for e in seen], direction == "desc"), [
        sort_key(e, by) for e in seen]
    # The same order as one page holding them all.
    assert ids(seen) == ids(every(server, sort_by=by, sort_dir=direction, **world.window))


def test_default_order_is_newest_first(server: Server, world: World) -> None:
    default = page(server, limit=100, **world.window)["logs"]
    assert ids(default) == ids(page(server, limit=100, sort_by="timestamp", sort_dir="desc",
                                    **world.window)["logs"])
    stamps = [datetime.fromisoformat(e["timestamp"]) for e in default]
    assert stamps == sorted(stamps, reverse=True)


def test_paging_and_the_limit(server: Server, world: World) -> None:
    one = page(server, limit=1, **world.window)
    assert len(one["logs"]) == 1 and one["has_more"] is True and one["next_cursor"]
    rest = page(server, limit=100, cursor=one["next_cursor"], **world.window)
    whole = page(server, limit=100, **world.window)["logs"]
    assert ids(one["logs"]) + ids(rest["logs"]) == ids(whole)
    assert rest["has_more"] is False
    # The default page is 50; a larger limit is treated as 100. A window of 101 entries:
    # refused key validations, each one entry.
    time.sleep(0.01)
    validations = [server.admin.post("/v1/auth/validate", json={"key_secret": f"cyc_live_{i:032d}"})
                   for i in range(101)]
    assert all(r.status_code == 200 for r in validations)
    time.sleep(0.01)
    bounds = [page(server, request_id=r.headers["x-request-id"])["logs"][0]["timestamp"]
              for r in (validations[0], validations[-1])]
    window = {"from": bounds[0], "to": bounds[1], "operation": "validateApiKey"}
    default = page(server, **window)
    assert len(default["logs"]) == 50 and default["has_more"] is True
    clamped = page(server, limit=1000, **window)
    assert len(clamped["logs"]) == 100 and clamped["has_more"] is True
    last = page(server, limit=1000, cursor=clamped["next_cursor"], **window)
    assert len(last["logs"]) == 1 and last["has_more"] is False
    assert {e["request_id"] for e in clamped["logs"] + last["logs"]} == {
        r.headers["x-request-id"] for r in validations}


def test_reads_are_not_audited(server: Server, world: World) -> None:
    time.sleep(0.01)
    since = datetime.now().astimezone().isoformat(timespec="milliseconds")
    admin = server.admin
    for path, params in [
        (LOGS, {"tenant_id": world.tenant_a}),
        ("/v1/admin/tenants", {}),
        (f"/v1/admin/tenants/{world.tenant_a}", {}),
        ("/v1/admin/api-keys", {"tenant_id": world.tenant_a}),
        ("/v1/admin/budgets", {"tenant_id": world.tenant_a}),
        ("/v1/admin/overview", {}),
        ("/v1/auth/introspect", {}),
    ]:
        ok(admin.get(path, params=params))
    # A refused read neither.
    assert admin.get(LOGS, params={"sort_by": "nope"}).status_code == 400
    time.sleep(0.01)
    assert every(server, **{"from": since}) == []


def test_refusals(server: Server, world: World) -> None:
    admin = server.admin
    first = page(server, limit=2, **world.window)
    cursor = first["next_cursor"]
    many = ",".join(f"op{i}" for i in range(26))
    for params in [
        {"operation": many},
        {"resource_type": many},
        {"error_code": many},
        {"error_code_exclude": many},
        {"status": 200, "status_min": 100},
        {"status": 200, "status_max": 500},
        {"status_min": 500, "status_max": 400},
        {"status_min": 99},
        {"status_max": 600},
        {"search": "x" * 129},
        {"trace_id": "0" * 31},
        {"trace_id": "A" * 32},
        {"trace_id": "g" * 32},
        {"from": "yesterday"},
        {"from": "2027-01-02T00:00:00Z", "to": "2027-01-01T00:00:00Z"},
        {"sort_by": "log_id"},
        {"sort_dir": "up"},
        {"limit": 0},
        {"cursor": "not-a-cursor"},
        # A cursor is good only for the query it came from.
        {"cursor": cursor, **world.window, "tenant_id": world.tenant_a},
        {"cursor": cursor, **world.window, "sort_by": "status"},
        {"cursor": cursor, **world.window, "sort_dir": "asc"},
        {"cursor": cursor},
    ]:
        r = admin.get(LOGS, params=params)
        assert r.status_code == 400, (params, r.text)
        assert r.json()["error"] == "INVALID_REQUEST", (params, r.text)
    # The limits themselves are allowed.
    many25 = ",".join(f"op{i}" for i in range(25))
    assert page(server, operation=many25, **world.window)["logs"] == []
    assert page(server, search="x" * 128, **world.window)["logs"] == []
    # The same cursor with its own query goes on.
    assert page(server, limit=2, cursor=cursor, **world.window)["logs"]


def test_admin_key_only(server: Server, world: World) -> None:
    key = ok(server.admin.post("/v1/admin/api-keys", json={"tenant_id": world.tenant_a,
                                                           "name": "reader"}), 201)
    with client(server, {"X-Cycles-API-Key": key["key_secret"]}) as tenant:
        r = tenant.get(LOGS)
        assert r.status_code == 401 and r.json()["error"] == "UNAUTHORIZED", r.text
    with client(server, {}) as nobody:
        r = nobody.get(LOGS)
        assert r.status_code == 401 and r.json()["error"] == "UNAUTHORIZED", r.text
    with client(server, {"X-Admin-API-Key": ADMIN_KEY + "x"}) as stranger:
        r = stranger.get(LOGS)
        assert r.status_code == 401 and r.json()["error"] == "UNAUTHORIZED", r.text
