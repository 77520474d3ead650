//! The server's logs as an operator's collector reads them: no colour codes when stderr is
//! not a terminal, and with `--log-format json` one JSON object per line.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// The first lines `cycles serve` logs (memory only, a free port) with `args` added.
fn first_log_lines(args: &[&str]) -> Vec<String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cycles"))
        .args(["serve", "--durability", "none", "--listen", "127.0.0.1:0"])
        .args(["--admin-api-key", "logs-test-key"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cycles serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = Vec::new();
    for line in BufReader::new(stderr).lines() {
        let line = line.expect("log line");
        let recovered = line.contains("store recovered");
        lines.push(line);
        if recovered {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    lines
}

#[test]
fn logs_are_plain_off_a_terminal_and_json_on_request() {
    let text = first_log_lines(&[]);
    assert!(
        text.iter().any(|l| l.contains("store recovered")),
        "{text:?}"
    );
    assert!(
        text.iter().all(|l| !l.contains('\u{1b}')),
        "colour codes: {text:?}"
    );
    let json = first_log_lines(&["--log-format", "json"]);
    assert!(!json.is_empty());
    for line in &json {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            v["level"].is_string() && v["timestamp"].is_string(),
            "{line}"
        );
    }
    let last: serde_json::Value = serde_json::from_str(json.last().unwrap()).unwrap();
    assert_eq!(last["fields"]["message"], "store recovered");
}
