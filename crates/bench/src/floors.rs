//! The physical floors, measured in the same run as the cases: an unauthenticated health
//! request (HTTP on this machine), a 4 KiB write + fdatasync on the data directory's file
//! system (two ways: see [`Probe`]), and a Redis round trip.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::http::Conn;

/// GET /actuator/health: no auth, no store work. The floor of every case.
pub async fn health(conn: &mut Conn) -> anyhow::Result<()> {
    conn.get("/actuator/health").await?.expect(200).map(drop)
}

/// How the fdatasync probe writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// Over space already written and synced, as the journal writes into its preallocated
    /// segment: the file's size does not change, so the sync has no metadata to write.
    /// The floor the server pays.
    Overwrite,
    /// At the end of the file, growing it: each sync also writes the new size.
    Append,
}

const BLOCK: usize = 4096;

/// `warmup + iterations` writes of 4 KiB (`probe` says where), each followed by
/// `fdatasync`, on a temporary file inside `dir` (or its nearest existing ancestor: a
/// memory-only server creates no data directory, and the file system is what matters); the
/// timings of the last `iterations`. Blocking: run it off the runtime.
pub fn fdatasync(
    dir: &Path,
    probe: Probe,
    warmup: usize,
    iterations: usize,
) -> anyhow::Result<Vec<Duration>> {
    let dir = dir
        .ancestors()
        .find(|d| d.is_dir())
        .unwrap_or(Path::new("."));
    let mut file = tempfile::Builder::new()
        .prefix(".cycles-bench-fsync-")
        .tempfile_in(dir)
        .with_context(|| format!("creating a probe file in {}", dir.display()))?;
    let rounds = warmup + iterations;
    if probe == Probe::Overwrite {
        // Preallocated the way the journal preallocates: zeros written and synced.
        file.write_all(&vec![0u8; rounds * BLOCK])?;
        file.as_file().sync_all()?;
    }
    let block = [0x5au8; BLOCK];
    let mut timings = Vec::with_capacity(iterations);
    for i in 0..rounds {
        let started = Instant::now();
        match probe {
            Probe::Overwrite => file.as_file().write_all_at(&block, (i * BLOCK) as u64)?,
            Probe::Append => file.write_all(&block)?,
        }
        file.as_file().sync_data()?;
        if i >= warmup {
            timings.push(started.elapsed());
        }
    }
    Ok(timings)
}

/// A Redis connection for the round-trip floor (`PING` → `+PONG`).
pub struct Redis {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Redis {
    /// Connects to `redis://[[user]:password@]host[:port][/db]` (plain TCP).
    pub async fn connect(url: &str) -> anyhow::Result<Redis> {
        let (auth, host) = parse_redis_url(url)?;
        let stream = TcpStream::connect(&host)
            .await
            .with_context(|| format!("cannot connect to Redis at {host}"))?;
        stream.set_nodelay(true)?;
        let mut redis = Redis {
            stream,
            buf: vec![0; 512],
        };
        if let Some((user, password)) = auth {
            let mut parts = vec!["AUTH"];
            parts.extend(user.as_deref());
            parts.push(&password);
            let reply = redis.call(&parts).await?;
            if !reply.starts_with("+OK") {
                bail!("Redis AUTH failed: {reply}");
            }
        }
        Ok(redis)
    }

    async fn call(&mut self, parts: &[&str]) -> anyhow::Result<String> {
        let mut cmd = format!("*{}\r\n", parts.len());
        for p in parts {
            cmd.push_str(&format!("${}\r\n{p}\r\n", p.len()));
        }
        self.stream.write_all(cmd.as_bytes()).await?;
        let mut got = 0;
        loop {
            let n = self.stream.read(&mut self.buf[got..]).await?;
            if n == 0 {
                bail!("Redis closed the connection");
            }
            got += n;
            if self.buf[..got].ends_with(b"\r\n") || got == self.buf.len() {
                return Ok(String::from_utf8_lossy(&self.buf[..got]).into_owned());
            }
        }
    }

    pub async fn ping(&mut self) -> anyhow::Result<()> {
        let reply = self.call(&["PING"]).await?;
        if reply != "+PONG\r\n" {
            bail!("unexpected PING reply {reply:?}");
        }
        Ok(())
    }
}

type RedisAuth = Option<(Option<String>, String)>;

/// `(auth, host:port)` of a `redis://` URL.
fn parse_redis_url(url: &str) -> anyhow::Result<(RedisAuth, String)> {
    let rest = url
        .strip_prefix("redis://")
        .context("the Redis URL must start with redis:// (TLS is not supported)")?;
    let rest = rest.split('/').next().unwrap_or_default();
    let (auth, host) = match rest.rsplit_once('@') {
        Some((auth, host)) => {
            let (user, password) = auth.split_once(':').unwrap_or(("", auth));
            let user = (!user.is_empty()).then(|| user.to_string());
            (Some((user, password.to_string())), host)
        }
        None => (None, rest),
    };
    if host.is_empty() {
        bail!("the Redis URL has no host");
    }
    let host = if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:6379")
    };
    Ok((auth, host))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_urls() {
        let (auth, host) = parse_redis_url("redis://127.0.0.1:6380").unwrap();
        assert_eq!((auth, host.as_str()), (None, "127.0.0.1:6380"));
        let (auth, host) = parse_redis_url("redis://:pw@localhost/0").unwrap();
        assert_eq!(auth, Some((None, "pw".to_string())));
        assert_eq!(host, "localhost:6379");
        let (auth, _) = parse_redis_url("redis://me:pw@h:1").unwrap();
        assert_eq!(auth, Some((Some("me".to_string()), "pw".to_string())));
        assert!(parse_redis_url("rediss://h").is_err());
    }

    #[test]
    fn fdatasync_probes_time_each_iteration() {
        let dir = tempfile::tempdir().unwrap();
        for probe in [Probe::Overwrite, Probe::Append] {
            let t = fdatasync(dir.path(), probe, 2, 5).unwrap();
            assert_eq!(t.len(), 5);
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
            let missing = dir.path().join("not/yet");
            assert_eq!(fdatasync(&missing, probe, 0, 1).unwrap().len(), 1);
        }
    }
}
