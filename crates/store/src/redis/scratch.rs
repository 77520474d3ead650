//! A ledger of a test's own in a shared Redis (feature `testing`): the crates whose tests run
//! against a Redis each name a ledger per test and delete it when the test ends, passed or
//! failed, so the Redis holds nothing afterwards.

use std::io;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::compaction;
use super::log::{self, Keys, Topology};

/// A test's ledger, deleted from its Redis when dropped. Declared before the stores or
/// servers that use it, it is dropped after them.
#[derive(Debug)]
pub struct ScratchLedger {
    pub url: String,
    pub topology: Topology,
    /// Unique to the test: `cycles-{name}-{process}-{nanoseconds}`.
    pub namespace: String,
}

impl ScratchLedger {
    /// A new ledger named after `name`, on the Redis (or the Cluster's nodes) at `url`.
    pub fn new(url: &str, topology: Topology, name: &str) -> ScratchLedger {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        ScratchLedger {
            url: url.to_string(),
            topology,
            namespace: format!("cycles-{name}-{}-{nanos}", std::process::id()),
        }
    }

    /// Whether the ledger is on a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.topology == Topology::Cluster
    }
}

impl Drop for ScratchLedger {
    fn drop(&mut self) {
        let deleted = delete_ledger(&self.url, &self.topology, &self.namespace);
        // A test that failed already says why; one that passed fails here instead, as a
        // leftover ledger would go unnoticed.
        match deleted {
            Err(e) if !std::thread::panicking() => {
                panic!("delete the test ledger {}: {e}", self.namespace)
            }
            Err(e) => eprintln!("the test ledger {} was not deleted: {e}", self.namespace),
            Ok(()) => {}
        }
    }
}

/// Deletes a ledger from Redis: every key of `namespace`, for good. An instance still
/// serving it refuses to go on (its marker is gone).
fn delete_ledger(url: &str, topology: &Topology, namespace: &str) -> io::Result<()> {
    let fail = |e: ::redis::RedisError| io::Error::other(e.to_string());
    let mut conn = log::Conn::open(url, topology, Duration::from_secs(10)).map_err(fail)?;
    let keys = Keys::new(namespace);
    // The snapshots' parts first: the pointer and the pending list name them.
    let mut names: Vec<String> = ::redis::cmd("SMEMBERS")
        .arg(&keys.pending)
        .query(conn.link())
        .map_err(fail)?;
    let current: Option<String> = ::redis::cmd("HGET")
        .arg(&keys.snapshot)
        .arg("name")
        .query(conn.link())
        .map_err(fail)?;
    names.extend(current);
    for name in names {
        compaction::delete_parts(&mut conn, &keys, &name, None)
            .map_err(|e| io::Error::other(e.to_string()))?;
    }
    let mut del = ::redis::cmd("DEL");
    for key in keys.fixed() {
        del.arg(key);
    }
    del.query::<i64>(conn.link()).map_err(fail)?;
    Ok(())
}
