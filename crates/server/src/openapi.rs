//! The OpenAPI 3.1 document this server serves at `GET /openapi.json`, and Swagger UI at
//! `/swagger-ui/`. The UI's assets are compiled into the binary (`utoipa-swagger-ui` with its
//! `vendored` feature): nothing is downloaded, at build time or at run time.
//!
//! Schemas are derived from the `protocol` types, the crate that owns the wire format. The
//! operations are declared below, one stub function per route, so the handlers stay free of
//! documentation attributes. `tests/it/openapi.rs` holds this list to the router and validates
//! real responses against the schemas.

use axum::Router;
use protocol::MAX_BODY_BYTES;
use serde_json::{json, Map, Value};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityScheme};
use utoipa::openapi::OpenApi as Document;
use utoipa::{Modify, OpenApi};
use utoipa_swagger_ui::SwaggerUi;

/// Where the document is served.
pub const OPENAPI_PATH: &str = "/openapi.json";
/// Where Swagger UI is served (`/swagger-ui` redirects to `/swagger-ui/`).
pub const SWAGGER_UI_PATH: &str = "/swagger-ui";

/// The routes serving the document and the UI. Public: they reveal nothing a client of the
/// protocol does not already know.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    SwaggerUi::new(SWAGGER_UI_PATH)
        .external_url_unchecked(OPENAPI_PATH, document())
        .into()
}

const DESCRIPTION: &str = "\
The Cycles budget authority: reserve an estimate against every budget a subject names, then \
commit the actual amount or release the hold.

* **Auth.** Runtime operations take a tenant API key in `X-Cycles-API-Key`; the admin plane \
takes the operator's key in `X-Admin-API-Key`. Operations that list both accept either; when \
`X-Admin-API-Key` is present it must be valid and is the one used.
* **Errors.** Every error body is an `ErrorResponse`. Unknown routes answer 404 NOT_FOUND, \
wrong methods 405 INVALID_REQUEST, bodies over {max_body_bytes} bytes 400 INVALID_REQUEST. When \
per-credential rate limiting is configured, any `/v1` operation can answer 429 LIMIT_EXCEEDED; \
when storage cannot take writes, 503 INTERNAL_ERROR (nothing was recorded).
* **Correlation.** Every response carries `X-Request-Id` and `X-Cycles-Trace-Id` (taken from \
a valid `traceparent`, else a valid inbound `X-Cycles-Trace-Id`, else generated).
* **Bodies.** Request bodies reject unknown fields. Response bodies carry exactly the fields \
documented and never `null` (an absent optional field is omitted). On input, no field is \
nullable: omit it instead (an explicit `null` is 400 INVALID_REQUEST; open `metadata` objects \
may hold anything).
* **Query parameters** not documented here are ignored; documented ones are validated, and a \
blank value counts as absent.
* **Idempotency.** Write operations with an `idempotency_key` replay the original response for \
the same key and body, and answer 409 IDEMPOTENCY_MISMATCH for the same key with another body.";

#[derive(OpenApi)]
#[openapi(
    info(title = "Cycles", description = DESCRIPTION, license(name = "Apache-2.0")),
    paths(
        ops::health,
        ops::liveness,
        ops::readiness,
        ops::metrics,
        ops::openapi_json,
        ops::create_reservation,
        ops::list_reservations,
        ops::get_reservation,
        ops::commit_reservation,
        ops::release_reservation,
        ops::extend_reservation,
        ops::decide,
        ops::create_event,
        ops::get_balances,
        ops::create_tenant,
        ops::get_tenant,
        ops::update_tenant,
        ops::create_api_key,
        ops::revoke_api_key,
        ops::create_budget,
        ops::list_budgets,
        ops::update_budget,
        ops::lookup_budget,
        ops::fund_budget,
        ops::freeze_budget,
        ops::unfreeze_budget,
        ops::create_policy,
        ops::list_policies,
        ops::update_policy,
    ),
    components(
        // Referenced by the shared error responses, which utoipa does not walk.
        schemas(protocol::ErrorBody),
        responses(
            ops::BadRequest,
            ops::Unauthorized,
            ops::Forbidden,
            ops::NotFound,
            ops::Conflict,
            ops::Gone,
            ops::TooManyRequests,
            ops::InternalError,
            ops::Unavailable,
        ),
    ),
    modifiers(&SecuritySchemes),
    tags(
        (name = "Reservations", description = "Reserve, commit, release, extend and read reservations."),
        (name = "Decisions", description = "Ask whether a spend would be admitted, without holding anything."),
        (name = "Events", description = "Record spend that already happened."),
        (name = "Balances", description = "Read the budgets of the caller's tenant."),
        (name = "Tenants", description = "Provision tenants (admin)."),
        (name = "API Keys", description = "Issue and revoke tenant API keys (admin)."),
        (name = "Budgets", description = "Create, fund, read and freeze budgets."),
        (name = "Policies", description = "Caps, overage and TTL rules for scope patterns."),
        (name = "Operations", description = "Health probes, metrics and this document."),
    )
)]
struct ApiDoc;

struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut Document) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "ApiKeyAuth",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "X-Cycles-API-Key",
                "A tenant's API key (`cyc_live_…`), issued by POST /v1/admin/api-keys.",
            ))),
        );
        components.add_security_scheme(
            "AdminKeyAuth",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "X-Admin-API-Key",
                "The operator's admin key, from the server's configuration.",
            ))),
        );
    }
}

/// The document, as served.
pub fn document() -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi())
        .expect("the OpenAPI document is plain data: it always serializes");
    doc["info"]["description"] = DESCRIPTION
        .replace("{max_body_bytes}", &MAX_BODY_BYTES.to_string())
        .into();
    without_null(&mut doc);
    closed_objects(&mut doc);
    universal_responses(&mut doc);
    shared_headers(&mut doc);
    doc
}

/// Answers every `/v1` operation can give, whatever it does: a bad or missing key (401),
/// throttling when rate limiting is on (429), a broken invariant (500) and storage that
/// cannot take writes (503). Added here once rather than listed on every operation.
fn universal_responses(doc: &mut Value) {
    const UNIVERSAL: [(&str, &str); 4] = [
        ("401", "Unauthorized"),
        ("429", "TooManyRequests"),
        ("500", "InternalError"),
        ("503", "Unavailable"),
    ];
    let Some(paths) = doc["paths"].as_object_mut() else {
        return;
    };
    for (path, item) in paths.iter_mut() {
        if !path.starts_with("/v1") {
            continue;
        }
        for op in item
            .as_object_mut()
            .into_iter()
            .flat_map(|m| m.values_mut())
        {
            let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else {
                continue;
            };
            for (status, name) in UNIVERSAL {
                responses.entry(status).or_insert_with(
                    || serde_json::json!({"$ref": format!("#/components/responses/{name}")}),
                );
            }
        }
    }
}

/// Neither requests nor responses carry `null`: drops the `null` alternative utoipa
/// gives every `Option` field, so the schemas say what the server emits.
fn without_null(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if let Some(Value::Array(types)) = map.get_mut("type") {
                types.retain(|t| t != "null");
                if types.len() == 1 {
                    let only = types.remove(0);
                    map.insert("type".into(), only);
                }
            }
            if let Some(Value::Array(values)) = map.get_mut("enum") {
                values.retain(|v| !v.is_null());
            }
            for key in ["oneOf", "anyOf"] {
                let Some(Value::Array(alternatives)) = map.get_mut(key) else {
                    continue;
                };
                alternatives.retain(|a| a.get("type").and_then(Value::as_str) != Some("null"));
                if alternatives.len() == 1 {
                    let Some(Value::Object(only)) = map
                        .remove(key)
                        .and_then(|mut a| a.as_array_mut().and_then(|a| a.pop()))
                    else {
                        continue;
                    };
                    for (k, v) in only {
                        map.entry(k).or_insert(v);
                    }
                }
            }
            map.values_mut().for_each(without_null);
        }
        Value::Array(items) => items.iter_mut().for_each(without_null),
        _ => {}
    }
}

/// Request types reject unknown fields and response types emit exactly their fields: every
/// object schema with declared properties is closed (`additionalProperties: false`).
fn closed_objects(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if map.get("type").and_then(Value::as_str) == Some("object")
                && map.get("properties").is_some_and(Value::is_object)
                && !map.contains_key("additionalProperties")
            {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            map.values_mut().for_each(closed_objects);
        }
        Value::Array(items) => items.iter_mut().for_each(closed_objects),
        _ => {}
    }
}

/// Response headers, declared once and referenced: `(name, description, on every response)`.
const HEADERS: [(&str, &str, bool); 3] = [
    (
        "X-Request-Id",
        "A fresh id for this request; also the error body's `request_id`.",
        true,
    ),
    (
        "X-Cycles-Trace-Id",
        "The W3C trace id (32 lowercase hex); also the error body's `trace_id`.",
        true,
    ),
    (
        "X-Cycles-Tenant",
        "The tenant the request acted for.",
        false,
    ),
];

/// Declares [`HEADERS`] in `components.headers` and references them from the responses:
/// every response gets the correlation headers; the others are referenced where declared.
fn shared_headers(doc: &mut Value) {
    if let Some(components) = doc.get_mut("components").and_then(Value::as_object_mut) {
        let declared = components
            .entry("headers")
            .or_insert_with(|| Value::Object(Map::new()));
        for (name, description, _) in HEADERS {
            declared[name] = json!({"description": description, "schema": {"type": "string"}});
        }
    }
    let mut responses: Vec<&mut Value> = Vec::new();
    if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
        for item in paths.values_mut().filter_map(Value::as_object_mut) {
            for operation in item.values_mut() {
                if let Some(r) = operation
                    .get_mut("responses")
                    .and_then(Value::as_object_mut)
                {
                    responses.extend(r.values_mut().filter(|r| r.get("$ref").is_none()));
                }
            }
        }
    }
    for response in responses {
        reference_headers(response);
    }
    if let Some(shared) = doc
        .pointer_mut("/components/responses")
        .and_then(Value::as_object_mut)
    {
        shared.values_mut().for_each(reference_headers);
    }
}

