//! The served OpenAPI document describes the server as it is: every route the router
//! registers is documented with its methods and security, real response bodies (and the
//! request bodies that produced them) validate against the document's own schemas, and
//! Swagger UI is served from the binary.

use std::collections::BTreeSet;

use crate::common::{reserve_body, As, Engine, Resp, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

engine_tests!(
    every_route_is_documented,
    documented_security_is_enforced,
    real_bodies_match_the_schemas,
    swagger_ui_is_served,
);

/// Where the server's sources are: the single source of truth for what is routed.
const SOURCES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

/// `/v1/reservations/{id}` and `/v1/reservations/{reservation_id}` are the same route.
fn normalize(path: &str) -> String {
    path.split('/')
        .map(|seg| if seg.starts_with('{') { "{}" } else { seg })
        .collect::<Vec<_>>()
        .join("/")
}

/// A concrete path for a template: every parameter is `probe`.
fn probe_path(template: &str) -> String {
    template
        .split('/')
        .map(|seg| if seg.starts_with('{') { "probe" } else { seg })
        .collect::<Vec<_>>()
        .join("/")
}

/// Whether `call(` appears in `code` as a call of that name (not a suffix of another name).
fn calls(code: &str, name: &str) -> bool {
    let needle = format!("{name}(");
    code.match_indices(&needle).any(|(at, _)| {
        code[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
    })
}

/// Every `.rs` file under `dir`, read.
fn read_sources(dir: &std::path::Path) -> Vec<String> {
    let mut sources = Vec::new();
    for entry in std::fs::read_dir(dir).expect("the server's sources") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources.extend(read_sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            sources.push(std::fs::read_to_string(&path).expect("a source file"));
        }
    }
    sources
}

/// Every `opening` call in `source` (`opening` ends with `(`): its arguments, and the source
/// after it.
fn call_arguments<'a>(source: &'a str, opening: &str) -> Vec<(&'a str, &'a str)> {
    let mut calls = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find(opening) {
        rest = &rest[at + opening.len()..];
        let mut depth = 1;
        let end = rest
            .char_indices()
            .find_map(|(i, c)| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                (depth == 0).then_some(i)
            })
            .unwrap_or_else(|| panic!("unbalanced {opening}"));
        calls.push((&rest[..end], &rest[end..]));
    }
    calls
}

/// The first string literal in `code`.
fn literal(code: &str) -> &str {
    code.split('"').nth(1).expect("a string literal")
}

/// Each handler's declared `(METHOD, normalized path)`, by the handler's name: from the
/// `#[utoipa::path(method, path = "..", ..)]` attribute on it.
fn declarations(source: &str) -> Vec<(String, (String, String))> {
    let mut declared = Vec::new();
    for (args, after) in call_arguments(source, "#[utoipa::path(") {
        let method = args.split(',').next().unwrap_or_default().trim();
        let path = literal(&args[args.find("path =").expect("a declared path")..]);
        let name = after[after.find("fn ").expect("the declared handler") + 3..]
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .next()
            .unwrap_or_default();
        declared.push((name.to_string(), (method.to_uppercase(), normalize(path))));
    }
    declared
}

/// The `(METHOD, normalized path)` pairs the sources route: every handler registered with
/// `routes!(..)`, by its declaration, and every plain `.route(path, method(..))`. (Swagger
/// UI is merged in whole: it is no API operation.)
fn routes_in_source(sources: &[String]) -> BTreeSet<(String, String)> {
    let declared: Vec<_> = sources.iter().flat_map(|s| declarations(s)).collect();
    let mut routes = BTreeSet::new();
    for source in sources {
        for (args, _) in call_arguments(source, "routes!(") {
            for handler in args.split(',').map(str::trim).filter(|h| !h.is_empty()) {
                let name = handler.rsplit("::").next().unwrap_or_default();
                let (_, route) = declared
                    .iter()
                    .find(|(n, _)| n == name)
                    .unwrap_or_else(|| panic!("routes!({handler}) without a declaration"));
                routes.insert(route.clone());
            }
        }
        for (args, _) in call_arguments(source, ".route(") {
            let path = literal(args);
            let methods: Vec<&str> = METHODS
                .into_iter()
                .filter(|m| calls(args, &m.to_lowercase()))
                .collect();
            assert!(!methods.is_empty(), "no method found for route {path}");
            for m in methods {
                routes.insert((m.to_string(), normalize(path)));
            }
        }
    }
    routes
}

