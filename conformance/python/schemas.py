"""Validates captured response bodies against the upstream OpenAPI component schemas.

The upstream documents are OpenAPI 3.1 (JSON Schema 2020-12 dialect). Each document is loaded
once, OpenAPI 3.0 ``nullable: true`` is rewritten to a ``null`` type if any schema still uses
it, and a component is validated through a ``$ref`` into the loaded document, so every nested
``$ref`` resolves against that same document.
"""

from __future__ import annotations

import copy
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

PROTOCOL_DOC = "cycles-openapi-protocol-merged.yaml"
ADMIN_DOC = "cycles-openapi-admin-merged.yaml"

# (method, path regex, success status, component schema). The first match wins.
RUNTIME_ROUTES: list[tuple[str, str, int, str]] = [
    ("POST", r"/v1/reservations", 200, "ReservationCreateResponse"),
    ("POST", r"/v1/reservations/[^/]+/commit", 200, "CommitResponse"),
    ("POST", r"/v1/reservations/[^/]+/release", 200, "ReleaseResponse"),
    ("POST", r"/v1/reservations/[^/]+/extend", 200, "ReservationExtendResponse"),
    ("POST", r"/v1/decide", 200, "DecisionResponse"),
    ("POST", r"/v1/events", 201, "EventCreateResponse"),
    ("GET", r"/v1/balances", 200, "BalanceResponse"),
    ("GET", r"/v1/reservations", 200, "ReservationListResponse"),
    ("GET", r"/v1/reservations/[^/]+", 200, "ReservationDetail"),
]
# An empty schema name: the spec gives no component for that success (no body, or an inline
# one), so only its status is checked.
ADMIN_ROUTES: list[tuple[str, str, int, str]] = [
    ("POST", r"/v1/admin/webhooks/bulk-action", 200, "WebhookBulkActionResponse"),
    ("POST", r"/v1/admin/webhooks/[^/]+/test", 200, "WebhookTestResponse"),
    ("POST", r"/v1/admin/webhooks/[^/]+/replay", 202, ""),
    ("GET", r"/v1/admin/webhooks/[^/]+/deliveries", 200, "WebhookDeliveryListResponse"),
    ("POST", r"/v1/admin/webhooks", 201, "WebhookCreateResponse"),
    ("GET", r"/v1/admin/webhooks", 200, "WebhookListResponse"),
    ("GET", r"/v1/admin/webhooks/[^/]+", 200, "WebhookSubscription"),
    ("PATCH", r"/v1/admin/webhooks/[^/]+", 200, "WebhookSubscription"),
    ("DELETE", r"/v1/admin/webhooks/[^/]+", 204, ""),
    ("GET", r"/v1/admin/config/webhook-security", 200, "WebhookSecurityConfig"),
    ("PUT", r"/v1/admin/config/webhook-security", 200, "WebhookSecurityConfig"),
    ("GET", r"/v1/admin/events", 200, "EventListResponse"),
    ("GET", r"/v1/admin/events/[^/]+", 200, "Event"),
    ("POST", r"/v1/admin/tenants/bulk-action", 200, "TenantBulkActionResponse"),
    ("POST", r"/v1/admin/tenants", 201, "Tenant"),
    ("GET", r"/v1/admin/tenants", 200, "TenantListResponse"),
    ("GET", r"/v1/admin/tenants/[^/]+", 200, "Tenant"),
    ("PATCH", r"/v1/admin/tenants/[^/]+", 200, "Tenant"),
    ("POST", r"/v1/admin/api-keys", 201, "ApiKeyCreateResponse"),
    ("GET", r"/v1/admin/api-keys", 200, "ApiKeyListResponse"),
    ("PATCH", r"/v1/admin/api-keys/[^/]+", 200, "ApiKey"),
    ("DELETE", r"/v1/admin/api-keys/[^/]+", 200, "ApiKey"),
    ("POST", r"/v1/admin/budgets/bulk-action", 200, "BudgetBulkActionResponse"),
    ("POST", r"/v1/admin/budgets", 201, "BudgetLedger"),
    ("GET", r"/v1/admin/budgets", 200, "BudgetListResponse"),
    ("PATCH", r"/v1/admin/budgets", 200, "BudgetLedger"),
    ("POST", r"/v1/admin/budgets/freeze", 200, "BudgetLedger"),
    ("POST", r"/v1/admin/budgets/unfreeze", 200, "BudgetLedger"),
    ("POST", r"/v1/admin/budgets/fund", 200, "BudgetFundingResponse"),
    ("GET", r"/v1/admin/budgets/lookup", 200, "BudgetLedger"),
    ("POST", r"/v1/admin/policies", 201, "Policy"),
    ("GET", r"/v1/auth/introspect", 200, "AuthIntrospectResponse"),
    ("POST", r"/v1/auth/validate", 200, "ApiKeyValidationResponse"),
    ("GET", r"/v1/admin/overview", 200, "AdminOverviewResponse"),
    ("GET", r"/v1/admin/audit/logs", 200, "AuditLogListResponse"),
    # The admin spec's form of getBalances (whole ledgers), asked for with its parameters.
    ("GET", r"/v1/balances", 200, "BalanceListResponse"),
]


