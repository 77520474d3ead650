//! The OpenAPI 3.1 document this server serves at `GET /openapi.json`, and Swagger UI at
//! `/swagger-ui/`. The UI's assets are compiled into the binary (`utoipa-swagger-ui` with its
//! `vendored` feature): nothing is downloaded, at build time or at run time.
//!
//! Each operation is declared once, by the `#[utoipa::path]` attribute on its handler; the
//! router and this document are both built from those declarations (`routes::operations`).
//! Schemas and parameters are derived from the `protocol` types, the crate that owns the wire
//! format. This module adds what is not an operation: the document's description, tags and
//! security schemes, the error responses operations share, and the few rewrites of the
//! generated document that utoipa cannot express (each says why). `tests/it/openapi.rs` holds the
//! document to the router and validates real responses against the schemas.

use std::collections::BTreeMap;
use std::marker::PhantomData;

use axum::Router;
use protocol::{ErrorBody, MAX_BODY_BYTES};
use serde_json::{json, Map, Value};
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::response::{Response as ResponseDoc, ResponseBuilder};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi as Document, Ref, RefOr, Schema};
use utoipa::{IntoResponses, Modify, OpenApi, PartialSchema, ToResponse, ToSchema};
use utoipa_swagger_ui::{Config, SwaggerUi};

/// Where the document is served.
pub const OPENAPI_PATH: &str = "/openapi.json";
/// Where Swagger UI is served (`/swagger-ui` redirects to `/swagger-ui/`).
pub const SWAGGER_UI_PATH: &str = "/swagger-ui";

/// Swagger UI, reading the document from [`OPENAPI_PATH`]. Public, like the document: they
/// reveal nothing a client of the protocol does not already know. Not an API operation, so
/// not in the document.
pub fn ui<S: Clone + Send + Sync + 'static>() -> Router<S> {
    SwaggerUi::new(SWAGGER_UI_PATH)
        .config(Config::from(OPENAPI_PATH))
        .into()
}

const DESCRIPTION: &str = "\
The Cycles budget authority: reserve an estimate against every budget a subject names, then \
commit the actual amount or release the hold.

* **Auth.** Runtime operations take a tenant API key in `X-Cycles-API-Key`; the admin plane \
takes the operator's key in `X-Admin-API-Key`. Operations that list both accept either; when \
`X-Admin-API-Key` is present it must be valid and is the one used.
* **Errors.** Every error body is an `ErrorResponse`. Unknown routes answer 404 NOT_FOUND, \
wrong methods 405 INVALID_REQUEST, bodies over {max_body_bytes} bytes 400 INVALID_REQUEST, \
bodies that do not arrive in time 408 INVALID_REQUEST. Any `/v1` operation can answer 429 \
LIMIT_EXCEEDED with `Retry-After` when its key is over its rate (if rate limiting is \
configured) or has its share of requests in flight; a reserve or commit, when the policy \
governing its scope has counted its `rate_limits` for the clock minute. When the server has \
its maximum of requests in flight, 503 INTERNAL_ERROR with `Retry-After`; when storage \
cannot take writes, 503 INTERNAL_ERROR (nothing was recorded).
* **Correlation.** Every response carries `X-Request-Id` and `X-Cycles-Trace-Id` (taken from \
a valid `traceparent`, else a valid inbound `X-Cycles-Trace-Id`, else generated).
* **Bodies.** Request bodies reject unknown fields. Response bodies carry exactly the fields \
documented and never `null` (an absent optional field is omitted). On input, no field is \
nullable: omit it instead (an explicit `null` is 400 INVALID_REQUEST; open `metadata` objects \
may hold anything).
* **Query parameters** not documented here are ignored; documented ones are validated. A \
scalar parameter given twice or given empty (`?limit=1&limit=2`, `?to=`) is 400 \
INVALID_REQUEST naming it; a list parameter (`include`) takes a comma-separated list, and may \
be repeated.
* **Idempotency.** Write operations with an `idempotency_key` replay the original response for \
the same key and body, and answer 409 IDEMPOTENCY_MISMATCH for the same key with another body.";