/// The served document and lookups into it.
struct Doc(Value);

impl Doc {
    async fn fetch(s: &TestServer) -> Doc {
        let r = s.get("/openapi.json", As::Nobody).await;
        assert_eq!(r.status, 200, "GET /openapi.json: {}", r.body);
        assert!(
            r.header("content-type")
                .is_some_and(|c| c.starts_with("application/json")),
            "content type {:?}",
            r.header("content-type")
        );
        assert!(
            r.body["openapi"]
                .as_str()
                .is_some_and(|v| v.starts_with("3.1")),
            "not OpenAPI 3.1: {}",
            r.body["openapi"]
        );
        Doc(r.body.clone())
    }

    /// Every documented `(METHOD, template)`.
    fn operations(&self) -> Vec<(String, String)> {
        let paths = self.0["paths"].as_object().expect("paths");
        paths
            .iter()
            .flat_map(|(path, item)| {
                item.as_object()
                    .expect("path item")
                    .keys()
                    .filter(|m| METHODS.contains(&m.to_uppercase().as_str()))
                    .map(move |m| (m.to_uppercase(), path.clone()))
            })
            .collect()
    }

    fn operation(&self, method: &str, template: &str) -> &Value {
        let op = &self.0["paths"][template][method.to_lowercase()];
        assert!(op.is_object(), "{method} {template} is not documented");
        op
    }

    /// The documented path template a concrete path matches (literal segments win).
    fn template(&self, path: &str) -> String {
        let path = path.split('?').next().unwrap_or_default();
        let segments: Vec<&str> = path.split('/').collect();
        self.0["paths"]
            .as_object()
            .expect("paths")
            .keys()
            .filter_map(|t| {
                let ts: Vec<&str> = t.split('/').collect();
                let fits = ts.len() == segments.len()
                    && ts
                        .iter()
                        .zip(&segments)
                        .all(|(t, s)| t.starts_with('{') || t == s);
                fits.then(|| (ts.iter().filter(|t| !t.starts_with('{')).count(), t))
            })
            .max()
            .map(|(_, t)| t.clone())
            .unwrap_or_else(|| panic!("{path} matches no documented path"))
    }

    /// Follows a local `$ref` (`#/components/...`), if `v` is one.
    fn resolve<'a>(&'a self, v: &'a Value) -> &'a Value {
        match v["$ref"].as_str() {
            Some(r) => self
                .0
                .pointer(r.trim_start_matches('#'))
                .unwrap_or_else(|| panic!("dangling $ref {r}")),
            None => v,
        }
    }

    /// The JSON schema documented for a response, or `None` when it has no JSON body.
    fn response_schema(&self, method: &str, template: &str, status: u16) -> Option<Value> {
        let op = self.operation(method, template);
        let response = op["responses"]
            .get(status.to_string())
            .unwrap_or_else(|| panic!("{method} {template}: status {status} is not documented"));
        let response = self.resolve(response);
        response["content"]
            .get("application/json")
            .map(|c| c["schema"].clone())
    }

    fn request_schema(&self, method: &str, template: &str) -> Value {
        let body = &self.operation(method, template)["requestBody"];
        assert!(
            body.is_object(),
            "{method} {template} sent a body but documents none"
        );
        body["content"]["application/json"]["schema"].clone()
    }

    /// The ways `instance` breaks `schema` (refs resolved into this document).
    fn errors(&self, schema: &Value, instance: &Value) -> Vec<String> {
        let mut root = schema.clone();
        root["components"] = self.0["components"].clone();
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .should_validate_formats(true)
            .build(&root)
            .unwrap_or_else(|e| panic!("invalid schema {schema}: {e}"));
        validator
            .iter_errors(instance)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect()
    }