fn reference_headers(response: &mut Value) {
    let Some(response) = response.as_object_mut() else {
        return;
    };
    let declared = response
        .entry("headers")
        .or_insert_with(|| Value::Object(Map::new()));
    for (name, _, everywhere) in HEADERS {
        if everywhere || declared.get(name).is_some() {
            declared[name] = json!({"$ref": format!("#/components/headers/{name}")});
        }
    }
}

/// The operations: one stub per route, never called, carrying only documentation.
#[allow(dead_code)]
mod ops {
    use protocol::admin::{
        ApiKeyCreateRequest, ApiKeyCreateResponse, ApiKeyResponse, BudgetCreateRequest,
        BudgetFundingRequest, BudgetFundingResponse, BudgetLedger, BudgetListResponse,
        BudgetStatusTransitionRequest, BudgetUpdateRequest, TenantCreateRequest, TenantResponse,
        TenantUpdateRequest,
    };
    use protocol::listing::ReservationListResponse;
    use protocol::policy::{
        PolicyCreateRequest, PolicyListResponse, PolicyResponse, PolicyUpdateRequest,
    };
    use protocol::runtime::{
        BalanceResponse, CommitRequest, CommitResponse, DecisionRequest, DecisionResponse,
        EventCreateRequest, EventCreateResponse, ReleaseRequest, ReleaseResponse,
        ReservationCreateRequest, ReservationCreateResponse, ReservationDetail,
        ReservationExtendRequest, ReservationExtendResponse,
    };
    use protocol::schema::{
        BudgetStatus, PolicyStatus, ReservationSortBy, ReservationStatus, SortDirection,
    };
    use protocol::{ErrorBody, WireUnit};
    use utoipa::openapi::header::HeaderBuilder;
    use utoipa::openapi::response::{Response, ResponseBuilder};
    use utoipa::openapi::{ContentBuilder, RefOr, Schema};
    use utoipa::{IntoParams, PartialSchema, ToResponse, ToSchema};

    fn error_response(description: &str) -> RefOr<Response> {
        let body = ContentBuilder::new()
            .schema(Some(RefOr::<Schema>::Ref(
                utoipa::openapi::Ref::from_schema_name(<ErrorBody as ToSchema>::name()),
            )))
            .build();
        ResponseBuilder::new()
            .description(description)
            .content("application/json", body)
            .into()
    }

    /// Shared error responses: `name => "description"`.
    macro_rules! error_responses {
        ($($name:ident => $description:expr;)*) => {$(
            pub struct $name;

            impl<'r> ToResponse<'r> for $name {
                fn response() -> (&'r str, RefOr<Response>) {
                    (stringify!($name), error_response($description))
                }
            }
        )*};
    }

    error_responses! {
        BadRequest => "INVALID_REQUEST: a malformed or oversized body, an unknown or invalid \
            field, an invalid path or query parameter, or a request the current state does not \
            allow; UNIT_MISMATCH: an amount in another unit than the budget's.";
        Unauthorized => "UNAUTHORIZED: the required key is missing, unknown, revoked or \
            expired, or the other kind of key was presented.";
        Forbidden => "FORBIDDEN or (admin plane) INSUFFICIENT_PERMISSIONS: the key lacks the \
            permission, or the resource belongs to another tenant.";
        NotFound => "NOT_FOUND (runtime plane), TENANT_NOT_FOUND or BUDGET_NOT_FOUND (admin \
            plane).";
        Conflict => "The request conflicts with the current state; `error` says how (e.g. \
            BUDGET_EXCEEDED, BUDGET_FROZEN, BUDGET_CLOSED, OVERDRAFT_LIMIT_EXCEEDED, \
            DEBT_OUTSTANDING, RESERVATION_FINALIZED, MAX_EXTENSIONS_EXCEEDED, \
            IDEMPOTENCY_MISMATCH, TENANT_CLOSED, DUPLICATE_RESOURCE, KEY_REVOKED; \
            INVALID_REQUEST for a transition that does not apply, such as freezing a frozen \
            budget).";
        Gone => "RESERVATION_EXPIRED: the reservation is past its expiry and grace period.";
        InternalError => "INTERNAL_ERROR: a broken invariant; nothing was changed.";
        Unavailable => "INTERNAL_ERROR: storage cannot take writes or the server is shutting \
            down; nothing was recorded. Retry later.";
    }

    /// 429 also says when to retry.
    pub struct TooManyRequests;

