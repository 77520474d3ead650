"""Fixtures: our server binary on a free port, a fresh tenant per test, the official Python SDK.

Environment:
  CYCLES_BIN        the server binary (default: $CARGO_TARGET_DIR/debug/cycles, else
                    <repo>/target/debug/cycles)
  CYCLES_SPEC_DIR   the upstream OpenAPI documents (default: <repo>/../shared/spec/upstream);
                    when missing, schema validation is skipped (and the run fails under CI=true)
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from runcycles import AsyncCyclesClient, CyclesClient, CyclesConfig

from schemas import BodyValidator

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
ADMIN_KEY = "conformance-admin-key"
UNIT = "USD_MICROCENTS"


def server_binary() -> Path:
    explicit = os.environ.get("CYCLES_BIN")
    if explicit:
        return Path(explicit).resolve()
    target = os.environ.get("CARGO_TARGET_DIR")
    if target:
        base = Path(target)
        # cargo resolves a relative CARGO_TARGET_DIR against the directory it runs in: the repo.
        base = base if base.is_absolute() else REPO / base
    else:
        base = REPO / "target"
    return base / "debug" / "cycles"


def spec_dir() -> Path | None:
    raw = os.environ.get("CYCLES_SPEC_DIR")
    path = Path(raw) if raw else REPO.parent / "shared" / "spec" / "upstream"
    path = path.resolve()
    return path if (path / "cycles-openapi-protocol-merged.yaml").is_file() else None


# ── schema validation (session-wide) ──────────────────────────────────────────────────────────

_VALIDATOR: BodyValidator | None = None


def validator() -> BodyValidator:
    global _VALIDATOR
    if _VALIDATOR is None:
        _VALIDATOR = BodyValidator.load(spec_dir())
    return _VALIDATOR


def pytest_configure(config: pytest.Config) -> None:
    if spec_dir() is None and os.environ.get("CI") == "true":
        raise pytest.UsageError(
            "CI=true but the upstream OpenAPI documents were not found "
            f"(CYCLES_SPEC_DIR={os.environ.get('CYCLES_SPEC_DIR', '<unset>')}, default "
            f"{REPO.parent / 'shared' / 'spec' / 'upstream'}): schema validation must not be skipped in CI"
        )


def pytest_report_header(config: pytest.Config) -> str:
    d = spec_dir()
    where = str(d) if d else "NOT FOUND: schema validation skipped"
    return f"cycles server: {server_binary()}\ncycles spec schemas: {where}"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    v = _VALIDATOR
    if v is None:
        return
    if not v.enabled:
        terminalreporter.write_line("schema validation: SKIPPED (no spec directory)")
        return
    with v.lock:
        checks = list(v.checks)
    by_plane: dict[str, int] = {}
    for c in checks:
        by_plane[c.plane] = by_plane.get(c.plane, 0) + 1
    bad = sum(1 for c in checks if c.problems)
    planes = ", ".join(f"{n} {p}" for p, n in sorted(by_plane.items()))
    terminalreporter.write_line(
        f"schema validation: {len(checks)} response bodies checked ({planes}), {bad} invalid"
    )


@dataclass
class Exchange:
    method: str
    path: str
    status: int
    request: Any
    body: Any


@dataclass
class Traffic:
    """Every request/response an SDK client made, in order (thread-safe)."""

    exchanges: list[Exchange] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, x: Exchange) -> None:
        with self.lock:
            self.exchanges.append(x)

    def find(self, method: str, pattern: str, status: int | None = None) -> list[Exchange]:
        with self.lock:
            return [
                x
                for x in self.exchanges
                if x.method == method
                and re.fullmatch(pattern, x.path)
                and (status is None or x.status == status)
            ]


def _json_or_none(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def install_hooks(http: httpx.Client | httpx.AsyncClient, plane: str, traffic: Traffic | None = None) -> None:
    """Captures and schema-checks every response of an httpx client (the SDK's transport)."""

    def record(response: httpx.Response) -> None:
        request = response.request
        body = _json_or_none(response.content)
        path = request.url.path
        validator().check(plane, request.method, path, response.status_code, body)
        if traffic is not None:
            traffic.add(
                Exchange(request.method, path, response.status_code, _json_or_none(request.content), body)
            )

    def on_response(response: httpx.Response) -> None:
        response.read()
        record(response)

    async def on_response_async(response: httpx.Response) -> None:
        await response.aread()
        record(response)

    hooks = dict(http.event_hooks)
    hook = on_response_async if isinstance(http, httpx.AsyncClient) else on_response
    hooks["response"] = [*hooks.get("response", []), hook]
    http.event_hooks = hooks


@pytest.fixture(autouse=True)
def _bodies_match_the_spec() -> Iterator[None]:
    """Fails a test whose responses (SDK or admin) did not match the upstream schemas."""
    mark = validator().snapshot()
    yield
    failures = validator().failures_since(mark)
    if failures:
        lines = [
            f"{c.plane} {c.method} {c.path} -> {c.status} as {c.schema}: " + "; ".join(c.problems)
            for c in failures
        ]
        pytest.fail("responses that do not match the upstream OpenAPI schemas:\n" + "\n".join(lines))


# ── the server ────────────────────────────────────────────────────────────────────────────────


def ledger(allocated: int, spent: int = 0, reserved: int = 0, debt: int = 0) -> dict[str, int]:
    """A budget's amounts as `Server.amounts` reads them."""
    return {
        "allocated": allocated,
        "spent": spent,
        "reserved": reserved,
        "remaining": allocated - spent - reserved - debt,
        "debt": debt,
    }


@dataclass
class Server:
    base_url: str
    admin: httpx.Client

    def ledger(self, scope: str, unit: str = UNIT) -> dict[str, Any]:
        r = self.admin.get("/v1/admin/budgets/lookup", params={"scope": scope, "unit": unit})
        assert r.status_code == 200, r.text
        return r.json()

    def amounts(self, scope: str) -> dict[str, int]:
        b = self.ledger(scope)
        out = {k: b[k]["amount"] for k in ("allocated", "spent", "reserved", "remaining", "debt")}
        assert out["remaining"] == out["allocated"] - out["spent"] - out["reserved"] - out["debt"], b
        return out


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    binary = server_binary()
    if not binary.is_file():
        pytest.exit(f"server binary not found at {binary}: build it (cargo build -p cycles) or set CYCLES_BIN", 2)
    work = tmp_path_factory.mktemp("cycles-server")
    log_path = work / "server.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [
            str(binary),
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            str(work / "data"),
            "--admin-api-key",
            ADMIN_KEY,
            # The anomaly detector closes its windows every 100 ms, so a spike is seen at once.
            "--anomaly-tick-ms",
            "100",
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True, name="cycles-server-stdout").start()
    base_url = None
    deadline = time.monotonic() + 30
    while base_url is None and time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            base_url = m.group(1)
    if base_url is None:
        proc.kill()
        proc.wait()
        log.close()
        pytest.exit(f"the server did not start; its log:\n{log_path.read_text()}", 2)

    admin = httpx.Client(base_url=base_url, headers={"X-Admin-API-Key": ADMIN_KEY}, timeout=10.0)
    install_hooks(admin, "admin")
    while True:
        try:
            if httpx.get(f"{base_url}/actuator/health", timeout=2.0).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.exit("the server never reported healthy", 2)
        time.sleep(0.05)
    try:
        yield Server(base_url, admin)
    finally:
        admin.close()
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