    #[track_caller]
    fn validate(&self, what: &str, schema: &Value, instance: &Value) {
        let errors = self.errors(schema, instance);
        assert!(
            errors.is_empty(),
            "{what} does not match its schema {schema}:\n{}\nbody: {instance}",
            errors.join("\n")
        );
    }
}

async fn every_route_is_documented(engine: Engine) {
    let s = TestServer::start(engine).await;
    let doc = Doc::fetch(&s).await;

    let routed = routes_in_source(&read_sources(std::path::Path::new(SOURCES)));
    let documented: BTreeSet<(String, String)> = doc
        .operations()
        .into_iter()
        .map(|(m, p)| (m, normalize(&p)))
        .collect();
    let undocumented: Vec<_> = routed.difference(&documented).collect();
    let unrouted: Vec<_> = documented.difference(&routed).collect();
    assert!(
        undocumented.is_empty() && unrouted.is_empty(),
        "routed but not documented: {undocumented:?}\ndocumented but not routed: {unrouted:?}"
    );

    // And the live router agrees: every documented operation is routed, and every other
    // method on a documented path is 405.
    let paths: BTreeSet<String> = doc.operations().into_iter().map(|(_, p)| p).collect();
    for template in paths {
        let concrete = probe_path(&template);
        for method in METHODS {
            let r = s
                .send(
                    Method::from_bytes(method.as_bytes()).unwrap(),
                    &concrete,
                    As::Nobody,
                    None,
                )
                .await;
            let documented = doc.0["paths"][&template]
                .get(method.to_lowercase())
                .is_some();
            let routed = r.status != 405 && r.body["message"] != "No such endpoint";
            assert_eq!(
                routed, documented,
                "{method} {concrete}: documented {documented}, answered {} {}",
                r.status, r.body
            );
        }
    }
    s.stop().await;
}

/// Which credentials an operation's `security` admits: (none, admin key, tenant key).
fn admitted(op: &Value) -> (bool, bool, bool) {
    let Some(requirements) = op["security"].as_array() else {
        return (true, true, true);
    };
    let any = |scheme: Option<&str>| {
        requirements.iter().any(|r| {
            let r = r.as_object().expect("security requirement");
            match scheme {
                None => r.is_empty(),
                Some(s) => r.contains_key(s),
            }
        })
    };
    (
        any(None),
        any(Some("AdminKeyAuth")),
        any(Some("ApiKeyAuth")),
    )
}

async fn documented_security_is_enforced(engine: Engine) {
    let s = TestServer::start(engine).await;
    let key = s.setup("acme", 1_000_000).await;
    let doc = Doc::fetch(&s).await;
    let schemes = doc.0["components"]["securitySchemes"]
        .as_object()
        .expect("security schemes");
    assert_eq!(
        schemes["ApiKeyAuth"],
        json!({"type": "apiKey", "in": "header", "name": "X-Cycles-API-Key",
               "description": schemes["ApiKeyAuth"]["description"]})
    );
    assert_eq!(schemes["AdminKeyAuth"]["name"], "X-Admin-API-Key");

    for (method, template) in doc.operations() {
        let op = doc.operation(&method, &template).clone();
        if template.starts_with("/v1/") {
            assert!(
                op["security"].as_array().is_some_and(|r| !r.is_empty()),
                "{method} {template} documents no security"
            );
        }
        for requirement in op["security"].as_array().into_iter().flatten() {
            for scheme in requirement.as_object().expect("requirement").keys() {
                assert!(schemes.contains_key(scheme), "unknown scheme {scheme}");
            }
        }
        let concrete = probe_path(&template);
        let (nobody, admin, tenant) = admitted(&op);
        // An anonymous alternative (`{}`) next to a key depends on the operator's
        // configuration (public metrics): then only the listed keys are checked.
        let optional = nobody && op["security"].is_array();
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        for (who, listed, label) in [
            (As::Nobody, nobody && !optional, "no key"),
            (As::Admin, admin, "the admin key"),
            (As::Key(&key), tenant, "a tenant key"),
        ] {
            let r = s.send(method.clone(), &concrete, who, None).await;
            assert!(
                r.status != 401 || op["responses"].get("401").is_some(),
                "{method} {template} answers 401 but does not document it"
            );
            if listed {
                assert_ne!(
                    r.status, 401,
                    "{method} {template} with {label}: documented, yet {}",
                    r.body
                );
            } else if !optional {
                assert_eq!(
                    r.status, 401,
                    "{method} {template} with {label}: not documented, yet {} {}",
                    r.status, r.body
                );
            }
        }
    }
    s.stop().await;
}