    impl<'r> ToResponse<'r> for TooManyRequests {
        fn response() -> (&'r str, RefOr<Response>) {
            let RefOr::T(mut response) = error_response(
                "LIMIT_EXCEEDED: the credential's request rate limit (when configured) is spent.",
            ) else {
                unreachable!("error_response builds an inline response");
            };
            let integer = || i64::schema();
            response.headers.insert(
                "Retry-After".into(),
                HeaderBuilder::new()
                    .schema(integer())
                    .description(Some("Seconds to wait."))
                    .build(),
            );
            response.headers.insert(
                "X-RateLimit-Reset".into(),
                HeaderBuilder::new()
                    .schema(integer())
                    .description(Some("When the bucket has a token again (Unix seconds)."))
                    .build(),
            );
            ("TooManyRequests", RefOr::T(response))
        }
    }

    /// A health probe's answer.
    #[derive(ToSchema)]
    pub struct Health {
        status: HealthStatus,
    }

    #[derive(ToSchema)]
    #[schema(rename_all = "UPPERCASE")]
    pub enum HealthStatus {
        Up,
        Down,
    }

    #[derive(IntoParams)]
    #[into_params(parameter_in = Header)]
    pub struct IdempotencyHeader {
        /// Optional; when present it must equal the body's `idempotency_key` (else 400).
        #[param(rename = "X-Idempotency-Key", min_length = 1, max_length = 256)]
        key: Option<String>,
    }

    #[derive(IntoParams)]
    #[into_params(parameter_in = Path)]
    pub struct ReservationPath {
        /// The reservation's id (1–128 characters).
        #[param(min_length = 1, max_length = 128)]
        reservation_id: String,
    }

    #[derive(IntoParams)]
    #[into_params(parameter_in = Path)]
    pub struct TenantPath {
        tenant_id: String,
    }

    #[derive(IntoParams)]
    #[into_params(parameter_in = Path)]
    pub struct KeyPath {
        key_id: String,
    }

    #[derive(IntoParams)]
    #[into_params(parameter_in = Query)]
    pub struct ListReservationsQuery {
        /// Required with the admin key. With a tenant key, must be the key's tenant (else 403).
        tenant: Option<String>,
        /// Only the reservation created with this idempotency key.
        #[param(min_length = 1, max_length = 256)]
        idempotency_key: Option<String>,
        /// Only reservations in this state (as of now: a lapsed ACTIVE one is EXPIRED).
        #[param(inline)]
        status: Option<ReservationStatus>,
        /// Only reservations whose subject has this workspace (case-insensitive).
        workspace: Option<String>,
        /// Only reservations whose subject has this app (case-insensitive).
        app: Option<String>,
        /// Only reservations whose subject has this workflow (case-insensitive).
        workflow: Option<String>,
        /// Only reservations whose subject has this agent (case-insensitive).
        agent: Option<String>,
        /// Only reservations whose subject has this toolset (case-insensitive).
        toolset: Option<String>,
        /// Created at or after (RFC 3339).
        #[param(format = DateTime)]
        from: Option<String>,
        /// Created at or before (RFC 3339).
        #[param(format = DateTime)]
        to: Option<String>,
        /// Expiring at or after (RFC 3339).
        #[param(format = DateTime)]
        expires_from: Option<String>,
        /// Expiring at or before (RFC 3339).
        #[param(format = DateTime)]
        expires_to: Option<String>,
        /// Finalized at or after (RFC 3339); excludes unfinalized reservations.
        #[param(format = DateTime)]
        finalized_from: Option<String>,
        /// Finalized at or before (RFC 3339); excludes unfinalized reservations.
        #[param(format = DateTime)]
        finalized_to: Option<String>,
        /// Defaults to created_at_ms.
        #[param(inline)]
        sort_by: Option<ReservationSortBy>,
        /// Defaults to desc.
        #[param(inline)]
        sort_dir: Option<SortDirection>,
        /// From the previous page's `next_cursor`; valid only with the same sort and filters.
        cursor: Option<String>,
        /// Page size, 1–200; defaults to 50.
        #[param(minimum = 1, maximum = 200)]
        limit: Option<u32>,
        /// Comma-separated optional projections: `metadata`, `committed_metadata`. Other
        /// tokens are ignored.
        include: Option<String>,
    }

    #[derive(IntoParams)]
    #[into_params(parameter_in = Query)]
    pub struct BalancesQuery {
        /// Must be the key's tenant (else 403). At least one of tenant, workspace, app,
        /// workflow, agent, toolset is required.
        tenant: Option<String>,
        /// Only budgets whose scope has this workspace segment (case-insensitive).
        workspace: Option<String>,
        /// Only budgets whose scope has this app segment (case-insensitive).
        app: Option<String>,
        /// Only budgets whose scope has this workflow segment (case-insensitive).
        workflow: Option<String>,
        /// Only budgets whose scope has this agent segment (case-insensitive).
        agent: Option<String>,
        /// Only budgets whose scope has this toolset segment (case-insensitive).
        toolset: Option<String>,
        /// Validated (`true` or `false`) but without effect: budgets below the named scope
        /// are always included.
        include_children: Option<bool>,
        /// From the previous page's `next_cursor`.
        cursor: Option<String>,
        /// Page size, 1–200; defaults to 50.
        #[param(minimum = 1, maximum = 200)]
        limit: Option<u32>,
    }

