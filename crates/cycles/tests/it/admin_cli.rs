//! `cycles admin` against a running server: the list commands (JSON when not on a
//! terminal, every page followed), key updates and the overview.

use std::process::{Command, Stdio};

use serde_json::Value;
use tempfile::TempDir;

use crate::process::{Server, ADMIN_KEY};

/// Runs `cycles admin <args>` against `server`; its stdout as JSON.
fn admin(server: &Server, args: &[&str]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_cycles"))
        .arg("admin")
        .args(["--url", &server.base, "--admin-key", ADMIN_KEY])
        .args(args)
        .output()
        .expect("run cycles admin");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "cycles admin {args:?} failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}):\n{stdout}"))
}

fn column(rows: &Value, field: &str) -> Vec<String> {
    rows.as_array()
        .expect("rows")
        .iter()
        .map(|r| r[field].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_lists_update_and_overview() {
    let dir = TempDir::new().expect("temp dir");
    let server = Server::start(&dir.path().join("data"), dir.path()).await;
    for i in 0..120 {
        let id = format!("team-{i:03}");
        admin(
            &server,
            &[
                "tenant",
                "create",
                "--id",
                &id,
                "--name",
                &format!("Team {i}"),
            ],
        );
    }
    let all = admin(
        &server,
        &["tenant", "list", "--sort-by", "tenant_id", "--asc"],
    );
    let ids = column(&all, "tenant_id");
    assert_eq!(ids.len(), 120, "two pages of 100, followed");
    assert_eq!(
        (ids[0].as_str(), ids[119].as_str()),
        ("team-000", "team-119")
    );
    let few = admin(
        &server,
        &["tenant", "list", "--search", "TEAM 11", "--json"],
    );
    assert_eq!(column(&few, "tenant_id").len(), 11, "team 11 and 110–119");
    let capped = admin(&server, &["tenant", "list", "--limit", "5"]);
    assert_eq!(capped.as_array().map(Vec::len), Some(5));

    let key = admin(
        &server,
        &["key", "create", "--tenant", "team-001", "--name", "ci"],
    );
    let key_id = key["key_id"].as_str().expect("key_id");
    let updated = admin(
        &server,
        &[
            "key",
            "update",
            "--key-id",
            key_id,
            "--name",
            "deploy",
            "--permission",
            "balances:read",
        ],
    );
    assert_eq!(updated["name"], "deploy");
    assert_eq!(updated["permissions"], serde_json::json!(["balances:read"]));
    let keys = admin(&server, &["key", "list", "--tenant", "team-001"]);
    assert_eq!(column(&keys, "key_id"), [key_id]);
    assert!(keys[0].get("key_secret").is_none());

    admin(
        &server,
        &[
            "budget",
            "create",
            "--scope",
            "tenant:team-001",
            "--allocated",
            "1000",
        ],
    );
    admin(
        &server,
        &[
            "budget",
            "create",
            "--scope",
            "tenant:team-002",
            "--allocated",
            "10",
        ],
    );
    let budgets = admin(&server, &["budget", "list", "--tenant", "team-002"]);
    assert_eq!(column(&budgets, "scope"), ["tenant:team-002"]);
    let overview = admin(&server, &["overview"]);
    assert_eq!(overview["tenant_counts"]["total"], 120);
    assert_eq!(overview["budget_counts"]["total"], 2);

    // The audit log: 120 creates, the key's creation and update, two budgets.
    let creates = admin(&server, &["audit", "--operation", "createTenant"]);
    assert_eq!(column(&creates, "operation").len(), 120, "pages followed");
    let on_team = admin(
        &server,
        &[
            "audit",
            "--tenant",
            "team-001",
            "--asc",
            "--sort-by",
            "timestamp",
        ],
    );
    assert_eq!(
        column(&on_team, "operation"),
        [
            "createTenant",
            "createApiKey",
            "updateApiKey",
            "createBudget"
        ]
    );
    let budgets = admin(
        &server,
        &[
            "audit",
            "--resource-type",
            "budget",
            "--resource-id",
            "tenant:team-002",
        ],
    );
    assert_eq!(column(&budgets, "operation"), ["createBudget"]);
    assert_eq!(budgets[0]["status"], 201);
    assert_eq!(
        admin(&server, &["audit", "--errors"]),
        serde_json::json!([])
    );
    // Events, and webhooks: the security configuration, a subscription, its deliveries.
    let events = admin(
        &server,
        &["events", "--tenant", "team-002", "--category", "budget"],
    );
    assert_eq!(column(&events, "event_type"), ["budget.created"]);
    let security = admin(
        &server,
        &[
            "webhook",
            "security",
            "--allow-http",
            "true",
            "--block-nothing",
        ],
    );
    assert_eq!(security["allow_http"], true);
    assert_eq!(security["blocked_cidr_ranges"], serde_json::json!([]));
    let created = admin(
        &server,
        &[
            "webhook",
            "create",
            "--tenant",
            "team-002",
            "--url",
            "http://127.0.0.1:9/hook",
            "--event-type",
            "budget.funded",
        ],
    );
    let id = created["subscription"]["subscription_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(created["signing_secret"].as_str().is_some());
    let listed = admin(&server, &["webhook", "list", "--tenant", "team-002"]);
    assert_eq!(column(&listed, "subscription_id"), [id.as_str()]);
    let paused = admin(&server, &["webhook", "pause", &id]);
    assert_eq!(paused["status"], "PAUSED");
    assert_eq!(
        admin(&server, &["webhook", "deliveries", &id]),
        serde_json::json!([])
    );
    assert_eq!(
        admin(&server, &["webhook", "delete", &id])["deleted"],
        id.as_str()
    );
    let lifecycle = admin(&server, &["events", "--category", "webhook"]);
    assert_eq!(
        column(&lifecycle, "event_type"),
        ["webhook.deleted", "webhook.paused", "webhook.created"]
    );
    // A reader that stops reading (`cycles admin tenant list | head -1`) ends the command
    // quietly: no panic, no failure.
    let mut child = Command::new(env!("CARGO_BIN_EXE_cycles"))
        .arg("admin")
        .args(["--url", &server.base, "--admin-key", ADMIN_KEY])
        .args(["tenant", "list"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run cycles admin");
    drop(child.stdout.take());
    let output = child.wait_with_output().expect("cycles admin ends");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{}: {stderr}", output.status);
    assert!(stderr.is_empty(), "{stderr}");
    server.terminate().await;
}

/// A first start generates the admin key and shows it once; a first start that fails after
/// storing it (a bad flag found later) shows it with the failure, since later starts only
/// say where it is.
#[test]
fn a_generated_admin_key_is_shown_when_the_first_start_fails() {
    let dir = TempDir::new().expect("temp dir");
    let data = dir.path().join("data");
    let output = Command::new(env!("CARGO_BIN_EXE_cycles"))
        .args(["serve", "--listen", "127.0.0.1:0", "--webhook-keys", "abc"])
        .arg("--data-dir")
        .arg(&data)
        .env_remove("CYCLES_ADMIN_API_KEY")
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("run cycles serve");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("a key is 64 hex characters"), "{stderr}");
    let stored = std::fs::read_to_string(data.join("admin.key")).expect("stored key");
    let shown = format!("X-Admin-API-Key: {}", stored.trim());
    assert!(stderr.contains(&shown), "{stderr}");
}