/// Sends requests and checks each request body and response against the document.
struct Checked<'a> {
    s: &'a TestServer,
    doc: Doc,
}

impl Checked<'_> {
    async fn call(&self, method: Method, path: &str, who: As<'_>, body: Option<Value>) -> Resp {
        if let Some(body) = &body {
            let m = method.as_str();
            let schema = self.doc.request_schema(m, &self.doc.template(path));
            self.doc
                .validate(&format!("request {m} {path}"), &schema, body);
        }
        self.send(method, path, who, body).await
    }

    /// Sends a body the document itself rejects.
    async fn post_invalid(&self, path: &str, who: As<'_>, body: Value) -> Resp {
        let schema = self.doc.request_schema("POST", &self.doc.template(path));
        assert!(
            !self.doc.errors(&schema, &body).is_empty(),
            "the document accepts {body}"
        );
        self.send(Method::POST, path, who, Some(body)).await
    }

    /// Sends the request and checks the response against the document.
    async fn send(&self, method: Method, path: &str, who: As<'_>, body: Option<Value>) -> Resp {
        let template = self.doc.template(path);
        let m = method.as_str().to_string();
        let r = self.s.send(method, path, who, body.as_ref()).await;
        for header in ["x-request-id", "x-cycles-trace-id"] {
            assert!(r.header(header).is_some(), "{m} {path}: no {header}");
        }
        match self.doc.response_schema(&m, &template, r.status) {
            Some(schema) => self.doc.validate(
                &format!("response {} to {m} {path}", r.status),
                &schema,
                &r.body,
            ),
            None => assert!(
                !r.body.is_object(),
                "{m} {path}: undocumented JSON body {}",
                r.body
            ),
        }
        r
    }

    async fn get(&self, path: &str, who: As<'_>) -> Resp {
        self.call(Method::GET, path, who, None).await
    }

    async fn post(&self, path: &str, who: As<'_>, body: Value) -> Resp {
        self.call(Method::POST, path, who, Some(body)).await
    }

    async fn patch(&self, path: &str, who: As<'_>, body: Value) -> Resp {
        self.call(Method::PATCH, path, who, Some(body)).await
    }
}

const USD: &str = "USD_MICROCENTS";

fn usd(amount: i64) -> Value {
    json!({"unit": USD, "amount": amount})
}