    #[derive(IntoParams)]
    #[into_params(parameter_in = Query)]
    pub struct BudgetListQuery {
        /// Only this tenant's budgets (admin key; a tenant key always sees its own).
        tenant_id: Option<String>,
        /// Only scopes starting with this prefix (case-insensitive).
        scope_prefix: Option<String>,
        #[param(inline)]
        unit: Option<WireUnit>,
        #[param(inline)]
        status: Option<BudgetStatus>,
        /// From the previous page's `next_cursor`.
        cursor: Option<String>,
        /// Page size, 1–200; defaults to 50.
        #[param(minimum = 1, maximum = 200)]
        limit: Option<u32>,
    }

    #[derive(IntoParams)]
    #[into_params(parameter_in = Query)]
    pub struct BudgetAddress {
        /// The budget's scope (case-insensitive).
        scope: String,
        #[param(inline)]
        unit: WireUnit,
    }

    #[derive(IntoParams)]
    #[into_params(parameter_in = Query)]
    pub struct FundQuery {
        /// Required with the admin key: the tenant the budget belongs to.
        tenant_id: Option<String>,
        /// The budget's scope (case-insensitive).
        scope: String,
        #[param(inline)]
        unit: WireUnit,
    }

    #[derive(IntoParams)]
    #[into_params(parameter_in = Path)]
    pub struct PolicyPath {
        policy_id: String,
    }

    #[derive(IntoParams)]
    #[into_params(parameter_in = Query)]
    pub struct PolicyListQuery {
        /// Required with the admin key; a tenant key always sees its own tenant's policies.
        tenant_id: Option<String>,
        /// Only policies with exactly this scope pattern.
        scope_pattern: Option<String>,
        #[param(inline)]
        status: Option<PolicyStatus>,
        /// From the previous page's `next_cursor`.
        cursor: Option<String>,
        /// Page size, 1–200; defaults to 50.
        #[param(minimum = 1, maximum = 200)]
        limit: Option<u32>,
    }

    #[derive(IntoParams)]
    #[into_params(parameter_in = Query)]
    pub struct RevokeQuery {
        /// Why the key is revoked (recorded as `revoked_reason`).
        #[param(max_length = 512)]
        reason: Option<String>,
    }