def _nullable_to_type(node: Any) -> Any:
    """Rewrites OpenAPI 3.0 ``nullable: true`` into JSON Schema (``type: [T, "null"]``)."""
    if isinstance(node, dict):
        out = {k: _nullable_to_type(v) for k, v in node.items() if k != "nullable"}
        if node.get("nullable") is True:
            t = out.get("type")
            if isinstance(t, str):
                out["type"] = [t, "null"]
            elif isinstance(t, list) and "null" not in t:
                out["type"] = [*t, "null"]
            elif t is None:
                out = {"anyOf": [out, {"type": "null"}]}
        return out
    if isinstance(node, list):
        return [_nullable_to_type(v) for v in node]
    return node


class SpecDocument:
    def __init__(self, path: Path, uri: str) -> None:
        with path.open() as f:
            doc = yaml.safe_load(f)
        self.path = path
        self.uri = uri
        self.doc = _nullable_to_type(doc)
        self.schemas = self.doc["components"]["schemas"]
        resource = Resource.from_contents(self.doc, default_specification=DRAFT202012)
        self.registry = Registry().with_resource(uri, resource)
        self._validators: dict[str, jsonschema.Draft202012Validator] = {}

    def validator(self, name: str) -> jsonschema.Draft202012Validator:
        if name not in self._validators:
            if name not in self.schemas:
                raise KeyError(f"{name} is not a component schema of {self.path.name}")
            self._validators[name] = jsonschema.Draft202012Validator(
                {"$ref": f"{self.uri}#/components/schemas/{name}"}, registry=self.registry
            )
        return self._validators[name]

    def errors(self, name: str, body: Any) -> list[str]:
        found = sorted(self.validator(name).iter_errors(body), key=lambda e: list(e.absolute_path))
        return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in found]


@dataclass
class Check:
    plane: str
    method: str
    path: str
    status: int
    schema: str | None
    problems: list[str]


@dataclass
class BodyValidator:
    """Checks every captured body; thread-safe (SDK heartbeats and retries run in threads)."""

    protocol: SpecDocument | None
    admin: SpecDocument | None
    checks: list[Check] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def load(cls, spec_dir: Path | None) -> BodyValidator:
        if spec_dir is None:
            return cls(None, None)
        protocol = SpecDocument(spec_dir / PROTOCOL_DOC, "urn:cycles:protocol")
        admin_path = spec_dir / ADMIN_DOC
        admin = SpecDocument(admin_path, "urn:cycles:admin") if admin_path.exists() else None
        return cls(protocol, admin)

    @property
    def enabled(self) -> bool:
        return self.protocol is not None

    def check(self, plane: str, method: str, path: str, status: int, body: Any) -> Check | None:
        """Validates one response; returns the recorded check (None when disabled)."""
        doc = self.admin if plane == "admin" else self.protocol
        if doc is None:
            return None
        routes = ADMIN_ROUTES if plane == "admin" else RUNTIME_ROUTES
        problems: list[str] = []
        schema: str | None = None
        if 200 <= status < 300:
            for m, pattern, expected, name in routes:
                if m == method and re.fullmatch(pattern, path):
                    schema = name or None
                    if status != expected:
                        problems.append(f"success status {status}, the spec says {expected}")
                    break
            else:
                problems.append("no response schema is mapped for this success (add it to the route table)")
        else:
            schema = "ErrorResponse"
        if schema is not None:
            if body is None:
                problems.append("the body is not JSON")
            else:
                problems.extend(doc.errors(schema, copy.deepcopy(body)))
        result = Check(plane, method, path, status, schema, problems)
        with self.lock:
            self.checks.append(result)
        return result

    def snapshot(self) -> int:
        with self.lock:
            return len(self.checks)

    def failures_since(self, mark: int) -> list[Check]:
        with self.lock:
            return [c for c in self.checks[mark:] if c.problems]
