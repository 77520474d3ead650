//! The environment block of a report: what ran where.

use std::process::Command;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    /// `git describe`-style commit of the working directory (`CYCLES_BENCH_COMMIT` overrides).
    pub commit: String,
    pub toolchain: String,
    pub cpu_model: String,
    pub cores: usize,
    pub kernel: String,
    pub os: String,
    pub bench_version: String,
    /// `/proc/loadavg` when the run started and when it ended: other work on the machine
    /// (the client shares it with the server, and on a shared host with everything else).
    #[serde(default)]
    pub load_average_start: String,
    #[serde(default)]
    pub load_average_end: String,
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "n/a".into())
}

fn command(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn commit() -> String {
    if let Ok(c) = std::env::var("CYCLES_BENCH_COMMIT") {
        return c;
    }
    match command("git", &["rev-parse", "--short=12", "HEAD"]) {
        Some(sha) => {
            let dirty = command("git", &["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{sha}-dirty")
            } else {
                sha
            }
        }
        None => "unknown".into(),
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn os() -> String {
    std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string())
        })
        .unwrap_or_else(|| std::env::consts::OS.into())
}

impl Environment {
    pub fn detect() -> Environment {
        Environment {
            commit: commit(),
            toolchain: command("rustc", &["--version"]).unwrap_or_else(|| "unknown".into()),
            cpu_model: cpu_model(),
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into()),
            os: os(),
            bench_version: env!("CARGO_PKG_VERSION").into(),
            load_average_start: String::new(),
            load_average_end: load_average(),
        }
    }
}
