//! The operator dashboard on the API's listener (`ServerOptions::dashboard`): its files as
//! they are, the app's routes answered with `index.html`, and the API exactly as without it.

use reqwest::Method;
use serde_json::Value;
use server::Dashboard;
use tempfile::TempDir;

use crate::common::{As, Engine, Resp, TestServer};

engine_tests!(
    files_are_served_as_they_are_with_their_types,
    hashed_assets_are_immutable_and_the_rest_revalidated,
    app_routes_answer_the_index,
    a_missing_asset_is_not_found,
    the_api_is_not_shadowed,
    head_answers_the_headers_alone,
);

const INDEX: &str = "<!doctype html><html><body><div id=\"app\"></div>\
    <script type=\"module\" src=\"/assets/x-abc.js\"></script></body></html>\n";
const SCRIPT: &str = "export const answer = 42;\n";
const ICON: &str = "<svg xmlns=\"http://www.w3.org/2000/svg\"></svg>\n";

/// A small dashboard build: an index, one hashed module script and an icon.
fn build() -> TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("assets")).expect("assets dir");
    for (path, contents) in [
        ("index.html", INDEX),
        ("assets/x-abc.js", SCRIPT),
        ("favicon.svg", ICON),
    ] {
        std::fs::write(dir.path().join(path), contents).expect("write file");
    }
    dir
}

/// A server with the build in `dir` as its dashboard.
async fn serving(engine: Engine, dir: &TempDir) -> TestServer {
    let dashboard = Dashboard::open(dir.path()).expect("open the dashboard");
    TestServer::start_with(engine, |o| o.dashboard = Some(dashboard)).await
}

/// The body of a successful non-JSON answer.
#[track_caller]
fn text(r: &Resp) -> &str {
    assert_eq!(r.status, 200, "body: {}", r.body);
    r.body.as_str().expect("a text body")
}

#[track_caller]
fn assert_index(r: &Resp) {
    assert_eq!(text(r), INDEX);
    assert_eq!(r.header("content-type"), Some("text/html"));
    assert_eq!(r.header("cache-control"), Some("no-cache"));
}

async fn files_are_served_as_they_are_with_their_types(engine: Engine) {
    let dir = build();
    let s = serving(engine, &dir).await;
    assert_index(&s.get("/", As::Nobody).await);
    assert_index(&s.get("/index.html", As::Nobody).await);
    let script = s.get("/assets/x-abc.js", As::Nobody).await;
    assert_eq!(text(&script), SCRIPT);
    // A module script is refused by the browser unless its type is JavaScript's.
    let javascript = ["text/javascript", "application/javascript"];
    assert!(
        javascript.contains(&script.header("content-type").unwrap_or_default()),
        "{:?}",
        script.headers
    );
    let icon = s.get("/favicon.svg", As::Nobody).await;
    assert_eq!(text(&icon), ICON);
    assert_eq!(icon.header("content-type"), Some("image/svg+xml"));
    s.stop().await;
}

async fn hashed_assets_are_immutable_and_the_rest_revalidated(engine: Engine) {
    let dir = build();
    let s = serving(engine, &dir).await;
    let script = s.get("/assets/x-abc.js", As::Nobody).await;
    assert_eq!(
        script.header("cache-control"),
        Some("public, max-age=31536000, immutable")
    );
    let icon = s.get("/favicon.svg", As::Nobody).await;
    assert_eq!(icon.header("cache-control"), Some("no-cache"));
    // Revalidating an unchanged index costs no body.
    let index = s.get("/", As::Nobody).await;
    let modified = index.header("last-modified").expect("last-modified");
    let again = s.http_get_with("/", "If-Modified-Since", modified).await;
    assert_eq!(again.status, 304);
    assert_eq!(again.header("cache-control"), Some("no-cache"));
    s.stop().await;
}

async fn app_routes_answer_the_index(engine: Engine) {
    let dir = build();
    let s = serving(engine, &dir).await;
    // The app routes in the browser's history: a reload of any of its pages must load it.
    for path in [
        "/tenants",
        "/tenants/acme",
        "/login?redirect=/",
        "/budgets?scope=tenant:acme&unit=USD_MICROCENTS",
        "/assets",
        "/no/such/page",
    ] {
        assert_index(&s.get(path, As::Nobody).await);
    }
    s.stop().await;
}

async fn a_missing_asset_is_not_found(engine: Engine) {
    let dir = build();
    let s = serving(engine, &dir).await;
    for path in ["/assets/x-old.js", "/assets/nested/x.css"] {
        let r = s.get(path, As::Nobody).await;
        r.expect(404, Some("NOT_FOUND"));
        assert_eq!(r.header("cache-control"), Some("no-cache"));
    }
    s.stop().await;
}

async fn the_api_is_not_shadowed(engine: Engine) {
    let dir = build();
    let s = serving(engine, &dir).await;
    for path in ["/v1/nope", "/v1", "/v1/admin/nope", "/actuator/nope"] {
        let r = s.get(path, As::Admin).await;
        r.expect(404, Some("NOT_FOUND"));
        assert_eq!(r.header("content-type"), Some("application/json"));
    }
    // Only reads are the dashboard's: another method on an app path is an unknown route.
    let posted = s.send(Method::POST, "/tenants", As::Admin, None).await;
    posted.expect(404, Some("NOT_FOUND"));
    // A known route keeps its own answers, a wrong method included.
    s.send(Method::GET, "/v1/reservations/r1/release", As::Admin, None)
        .await
        .expect(405, None);
    let health = s.get("/actuator/health", As::Nobody).await;
    assert_eq!(health.expect(200, None)["status"], "UP");
    s.get("/v1/admin/tenants", As::Admin)
        .await
        .expect(200, None);
    s.get("/v1/admin/tenants", As::Nobody)
        .await
        .expect(401, None);
    s.get("/metrics", As::Nobody).await.expect(401, None);
    let document = s.get("/openapi.json", As::Nobody).await;
    assert!(document.expect(200, None)["paths"].is_object());
    assert_eq!(s.get("/swagger-ui/", As::Nobody).await.status, 200);
    s.stop().await;
}

async fn head_answers_the_headers_alone(engine: Engine) {
    let dir = build();
    let s = serving(engine, &dir).await;
    for (path, length) in [
        ("/", INDEX.len()),
        ("/tenants/acme", INDEX.len()),
        ("/assets/x-abc.js", SCRIPT.len()),
    ] {
        let got = s.get(path, As::Nobody).await;
        let r = s.send(Method::HEAD, path, As::Nobody, None).await;
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.body, Value::Null, "{path}");
        assert_eq!(r.header("content-length"), Some(&*length.to_string()));
        for name in ["content-type", "cache-control"] {
            assert_eq!(r.header(name), got.header(name), "{path}: {name}");
        }
    }
    let missing = s
        .send(Method::HEAD, "/assets/x-old.js", As::Nobody, None)
        .await;
    assert_eq!(missing.status, 404);
    s.stop().await;
}

#[test]
fn a_dashboard_directory_must_hold_an_index() {
    let missing = Dashboard::open("/nonexistent/dashboard/dist").unwrap_err();
    assert!(missing.to_string().contains("does not exist"), "{missing}");
    let empty = tempfile::tempdir().expect("temp dir");
    let no_index = Dashboard::open(empty.path()).unwrap_err();
    assert!(
        no_index.to_string().contains("has no index.html"),
        "{no_index}"
    );
}