# ── a tenant per test ─────────────────────────────────────────────────────────────────────────


@dataclass
class Tenant:
    id: str
    key: str
    server: Server
    client: CyclesClient
    traffic: Traffic

    @property
    def scope(self) -> str:
        return f"tenant:{self.id}"

    def amounts(self, scope: str | None = None) -> dict[str, int]:
        return self.server.amounts(scope or self.scope)

    def async_client(self) -> AsyncCyclesClient:
        """An async SDK client for this tenant (create it inside the event loop that uses it)."""
        client = AsyncCyclesClient(sdk_config(self.server, self.key, self.id))
        install_hooks(client._http, "runtime", self.traffic)
        return client


def sdk_config(server: Server, key: str, tenant: str) -> CyclesConfig:
    return CyclesConfig(
        base_url=server.base_url,
        api_key=key,
        tenant=tenant,
        # sdk-compat.md §2.2: a durable journal would replay leftovers into later runs.
        journal_enabled=False,
        retry_initial_delay=0.2,
        retry_flush_timeout=0.0,
    )


def sdk_client(server: Server, key: str, tenant: str, traffic: Traffic) -> CyclesClient:
    client = CyclesClient(sdk_config(server, key, tenant))
    install_hooks(client._http, "runtime", traffic)
    return client


@pytest.fixture
def make_tenant(server: Server) -> Iterator[Callable[..., Tenant]]:
    made: list[Tenant] = []

    def make(allocated: int = 1_000_000) -> Tenant:
        tid = f"conf-{uuid.uuid4().hex[:12]}"
        r = server.admin.post("/v1/admin/tenants", json={"tenant_id": tid, "name": tid})
        assert r.status_code == 201, r.text
        r = server.admin.post("/v1/admin/api-keys", json={"tenant_id": tid, "name": "conformance"})
        assert r.status_code == 201, r.text
        key = r.json()["key_secret"]
        budget = {
            "tenant_id": tid,
            "scope": f"tenant:{tid}",
            "unit": UNIT,
            "allocated": {"unit": UNIT, "amount": allocated},
        }
        r = server.admin.post("/v1/admin/budgets", json=budget)
        assert r.status_code == 201, r.text
        traffic = Traffic()
        t = Tenant(tid, key, server, sdk_client(server, key, tid, traffic), traffic)
        made.append(t)
        return t

    yield make
    for t in made:
        t.client.close()


@pytest.fixture
def tenant(make_tenant: Callable[..., Tenant]) -> Tenant:
    return make_tenant()

