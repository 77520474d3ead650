//! The `cycles` binary as a process: started on a data directory and a free port, stopped
//! by signal.

use std::fs::File;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub const ADMIN_KEY: &str = "process-test-admin-key";
/// The webhook key every instance of one Redis ledger is given.
const WEBHOOK_KEY: &str = "0101010101010101010101010101010101010101010101010101010101010101";

/// A running `cycles serve`; killed if still running when dropped (a failed test must not
/// leave it behind).
pub struct Server {
    child: Child,
    pub base: String,
}

/// How a server on the Redis engine is started (see [`Server::start_redis`]).
pub struct RedisServe<'a> {
    pub url: &'a str,
    pub cluster: bool,
    pub namespace: &'a str,
    /// `aof` or `none`.
    pub durability: &'a str,
    pub timeout_ms: &'a str,
    /// Whether to wait until the store is ready (false: until the process answers).
    pub ready: bool,
    /// More arguments.
    pub extra: Vec<&'a str>,
}

impl<'a> RedisServe<'a> {
    /// A ledger on a Redis that need keep nothing on disk, with a timeout generous enough
    /// for the loaded machines that run the suite.
    pub fn new(url: &'a str, cluster: bool, namespace: &'a str) -> Self {
        RedisServe {
            url,
            cluster,
            namespace,
            durability: "none",
            timeout_ms: "2000",
            ready: true,
            extra: Vec::new(),
        }
    }
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    listener.local_addr().expect("local addr").port()
}

impl Server {
    /// Starts the server on `data_dir` and waits until its health probe answers 200. The
    /// port is picked by binding port 0 and letting go, so another process may take it in
    /// between: a start whose process exits early is retried on another port.
    pub async fn start(data_dir: &Path, logs: &Path) -> Server {
        let args = [
            "--durability",
            "strict",
            // The smallest snapshot threshold, so crashes also land around rotations
            // and background snapshots.
            "--snapshot-after-mib",
            "1",
            // Settled reservations leave memory for the history store at once, so
            // crashes also land while rows move to disk.
            "--archive-after-ms",
            "0",
        ];
        Server::start_with(data_dir, logs, &args, "/actuator/health").await
    }

    /// Starts the server on the Redis engine, as `redis` says.
    pub async fn start_redis(data_dir: &Path, logs: &Path, redis: &RedisServe<'_>) -> Server {
        let mut args = vec![
            "--store",
            "redis",
            "--redis-url",
            redis.url,
            "--redis-namespace",
            redis.namespace,
            "--redis-durability",
            redis.durability,
            "--redis-timeout-ms",
            redis.timeout_ms,
            "--webhook-keys",
            WEBHOOK_KEY,
        ];
        if redis.cluster {
            args.push("--redis-cluster");
        }
        args.extend(&redis.extra);
        // The store's health is DOWN while Redis cannot be reached: a server started
        // without its Redis is waited for only until it answers at all.
        let probe = match redis.ready {
            true => "/actuator/health",
            false => "/actuator/health/liveness",
        };
        Server::start_with(data_dir, logs, &args, probe).await
    }

    /// Starts the server with `args` after the common ones (see [`Server::start`]) and waits
    /// until `probe` answers 200. `{port}` in an argument is the port it listens on.
    async fn start_with(data_dir: &Path, logs: &Path, args: &[&str], probe: &str) -> Server {
        let http = client();
        for attempt in 0..3 {
            let port = free_port();
            let log = logs.join(format!("serve-{port}.log"));
            let mut child = Command::new(env!("CARGO_BIN_EXE_cycles"))
                .arg("serve")
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .arg("--data-dir")
                .arg(data_dir)
                .args(["--admin-api-key", ADMIN_KEY, "--log", "info"])
                .args(["--sweep-interval-ms", "100"])
                .args(args.iter().map(|a| a.replace("{port}", &port.to_string())))
                .stdout(Stdio::null())
                .stderr(File::create(&log).expect("log file"))
                .spawn()
                .expect("spawn cycles serve");
            let base = format!("http://127.0.0.1:{port}");
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Some(status) = child.try_wait().expect("try_wait") {
                    let output = std::fs::read_to_string(&log).unwrap_or_default();
                    eprintln!("cycles serve exited with {status} (attempt {attempt}):\n{output}");
                    break;
                }
                let health = http.get(format!("{base}{probe}")).send().await;
                if health.is_ok_and(|r| r.status() == 200) {
                    return Server { child, base };
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("cycles serve did not become healthy");
    }

    /// SIGKILL: no chance to flush anything or say goodbye.
    pub fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("wait");
    }

    /// Sends SIGTERM without waiting.
    pub fn signal_term(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
    }

    /// Waits for the process to exit on its own.
    pub async fn wait_exit(mut self) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "the server did not exit");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM, then waits: a graceful stop must exit 0.
    pub async fn terminate(self) {
        self.signal_term();
        let status = self.wait_exit().await;
        assert!(status.success(), "graceful stop exited with {status}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Everything the servers started with `dir` as their log directory have logged so far.
pub fn logs_in(dir: &Path) -> String {
    std::fs::read_dir(dir)
        .expect("log directory")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .collect()
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("http client")
}

/// `cycles serve --data-dir <data_dir> <args>` must exit at start, saying the directory is
/// in use (a server that starts instead is killed, and the test fails).
pub fn assert_serve_refused_in_use(data_dir: &Path, args: &[&str]) {
    assert_serve_refused(data_dir, args, "is in use by another process");
}

/// `cycles serve --data-dir <data_dir> <args>` must exit at start, saying `why` (a server
/// that starts instead is killed, and the test fails).
pub fn assert_serve_refused(data_dir: &Path, args: &[&str], why: &str) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cycles"))
        .arg("serve")
        .args(["--listen", "127.0.0.1:0", "--admin-api-key", ADMIN_KEY])
        .args(["--webhook-keys", WEBHOOK_KEY, "--data-dir"])
        .arg(data_dir)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cycles serve");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("cycles serve {args:?} started, where it should say: {why}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("read stderr");
    assert!(
        !status.success() && stderr.contains(why),
        "cycles serve {args:?} exited with {status}, not saying {why}:\n{stderr}"
    );
}

/// `cycles verify <args>` must exit 0 and report OK.
pub fn assert_verify_ok(args: &[&str]) {
    let output = Command::new(env!("CARGO_BIN_EXE_cycles"))
        .arg("verify")
        .args(args)
        .output()
        .expect("run cycles verify");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("OK"),
        "cycles verify {args:?} failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}
