"""The governance plane's responses against the upstream schemas: every call below goes
through the session's admin client, whose every response body is validated (conftest), so
each request here is also a schema check of its answer; the asserts check what it says."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from conftest import ADMIN_KEY, UNIT, Server, install_hooks


def tenant_key_client(server: Server, key: str) -> httpx.Client:
    client = httpx.Client(base_url=server.base_url, headers={"X-Cycles-API-Key": key}, timeout=10.0)
    install_hooks(client, "admin")
    return client


def ok(r: httpx.Response, status: int = 200) -> Any:
    assert r.status_code == status, r.text
    return r.json()


def test_lists_updates_and_bulk_actions_match_the_schemas(server: Server) -> None:
    admin = server.admin
    prefix = f"gov-{uuid.uuid4().hex[:8]}"
    ids = [f"{prefix}-{i}" for i in range(3)]
    for tid in ids:
        ok(admin.post("/v1/admin/tenants", json={"tenant_id": tid, "name": tid.upper()}), 201)
    page = ok(admin.get("/v1/admin/tenants", params={"search": prefix, "sort_by": "tenant_id", "sort_dir": "asc", "limit": 2}))
    assert [t["tenant_id"] for t in page["tenants"]] == ids[:2] and page["has_more"]
    rest = ok(admin.get("/v1/admin/tenants", params={"search": prefix, "sort_by": "tenant_id", "sort_dir": "asc", "limit": 2, "cursor": page["next_cursor"]}))
    assert [t["tenant_id"] for t in rest["tenants"]] == ids[2:]
    ok(admin.get(f"/v1/admin/tenants/{ids[0]}"))

    created = ok(admin.post("/v1/admin/api-keys", json={"tenant_id": ids[0], "name": "k"}), 201)
    keys = ok(admin.get("/v1/admin/api-keys", params={"tenant_id": ids[0]}))
    assert [k["key_id"] for k in keys["keys"]] == [created["key_id"]]
    patched = ok(admin.patch(f"/v1/admin/api-keys/{created['key_id']}", json={"name": "renamed", "scope_filter": ["agent:*"]}))
    assert patched["name"] == "renamed"

    introspect = ok(admin.get("/v1/auth/introspect"))
    assert introspect["auth_type"] == "admin" and introspect["permissions"] == ["*"]
    with tenant_key_client(server, created["key_secret"]) as tenant:
        mine = ok(tenant.get("/v1/auth/introspect"))
        assert mine["auth_type"] == "tenant" and mine["tenant_id"] == ids[0]
        assert mine["scope_filter"] == ["agent:*"]
        ledgers = ok(tenant.get("/v1/balances", params={"tenant_id": ids[0]}))
        assert ledgers == {"balances": [], "has_more": False}, "no budget yet"
    valid = ok(admin.post("/v1/auth/validate", json={"key_secret": created["key_secret"]}))
    assert valid["valid"] is True and valid["tenant_id"] == ids[0]
    unknown = ok(admin.post("/v1/auth/validate", json={"key_secret": "cyc_live_" + "0" * 32}))
    assert unknown == {"valid": False, "tenant_id": "", "reason": "KEY_NOT_FOUND"}

    for tid, allocated in zip(ids, (1_000, 2_000, 3_000)):
        budget = {"tenant_id": tid, "scope": f"tenant:{tid}", "unit": UNIT, "allocated": {"unit": UNIT, "amount": allocated}}
        ok(admin.post("/v1/admin/budgets", json=budget), 201)
    budgets = ok(admin.get("/v1/admin/budgets", params={"search": prefix, "sort_by": "scope", "sort_dir": "asc", "has_debt": "false", "limit": 1000}))
    assert [b["scope"] for b in budgets["ledgers"]] == [f"tenant:{t}" for t in ids]
    bulk = ok(admin.post("/v1/admin/budgets/bulk-action", json={
        "filter": {"tenant_id": ids[1]}, "action": "CREDIT", "amount": {"unit": UNIT, "amount": 5},
        "expected_count": 1, "idempotency_key": uuid.uuid4().hex,
    }))
    assert bulk["total_matched"] == 1 and len(bulk["succeeded"]) == 1
    assert server.ledger(f"tenant:{ids[1]}")["allocated"]["amount"] == 2_005

    suspended = ok(admin.post("/v1/admin/tenants/bulk-action", json={
        "filter": {"search": prefix}, "action": "SUSPEND", "idempotency_key": uuid.uuid4().hex,
    }))
    assert sorted(r["id"] for r in suspended["succeeded"]) == ids
    ok(admin.patch(f"/v1/admin/tenants/{ids[2]}", json={"status": "CLOSED"}))
    revoked = ok(admin.get("/v1/admin/api-keys", params={"tenant_id": ids[0]}))
    assert revoked["keys"][0]["status"] == "ACTIVE", "only the closed tenant's keys are revoked"
    ok(admin.delete(f"/v1/admin/api-keys/{created['key_id']}", params={"reason": "done"}))

    overview = ok(admin.get("/v1/admin/overview"))
    assert overview["tenant_counts"]["closed"] >= 1
    assert overview["budget_counts"]["total"] >= 3


def test_refusals_are_error_bodies(server: Server) -> None:
    admin = server.admin
    for path, params in [
        ("/v1/admin/tenants", {"sort_by": "nope"}),
        ("/v1/admin/budgets", {"utilization_min": "2"}),
        ("/v1/admin/api-keys", {"status": "LIVE"}),
    ]:
        r = admin.get(path, params=params)
        assert r.status_code == 400 and r.json()["error"] == "INVALID_REQUEST", r.text
    r = admin.post("/v1/admin/tenants/bulk-action", json={"filter": {}, "action": "SUSPEND", "idempotency_key": "x"})
    assert r.status_code == 400, r.text
    r = httpx.get(f"{server.base_url}/v1/auth/introspect", headers={"X-Admin-API-Key": ADMIN_KEY + "x"})
    assert r.status_code == 401 and "cycles-api-key" not in r.text.lower(), r.text