async fn real_bodies_match_the_schemas(engine: Engine) {
    let s = TestServer::start(engine).await;
    let c = Checked {
        s: &s,
        doc: Doc::fetch(&s).await,
    };

    // Operations.
    for probe in [
        "/actuator/health",
        "/actuator/health/liveness",
        "/actuator/health/readiness",
    ] {
        c.get(probe, As::Nobody).await.expect(200, None);
    }
    c.get("/metrics", As::Admin).await.expect(200, None);

    // Provisioning.
    let tenant = json!({
        "tenant_id": "acme", "name": "Acme", "metadata": {"tier": "gold"},
        "default_commit_overage_policy": "ALLOW_WITH_OVERDRAFT",
        "max_reservation_extensions": 1,
    });
    c.post("/v1/admin/tenants", As::Admin, tenant.clone())
        .await
        .expect(201, None);
    c.post("/v1/admin/tenants", As::Admin, tenant)
        .await
        .expect(200, None);
    c.get("/v1/admin/tenants/acme", As::Admin)
        .await
        .expect(200, None);
    c.patch(
        "/v1/admin/tenants/acme",
        As::Admin,
        json!({"name": "Acme Inc", "default_reservation_ttl_ms": 60_000}),
    )
    .await
    .expect(200, None);
    let created = c
        .post(
            "/v1/admin/api-keys",
            As::Admin,
            json!({"tenant_id": "acme", "name": "agents", "scope_filter": ["tenant:acme"],
                   "metadata": {"team": "ml"}}),
        )
        .await;
    let key = created.expect(201, None)["key_secret"]
        .as_str()
        .unwrap()
        .to_string();
    let spare = c
        .post(
            "/v1/admin/api-keys",
            As::Admin,
            json!({"tenant_id": "acme", "name": "spare", "permissions": ["balances:read"]}),
        )
        .await;
    let spare_id = spare.expect(201, None)["key_id"]
        .as_str()
        .unwrap()
        .to_string();
    c.call(
        Method::DELETE,
        &format!("/v1/admin/api-keys/{spare_id}?reason=rotated"),
        As::Admin,
        None,
    )
    .await
    .expect(200, None);

    c.post(
        "/v1/admin/budgets",
        As::Admin,
        json!({"tenant_id": "acme", "scope": "tenant:acme", "unit": USD,
               "allocated": usd(1_000_000), "overdraft_limit": usd(100_000),
               "period_start": "2027-01-01T00:00:00Z", "metadata": {"owner": "finance"}}),
    )
    .await
    .expect(201, None);
    c.post(
        "/v1/admin/budgets",
        As::Key(&key),
        json!({"scope": "tenant:acme/agent:bot", "unit": USD, "allocated": usd(300_000),
               "commit_overage_policy": "REJECT"}),
    )
    .await
    .expect(201, None);
    c.post(
        "/v1/admin/budgets/fund?scope=tenant:acme&unit=USD_MICROCENTS&tenant_id=acme",
        As::Admin,
        json!({"operation": "CREDIT", "amount": usd(50_000), "idempotency_key": "f1"}),
    )
    .await
    .expect(200, None);
    c.get(
        "/v1/admin/budgets/lookup?scope=tenant:acme&unit=USD_MICROCENTS",
        As::Key(&key),
    )
    .await
    .expect(200, None);
    c.get("/v1/admin/budgets?tenant_id=acme&limit=1", As::Admin)
        .await
        .expect(200, None);
    c.patch(
        "/v1/admin/budgets?scope=tenant:acme/agent:bot&unit=USD_MICROCENTS",
        As::Admin,
        json!({"overdraft_limit": usd(10_000)}),
    )
    .await
    .expect(200, None);
    c.call(
        Method::POST,
        "/v1/admin/budgets/freeze?scope=tenant:acme/agent:bot&unit=USD_MICROCENTS",
        As::Admin,
        None,
    )
    .await
    .expect(200, None);
    c.post(
        "/v1/admin/budgets/unfreeze?scope=tenant:acme/agent:bot&unit=USD_MICROCENTS",
        As::Admin,
        json!({"reason": "incident over"}),
    )
    .await
    .expect(200, None);

    // The runtime lifecycle.
    let bot = json!({"tenant": "acme", "agent": "bot", "dimensions": {"region": "eu"}});
    let mut reserve = reserve_body("r1", bot.clone(), 100_000);
    reserve["metadata"] = json!({"run": 7});
    reserve["action"]["tags"] = json!(["chat"]);
    let r1 = c.post("/v1/reservations", As::Key(&key), reserve).await;
    // The schemas are closed: a field the document does not name would fail validation.
    let mut extra = r1.body.clone();
    extra["undocumented"] = json!(1);
    let schema = c
        .doc
        .response_schema("POST", "/v1/reservations", 200)
        .unwrap();
    assert!(!c.doc.errors(&schema, &extra).is_empty());
    let r1 = r1.expect(200, None)["reservation_id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut dry = reserve_body("dry", bot.clone(), 10);
    dry["dry_run"] = json!(true);
    c.post("/v1/reservations", As::Key(&key), dry)
        .await
        .expect(200, None);
    let mut denied = reserve_body("dry-deny", bot.clone(), 10_000_000);
    denied["dry_run"] = json!(true);
    let denied = c.post("/v1/reservations", As::Key(&key), denied).await;
    assert_eq!(denied.expect(200, None)["decision"], "DENY");
    c.post(
        &format!("/v1/reservations/{r1}/commit"),
        As::Key(&key),
        json!({"idempotency_key": "c1", "actual": usd(42_000),
               "metrics": {"tokens_input": 10, "tokens_output": 20, "latency_ms": 5,
                           "model_version": "m-1", "custom": {"k": 1}},
               "metadata": {"done": true}}),
    )
    .await
    .expect(200, None);

    let r2 = c
        .post(
            "/v1/reservations",
            As::Key(&key),
            reserve_body("r2", bot.clone(), 1_000),
        )
        .await;
    let r2 = r2.expect(200, None)["reservation_id"]
        .as_str()
        .unwrap()
        .to_string();
    c.post(
        &format!("/v1/reservations/{r2}/release"),
        As::Key(&key),
        json!({"idempotency_key": "rel2", "reason": "not needed"}),
    )
    .await
    .expect(200, None);

    let r3 = c
        .post(
            "/v1/reservations",
            As::Key(&key),
            reserve_body("r3", json!({"tenant": "acme"}), 1_000),
        )
        .await;
    let r3 = r3.expect(200, None)["reservation_id"]
        .as_str()
        .unwrap()
        .to_string();
    c.post(
        &format!("/v1/reservations/{r3}/extend"),
        As::Key(&key),
        json!({"idempotency_key": "x3", "extend_by_ms": 30_000}),
    )
    .await
    .expect(200, None);

    c.get(&format!("/v1/reservations/{r1}"), As::Key(&key))
        .await
        .expect(200, None);
    c.get(&format!("/v1/reservations/{r3}"), As::Admin)
        .await
        .expect(200, None);
    let listed = c
        .get(
            "/v1/reservations?include=metadata,committed_metadata&limit=2&sort_by=created_at_ms&sort_dir=asc",
            As::Key(&key),
        )
        .await;
    let cursor = listed.expect(200, None)["next_cursor"]
        .as_str()
        .expect("a second page")
        .to_string();
    c.get(
        &format!(
            "/v1/reservations?include=metadata,committed_metadata&limit=2&sort_by=created_at_ms&sort_dir=asc&cursor={cursor}"
        ),
        As::Key(&key),
    )
    .await
    .expect(200, None);
    c.get("/v1/reservations?tenant=acme&status=COMMITTED", As::Admin)
        .await
        .expect(200, None);
    c.get("/v1/balances?tenant=acme&limit=1", As::Key(&key))
        .await
        .expect(200, None);
    c.get("/v1/balances?agent=bot", As::Key(&key))
        .await
        .expect(200, None);
    // An empty page is the same in either form: both forms must accept it.
    let empty = c.get("/v1/balances?unit=TOKENS", As::Key(&key)).await;
    assert_eq!(
        empty.expect(200, None),
        &json!({"balances": [], "has_more": false})
    );

    let decide = json!({"idempotency_key": "d1", "subject": bot,
                        "action": {"kind": "llm", "name": "m"}, "estimate": usd(1)});
    c.post("/v1/decide", As::Key(&key), decide)
        .await
        .expect(200, None);
    let deny = json!({"idempotency_key": "d2", "subject": {"tenant": "acme"},
                      "action": {"kind": "llm", "name": "m"}, "estimate": usd(100_000_000)});
    let deny = c.post("/v1/decide", As::Key(&key), deny).await;
    assert_eq!(deny.expect(200, None)["decision"], "DENY");
    let event = json!({"idempotency_key": "e1", "subject": {"tenant": "acme"},
                       "action": {"kind": "tool", "name": "search"}, "actual": usd(500),
                       "overage_policy": "ALLOW_IF_AVAILABLE", "client_time_ms": 1,
                       "metadata": {"source": "batch"}});
    c.post("/v1/events", As::Key(&key), event)
        .await
        .expect(201, None);

    // Errors: each status as documented, each body an ErrorResponse.
    c.get("/v1/balances?tenant=acme", As::Nobody)
        .await
        .expect(401, Some("UNAUTHORIZED"));
    c.post_invalid(
        "/v1/reservations",
        As::Key(&key),
        json!({"idempotency_key": "bad", "subject": {"tenant": "acme"}}),
    )
    .await
    .expect(400, Some("INVALID_REQUEST"));
    let mut unknown = reserve_body("unknown", json!({"tenant": "acme"}), 1);
    unknown["surprise"] = json!(1);
    c.post_invalid("/v1/reservations", As::Key(&key), unknown)
        .await
        .expect(400, Some("INVALID_REQUEST"));
    let mut tokens = reserve_body("tok", json!({"tenant": "acme"}), 5);
    tokens["estimate"]["unit"] = json!("TOKENS");
    let mismatch = c.post("/v1/reservations", As::Key(&key), tokens).await;
    assert!(mismatch.expect(400, Some("UNIT_MISMATCH"))["details"].is_object());
    c.get("/v1/balances?tenant=other", As::Key(&key))
        .await
        .expect(403, Some("FORBIDDEN"));
    c.get("/v1/reservations/rsv_missing", As::Key(&key))
        .await
        .expect(404, Some("NOT_FOUND"));
    c.get("/v1/admin/tenants/nobody", As::Admin)
        .await
        .expect(404, Some("TENANT_NOT_FOUND"));
    c.post(
        &format!("/v1/reservations/{r1}/commit"),
        As::Key(&key),
        json!({"idempotency_key": "c1-again", "actual": usd(1)}),
    )
    .await
    .expect(409, Some("RESERVATION_FINALIZED"));
    c.post(
        "/v1/reservations",
        As::Key(&key),
        reserve_body("huge", json!({"tenant": "acme"}), 10_000_000),
    )
    .await
    .expect(409, Some("BUDGET_EXCEEDED"));
    c.post(
        &format!("/v1/reservations/{r3}/extend"),
        As::Key(&key),
        json!({"idempotency_key": "x3-again", "extend_by_ms": 1_000}),
    )
    .await
    .expect(409, Some("MAX_EXTENSIONS_EXCEEDED"));
    s.advance(200_000);
    c.get(&format!("/v1/reservations/{r3}"), As::Key(&key))
        .await
        .expect(410, Some("RESERVATION_EXPIRED"));
    s.stop().await;
}

async fn swagger_ui_is_served(engine: Engine) {
    let s = TestServer::start(engine).await;
    let page = s.get("/swagger-ui/", As::Nobody).await;
    assert_eq!(page.status, 200);
    assert!(page
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/html")));
    let html = page.body.as_str().expect("an HTML page");
    assert!(html.contains("swagger-ui"), "{html}");
    // The bare path redirects to the page (followed by the client).
    assert_eq!(s.get("/swagger-ui", As::Nobody).await.status, 200);
    // The assets are embedded, and the UI is pointed at our document.
    let init = s
        .get("/swagger-ui/swagger-initializer.js", As::Nobody)
        .await;
    assert_eq!(init.status, 200);
    assert!(init
        .body
        .as_str()
        .is_some_and(|js| js.contains("/openapi.json")));
    for asset in ["swagger-ui-bundle.js", "swagger-ui.css"] {
        let r = s.get(&format!("/swagger-ui/{asset}"), As::Nobody).await;
        assert_eq!(r.status, 200, "{asset}");
    }
    s.stop().await;
}