    #[utoipa::path(
        get, path = "/actuator/health", tag = "Operations", operation_id = "health",
        summary = "Health: UP when the store can take writes",
        responses(
            (status = 200, description = "UP", body = Health),
            (status = 503, description = "DOWN: the store cannot take writes", body = Health),
        ),
    )]
    pub fn health() {}

    #[utoipa::path(
        get, path = "/actuator/health/liveness", tag = "Operations", operation_id = "liveness",
        summary = "Liveness: the process answers",
        responses((status = 200, description = "UP", body = Health)),
    )]
    pub fn liveness() {}

    #[utoipa::path(
        get, path = "/actuator/health/readiness", tag = "Operations", operation_id = "readiness",
        summary = "Readiness: UP when the store can take writes",
        responses(
            (status = 200, description = "UP", body = Health),
            (status = 503, description = "DOWN: the store cannot take writes", body = Health),
        ),
    )]
    pub fn readiness() {}

    #[utoipa::path(
        get, path = "/metrics", tag = "Operations", operation_id = "metrics",
        summary = "Prometheus metrics",
        description = "Requests by route and status with their latency, the store's counters \
            and process memory. Requires the admin key unless the operator made metrics public.",
        responses(
            (status = 200, description = "The Prometheus text exposition format",
                body = String, content_type = "text/plain; version=0.0.4"),
            (status = 401, response = Unauthorized),
        ),
        security(("AdminKeyAuth" = []), ()),
    )]
    pub fn metrics() {}

    #[utoipa::path(
        get, path = "/openapi.json", tag = "Operations", operation_id = "openapi",
        summary = "This document",
        description = "Swagger UI for it is served at /swagger-ui/.",
        responses((status = 200, description = "The OpenAPI 3.1 document",
            body = Object, content_type = "application/json")),
    )]
    pub fn openapi_json() {}

    #[utoipa::path(
        post, path = "/v1/reservations", tag = "Reservations", operation_id = "createReservation",
        summary = "Reserve an estimate on every budget the subject names",
        description = "Holds `estimate` on the budget of every scope derived from the subject \
            (tenant › workspace › app › workflow › agent › toolset) that has one in that unit. \
            A refusal is an error (409, or 404 when no budget exists); with `dry_run` it is a \
            200 DENY with a `reason_code`, and nothing is held. Answers carry a `Date` header.",
        params(IdempotencyHeader),
        request_body = ReservationCreateRequest,
        responses(
            (status = 200, description = "Reserved (or, with dry_run, evaluated)",
                body = ReservationCreateResponse, headers(("X-Cycles-Tenant" = String))),
            (status = 400, response = BadRequest),
            (status = 403, response = Forbidden),
            (status = 404, response = NotFound),
            (status = 409, response = Conflict),
        ),
        security(("ApiKeyAuth" = [])),
    )]
    pub fn create_reservation() {}

    #[utoipa::path(
        get, path = "/v1/reservations", tag = "Reservations", operation_id = "listReservations",
        summary = "List a tenant's reservations",
        description = "Filtered and ordered; pages continue with `cursor`. A page may come back \
            short, with `has_more`, when few rows match.",
        params(ListReservationsQuery),
        responses(
            (status = 200, description = "A page of reservations",
                body = ReservationListResponse, headers(("X-Cycles-Tenant" = String))),
            (status = 400, response = BadRequest),
            (status = 403, response = Forbidden),
        ),
        security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
    )]
    pub fn list_reservations() {}

    #[utoipa::path(
        get, path = "/v1/reservations/{reservation_id}", tag = "Reservations",
        operation_id = "getReservation",
        summary = "Read one reservation",
        params(ReservationPath),
        responses(
            (status = 200, description = "The reservation", body = ReservationDetail,
                headers(("X-Cycles-Tenant" = String))),
            (status = 400, response = BadRequest),
            (status = 403, response = Forbidden),
            (status = 404, response = NotFound),
            (status = 410, response = Gone),
        ),
        security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
    )]
    pub fn get_reservation() {}

    #[utoipa::path(
        post, path = "/v1/reservations/{reservation_id}/commit", tag = "Reservations",
        operation_id = "commitReservation",
        summary = "Charge the actual amount; the unused part flows back",
        description = "An actual above the estimate is charged under the reservation's overage \
            policy (REJECT: 409 BUDGET_EXCEEDED; ALLOW_IF_AVAILABLE: up to what is available; \
            ALLOW_WITH_OVERDRAFT: into debt up to the overdraft limit).",
        params(ReservationPath, IdempotencyHeader),
        request_body = CommitRequest,
        responses(
            (status = 200, description = "Committed", body = CommitResponse,
                headers(("X-Cycles-Tenant" = String))),
            (status = 400, response = BadRequest),
            (status = 403, response = Forbidden),
            (status = 404, response = NotFound),
            (status = 409, response = Conflict),
            (status = 410, response = Gone),
        ),
        security(("ApiKeyAuth" = [])),
    )]
    pub fn commit_reservation() {}

    #[utoipa::path(
        post, path = "/v1/reservations/{reservation_id}/release", tag = "Reservations",
        operation_id = "releaseReservation",
        summary = "Release the whole hold",
        params(ReservationPath, IdempotencyHeader),
        request_body = ReleaseRequest,
        responses(
            (status = 200, description = "Released", body = ReleaseResponse,
                headers(("X-Cycles-Tenant" = String))),
            (status = 400, response = BadRequest),
            (status = 403, response = Forbidden),
            (status = 404, response = NotFound),
            (status = 409, response = Conflict),
            (status = 410, response = Gone),
        ),
        security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
    )]
    pub fn release_reservation() {}

    #[utoipa::path(
        post, path = "/v1/reservations/{reservation_id}/extend", tag = "Reservations",
        operation_id = "extendReservation",
        summary = "Move an active reservation's expiry later",
        description = "At most the tenant's `max_reservation_extensions` times (then 409 \
            MAX_EXTENSIONS_EXCEEDED). Answers carry a `Date` header.",
        params(ReservationPath, IdempotencyHeader),
        request_body = ReservationExtendRequest,
        responses(
            (status = 200, description = "Extended", body = ReservationExtendResponse,
                headers(("X-Cycles-Tenant" = String))),
            (status = 400, response = BadRequest),
            (status = 403, response = Forbidden),
            (status = 404, response = NotFound),
            (status = 409, response = Conflict),
            (status = 410, response = Gone),
        ),
        security(("ApiKeyAuth" = [])),
    )]
    pub fn extend_reservation() {}

    #[utoipa::path(
        post, path = "/v1/decide", tag = "Decisions", operation_id = "decide",
        summary = "Would this spend be admitted?",
        description = "Evaluates like a reservation without holding anything: a refusal is a \
            200 DENY with a `reason_code`.",
        params(IdempotencyHeader),
        request_body = DecisionRequest,
        responses(
            (status = 200, description = "The decision", body = DecisionResponse,
                headers(("X-Cycles-Tenant" = String))),
            (status = 400, response = BadRequest),
            (status = 403, response = Forbidden),
            (status = 409, response = Conflict),
        ),
        security(("ApiKeyAuth" = [])),
    )]
    pub fn decide() {}

    #[utoipa::path(
        post, path = "/v1/events", tag = "Events", operation_id = "createEvent",
        summary = "Charge spend that already happened",
        description = "Charged under `overage_policy` like a commit without a reservation; not \
            blocked by debt or an over-limit budget.",
        params(IdempotencyHeader),
        request_body = EventCreateRequest,
        responses(
            (status = 201, description = "Applied", body = EventCreateResponse,
                headers(("X-Cycles-Tenant" = String))),
            (status = 400, response = BadRequest),
            (status = 403, response = Forbidden),
            (status = 404, response = NotFound),
            (status = 409, response = Conflict),
        ),
        security(("ApiKeyAuth" = [])),
    )]
    pub fn create_event() {}

    #[utoipa::path(
        get, path = "/v1/balances", tag = "Balances", operation_id = "getBalances",
        summary = "The balances of the key's tenant's budgets",
        params(BalancesQuery),
        responses(
            (status = 200, description = "A page of balances", body = BalanceResponse,
                headers(("X-Cycles-Tenant" = String))),
            (status = 400, response = BadRequest),
            (status = 403, response = Forbidden),
        ),
        security(("ApiKeyAuth" = [])),
    )]
    pub fn get_balances() {}

    #[utoipa::path(
        post, path = "/v1/admin/tenants", tag = "Tenants", operation_id = "createTenant",
        summary = "Create a tenant",
        request_body = TenantCreateRequest,
        responses(
            (status = 201, description = "Created", body = TenantResponse),
            (status = 200, description = "A tenant with this id and name already exists: it is \
                returned unchanged", body = TenantResponse),
            (status = 400, response = BadRequest),
            (status = 409, response = Conflict),
        ),
        security(("AdminKeyAuth" = [])),
    )]
    pub fn create_tenant() {}

    #[utoipa::path(
        get, path = "/v1/admin/tenants/{tenant_id}", tag = "Tenants", operation_id = "getTenant",
        summary = "Read a tenant",
        params(TenantPath),
        responses(
            (status = 200, description = "The tenant", body = TenantResponse),
            (status = 404, response = NotFound),
        ),
        security(("AdminKeyAuth" = [])),
    )]
    pub fn get_tenant() {}

    #[utoipa::path(
        patch, path = "/v1/admin/tenants/{tenant_id}", tag = "Tenants",
        operation_id = "updateTenant",
        summary = "Update a tenant (status, name, metadata, reservation defaults)",
        params(TenantPath),
        request_body = TenantUpdateRequest,
        responses(
            (status = 200, description = "The updated tenant", body = TenantResponse),
            (status = 400, response = BadRequest),
            (status = 404, response = NotFound),
        ),
        security(("AdminKeyAuth" = [])),
    )]
    pub fn update_tenant() {}

    #[utoipa::path(
        post, path = "/v1/admin/api-keys", tag = "API Keys", operation_id = "createApiKey",
        summary = "Issue an API key for a tenant",
        request_body = ApiKeyCreateRequest,
        responses(
            (status = 201, description = "Created; `key_secret` is shown only now",
                body = ApiKeyCreateResponse),
            (status = 400, response = BadRequest),
            (status = 404, response = NotFound),
            (status = 409, response = Conflict),
        ),
        security(("AdminKeyAuth" = [])),
    )]
    pub fn create_api_key() {}

    #[utoipa::path(
        delete, path = "/v1/admin/api-keys/{key_id}", tag = "API Keys",
        operation_id = "revokeApiKey",
        summary = "Revoke an API key",
        params(KeyPath, RevokeQuery),
        responses(
            (status = 200, description = "The revoked key", body = ApiKeyResponse),
            (status = 400, response = BadRequest),
            (status = 404, response = NotFound),
            (status = 409, response = Conflict),
        ),
        security(("AdminKeyAuth" = [])),
    )]
    pub fn revoke_api_key() {}

    #[utoipa::path(
        post, path = "/v1/admin/budgets", tag = "Budgets", operation_id = "createBudget",
        summary = "Create a budget",
        request_body = BudgetCreateRequest,
        responses(
            (status = 201, description = "Created", body = BudgetLedger,
                headers(("X-Cycles-Tenant" = String))),
            (status = 400, response = BadRequest),
            (status = 403, response = Forbidden),
            (status = 404, response = NotFound),
            (status = 409, response = Conflict),
        ),
        security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
    )]
    pub fn create_budget() {}

    #[utoipa::path(
        get, path = "/v1/admin/budgets", tag = "Budgets", operation_id = "listBudgets",
        summary = "List budgets",
        description = "In (scope, unit) order. With the admin key and no `tenant_id`, every \
            tenant's budgets are listed.",
        params(BudgetListQuery),
        responses(
            (status = 200, description = "A page of budgets", body = BudgetListResponse,
                headers(("X-Cycles-Tenant" = String))),
            (status = 400, response = BadRequest),
            (status = 403, response = Forbidden),
        ),
        security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
    )]
    pub fn list_budgets() {}

    #[utoipa::path(
        patch, path = "/v1/admin/budgets", tag = "Budgets", operation_id = "updateBudget",
        summary = "Update a budget's overdraft limit, overage policy or metadata",
        params(BudgetAddress),
        request_body = BudgetUpdateRequest,
        responses(
            (status = 200, description = "The updated budget", body = BudgetLedger),
            (status = 400, response = BadRequest),
            (status = 404, response = NotFound),
            (status = 409, response = Conflict),
        ),
        security(("AdminKeyAuth" = [])),
    )]
    pub fn update_budget() {}

    #[utoipa::path(
        get, path = "/v1/admin/budgets/lookup", tag = "Budgets", operation_id = "lookupBudget",
        summary = "Read one budget by (scope, unit)",
        params(BudgetAddress),
        responses(
            (status = 200, description = "The budget", body = BudgetLedger,
                headers(("X-Cycles-Tenant" = String))),
            (status = 400, response = BadRequest),
            (status = 403, response = Forbidden),
            (status = 404, response = NotFound),
        ),
        security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
    )]
    pub fn lookup_budget() {}

    #[utoipa::path(
        post, path = "/v1/admin/budgets/fund", tag = "Budgets", operation_id = "fundBudget",
        summary = "Credit, debit, reset or repay a budget",
        params(FundQuery),
        request_body = BudgetFundingRequest,
        responses(
            (status = 200, description = "Funded", body = BudgetFundingResponse,
                headers(("X-Cycles-Tenant" = String))),
            (status = 400, response = BadRequest),
            (status = 403, response = Forbidden),
            (status = 404, response = NotFound),
            (status = 409, response = Conflict),
        ),
        security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
    )]
    pub fn fund_budget() {}

    #[utoipa::path(
        post, path = "/v1/admin/budgets/freeze", tag = "Budgets", operation_id = "freezeBudget",
        summary = "Freeze an ACTIVE budget: new reservations on it are refused",
        params(BudgetAddress),
        request_body(content = Option<BudgetStatusTransitionRequest>,
            description = "Optional; may be empty."),
        responses(
            (status = 200, description = "The frozen budget", body = BudgetLedger),
            (status = 400, response = BadRequest),
            (status = 404, response = NotFound),
            (status = 409, response = Conflict),
        ),
        security(("AdminKeyAuth" = [])),
    )]
    pub fn freeze_budget() {}

    #[utoipa::path(
        post, path = "/v1/admin/budgets/unfreeze", tag = "Budgets",
        operation_id = "unfreezeBudget",
        summary = "Unfreeze a FROZEN budget",
        params(BudgetAddress),
        request_body(content = Option<BudgetStatusTransitionRequest>,
            description = "Optional; may be empty."),
        responses(
            (status = 200, description = "The active budget", body = BudgetLedger),
            (status = 400, response = BadRequest),
            (status = 404, response = NotFound),
            (status = 409, response = Conflict),
        ),
        security(("AdminKeyAuth" = [])),
    )]
    pub fn unfreeze_budget() {}

    #[utoipa::path(
        post, path = "/v1/admin/policies", tag = "Policies", operation_id = "createPolicy",
        summary = "Create a policy for a scope pattern",
        request_body = PolicyCreateRequest,
        responses(
            (status = 201, description = "Created", body = PolicyResponse,
                headers(("X-Cycles-Tenant" = String))),
            (status = 400, response = BadRequest),
            (status = 403, response = Forbidden),
            (status = 404, response = NotFound),
            (status = 409, response = Conflict),
        ),
        security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
    )]
    pub fn create_policy() {}

    #[utoipa::path(
        get, path = "/v1/admin/policies", tag = "Policies", operation_id = "listPolicies",
        summary = "List a tenant's policies",
        params(PolicyListQuery),
        responses(
            (status = 200, description = "A page of policies", body = PolicyListResponse,
                headers(("X-Cycles-Tenant" = String))),
            (status = 400, response = BadRequest),
            (status = 403, response = Forbidden),
            (status = 404, response = NotFound),
        ),
        security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
    )]
    pub fn list_policies() {}

    #[utoipa::path(
        patch, path = "/v1/admin/policies/{policy_id}", tag = "Policies",
        operation_id = "updatePolicy",
        summary = "Update a policy",
        params(PolicyPath),
        request_body = PolicyUpdateRequest,
        responses(
            (status = 200, description = "The updated policy", body = PolicyResponse,
                headers(("X-Cycles-Tenant" = String))),
            (status = 400, response = BadRequest),
            (status = 403, response = Forbidden),
            (status = 404, response = NotFound),
            (status = 409, response = Conflict),
        ),
        security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
    )]
    pub fn update_policy() {}
}