#[derive(OpenApi)]
#[openapi(
    info(title = "Cycles", description = DESCRIPTION, license(name = "Apache-2.0")),
    components(
        // Referenced by the shared error responses, which utoipa does not walk.
        schemas(ErrorBody),
        responses(
            BadRequest,
            Unauthorized,
            Forbidden,
            NotFound,
            Conflict,
            Gone,
            TooManyRequests,
            InternalError,
            Unavailable,
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

/// The document, as served: `operations`, the declarations of every routed operation (the
/// route table collects them), with this module's description, tags, security schemes and
/// shared responses.
pub fn document(operations: Document) -> Value {
    let mut api = ApiDoc::openapi();
    api.merge(operations);
    let mut doc = serde_json::to_value(api)
        .expect("the OpenAPI document is plain data: it always serializes");
    // The body limit is a number of `protocol`'s: a `const` string cannot be formatted with it.
    doc["info"]["description"] = DESCRIPTION
        .replace("{max_body_bytes}", &MAX_BODY_BYTES.to_string())
        .into();
    without_null(&mut doc);
    closed_objects(&mut doc);
    shared_headers(&mut doc);
    overlapping_forms(&mut doc);
    doc
}

/// The schemas of `#[serde(untagged)]` enums, whose forms can coincide.
const UNTAGGED: [&str; 1] = ["Balances"];

/// An answer in either of two forms matches both when they coincide (an empty page of
/// `GET /v1/balances` is `{"balances":[],"has_more":false}` in both), which `oneOf` forbids:
/// the forms of an untagged enum are `anyOf`.
///
/// Why a rewrite: utoipa renders every untagged enum as `oneOf`, with no attribute to say
/// otherwise.
fn overlapping_forms(doc: &mut Value) {
    for name in UNTAGGED {
        let Some(schema) = doc["components"]["schemas"][name].as_object_mut() else {
            continue;
        };
        if let Some(forms) = schema.remove("oneOf") {
            schema.insert("anyOf".into(), forms);
        }
    }
}

/// Neither requests nor responses carry `null`: drops the `null` alternative utoipa
/// gives every `Option` field, so the schemas say what the server emits.
///
/// Why a rewrite: utoipa's only opt-out is `#[schema(nullable = false)]` on each field, and
/// the rule is global; one pass keeps every present and future `Option` field honest.
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
///
/// Why a rewrite: utoipa closes an object only for `#[serde(deny_unknown_fields)]`, which
/// the request types carry; response types only serialize, and utoipa has no attribute that
/// closes their schemas.
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
///
/// Why a rewrite: utoipa's model has no `components.headers`, and a response's headers are
/// inline, never `$ref`s.
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

fn error_response(description: &str) -> RefOr<ResponseDoc> {
    let body = ContentBuilder::new()
        .schema(Some(RefOr::<Schema>::Ref(Ref::from_schema_name(
            <ErrorBody as ToSchema>::name(),
        ))))
        .build();
    ResponseBuilder::new()
        .description(description)
        .content("application/json", body)
        .into()
}

/// A shared error response (in `components.responses`) and the status it answers with.
pub trait ErrorResponse: ToResponse<'static> {
    const STATUS: &'static str;
}

/// Shared error responses: `name = "status" => "description"`.
macro_rules! error_responses {
    ($($name:ident = $status:literal => $description:expr;)*) => {$(
        pub struct $name;

        impl<'r> ToResponse<'r> for $name {
            fn response() -> (&'r str, RefOr<ResponseDoc>) {
                (stringify!($name), error_response($description))
            }
        }

        impl ErrorResponse for $name {
            const STATUS: &'static str = $status;
        }
    )*};
}

error_responses! {
    BadRequest = "400" => "INVALID_REQUEST: a malformed or oversized body, an unknown or invalid \
        field, an invalid path or query parameter, or a request the current state does not \
        allow; UNIT_MISMATCH: an amount in another unit than the budget's.";
    Unauthorized = "401" => "UNAUTHORIZED: the required key is missing, unknown, revoked or \
        expired, or the other kind of key was presented.";
    Forbidden = "403" => "FORBIDDEN or (admin plane) INSUFFICIENT_PERMISSIONS: the key lacks the \
        permission, or the resource belongs to another tenant.";
    NotFound = "404" => "NOT_FOUND (runtime plane), TENANT_NOT_FOUND or BUDGET_NOT_FOUND (admin \
        plane).";
    Conflict = "409" => "The request conflicts with the current state; `error` says how (e.g. \
        BUDGET_EXCEEDED, BUDGET_FROZEN, BUDGET_CLOSED, OVERDRAFT_LIMIT_EXCEEDED, \
        DEBT_OUTSTANDING, RESERVATION_FINALIZED, MAX_EXTENSIONS_EXCEEDED, \
        IDEMPOTENCY_MISMATCH, TENANT_CLOSED, DUPLICATE_RESOURCE, KEY_REVOKED; \
        INVALID_REQUEST for a transition that does not apply, such as freezing a frozen \
        budget).";
    Gone = "410" => "RESERVATION_EXPIRED: the reservation is past its expiry and grace period.";
    InternalError = "500" => "INTERNAL_ERROR: a broken invariant; nothing was changed.";
    Unavailable = "503" => "INTERNAL_ERROR: storage cannot take writes (reads are still \
        served) or the server is shutting down; nothing was recorded. Retry later (storage \
        says when in `Retry-After`).";
}

/// 429 also says when to retry.
pub struct TooManyRequests;

impl<'r> ToResponse<'r> for TooManyRequests {
    fn response() -> (&'r str, RefOr<ResponseDoc>) {
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

impl ErrorResponse for TooManyRequests {
    const STATUS: &'static str = "429";
}

/// The error answers of a `/v1` operation, listed in its `responses` as
/// `Errors<(BadRequest, NotFound, ..)>`: the ones named, and those every `/v1` operation can
/// give whatever it does: a bad or missing key (401), throttling when rate limiting is on
/// (429), a broken invariant (500) and storage that cannot take writes (503).
pub struct Errors<T>(PhantomData<T>);

/// A reference to a shared response, by its status.
fn reference<R: ErrorResponse>() -> (String, RefOr<ResponseDoc>) {
    (
        R::STATUS.to_string(),
        RefOr::Ref(Ref::from_response_name(R::response().0)),
    )
}

macro_rules! errors_of {
    ($($named:ident),*) => {
        impl<$($named: ErrorResponse),*> IntoResponses for Errors<($($named,)*)> {
            fn responses() -> BTreeMap<String, RefOr<ResponseDoc>> {
                BTreeMap::from_iter([
                    $(reference::<$named>(),)*
                    reference::<Unauthorized>(),
                    reference::<TooManyRequests>(),
                    reference::<InternalError>(),
                    reference::<Unavailable>(),
                ])
            }
        }
    };
}

errors_of!();
errors_of!(A);
errors_of!(A, B);
errors_of!(A, B, C);
errors_of!(A, B, C, D);
errors_of!(A, B, C, D, E);
