//! The ledger's log in Redis: its keys, the scripts that write them, and the reads that
//! bring an instance up to date.
//!
//! Every key of a ledger shares one hash tag (`{namespace}`), so every script touches one
//! slot and runs unchanged on Redis Cluster. The log is a stream with one entry per round
//! of journal records, its id the round's last sequence number; `version` is the last
//! sequence number in it. Only the holder of `lease` appends, and only where the log ends
//! where its round starts.

use std::io::Read;
use std::time::Duration;

use ::redis::{ConnectionLike, Script, Value};

use crate::embedded::journal::{read_records, segment_header, JournalRecord};

/// How long an instance's word that it wants the lease lasts unless it asks again (it asks
/// every millisecond or so while it waits, or after each wait for its turn, which is
/// shorter): one that stopped asking (it died, or gave up) holds the others up no longer
/// than this. A wake-up token lasts as long.
const WANT_MS: u64 = 50;

/// Stream entries (rounds) read per `XRANGE` while catching up: a page of large rounds must
/// still arrive within the command timeout.
const READ_PAGE: usize = 32;

/// How the ledger's Redis is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One Redis: the URL names it.
    Single,
    /// A Redis Cluster: the URL lists any of its nodes, comma-separated.
    Cluster,
    /// A primary watched by Redis Sentinels: the URL lists the Sentinels, comma-separated,
    /// and this is the primary's name among them. Each connection goes to whichever Redis
    /// they name primary as it is made, so the engine follows a failover; the primary is
    /// reached with the first URL's credentials and database.
    Sentinel(String),
}

/// A connection to one Redis or to a Redis Cluster.
pub enum Conn {
    Single(redis::Connection),
    Cluster(Box<redis::cluster::ClusterConnection>),
}

/// Checks that `url` (a list, for a Cluster or Sentinels) names Redis servers at all: a URL
/// that does not parse can never connect, so it is refused at start rather than retried
/// like a Redis that is down.
pub fn check_url(url: &str, topology: &Topology) -> Result<(), String> {
    let nodes: Vec<&str> = match topology {
        Topology::Single => vec![url],
        Topology::Cluster | Topology::Sentinel(_) => url.split(',').map(str::trim).collect(),
    };
    for node in nodes {
        if let Err(e) = redis::IntoConnectionInfo::into_connection_info(node) {
            return Err(format!("the Redis URL '{node}' does not parse: {e}"));
        }
    }
    Ok(())
}

impl Conn {
    /// Connects to `url` (`redis://…`, or a list, as `topology` says), each command
    /// bounded by `timeout`.
    pub fn open(url: &str, topology: &Topology, timeout: Duration) -> redis::RedisResult<Conn> {
        let nodes = || url.split(',').map(str::trim).collect::<Vec<&str>>();
        let client = match topology {
            Topology::Cluster => {
                let client = redis::cluster::ClusterClient::builder(nodes())
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .retries(0)
                    .build()?;
                return Ok(Conn::Cluster(Box::new(client.get_connection()?)));
            }
            Topology::Single => redis::Client::open(url)?,
            Topology::Sentinel(primary) => return Self::primary(&nodes(), primary, timeout),
        };
        Ok(Conn::Single(timed(client, timeout)?))
    }

    /// Connects to the primary the Sentinels name `name`, asking each in turn until one
    /// names a Redis that says it is primary (the Sentinel clients' protocol), every
    /// connection and command bounded by `timeout`: a Sentinel that hangs costs that much
    /// and the next is asked. (redis-rs's own Sentinel client connects without a timeout.)
    fn primary(sentinels: &[&str], name: &str, timeout: Duration) -> redis::RedisResult<Conn> {
        let mut last = None;
        for sentinel in sentinels {
            let info = redis::IntoConnectionInfo::into_connection_info(*sentinel)?;
            let named = timed(redis::Client::open(info.clone())?, timeout).and_then(|mut c| {
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(name)
                    .query::<Option<(String, u16)>>(&mut c)
            });
            let (host, port) = match named {
                Ok(Some(address)) => address,
                Ok(None) => {
                    last = Some(redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "a Sentinel does not know the primary",
                        format!("{sentinel} has no primary named {name}"),
                    )));
                    continue;
                }
                Err(e) => {
                    last = Some(e);
                    continue;
                }
            };
            let primary = info.set_addr(redis::ConnectionAddr::Tcp(host, port));
            let checked = timed(redis::Client::open(primary)?, timeout).and_then(|mut c| {
                let role: Vec<Value> = redis::cmd("ROLE").query(&mut c)?;
                match role.first() {
                    Some(Value::BulkString(role)) if role.as_slice() == b"master" => Ok(c),
                    _ => Err(redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "the Redis a Sentinel named is not primary (yet)",
                    ))),
                }
            });
            match checked {
                Ok(conn) => return Ok(Conn::Single(conn)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            redis::RedisError::from((redis::ErrorKind::Client, "no Sentinel given"))
        }))
    }

    pub fn link(&mut self) -> &mut dyn ConnectionLike {
        match self {
            Conn::Single(c) => c,
            Conn::Cluster(c) => &mut **c,
        }
    }

    fn set_read_timeout(&self, timeout: Duration) -> redis::RedisResult<()> {
        match self {
            Conn::Single(c) => c.set_read_timeout(Some(timeout)),
            Conn::Cluster(c) => c.set_read_timeout(Some(timeout)),
        }
    }
}

/// How late Redis may end a blocked command's own wait (`BLPOP`'s, `WAIT`'s): it looks at
/// blocked clients' deadlines in its timer, every 1000/`hz` ms, so on an idle Redis at the
/// default `hz` of 10 a 20 ms wait is answered after about 100 ms. This covers `hz` down to 4.
const BLOCKED_WAIT_LATE: Duration = Duration::from_millis(250);

/// A connection to `client` whose connect, reads and writes are each bounded by `timeout`.
fn timed(client: redis::Client, timeout: Duration) -> redis::RedisResult<redis::Connection> {
    let conn = client.get_connection_with_timeout(timeout)?;
    conn.set_read_timeout(Some(timeout))?;
    conn.set_write_timeout(Some(timeout))?;
    Ok(conn)
}

/// A connection made when first needed, and made again after one fails.
pub struct Link {
    url: String,
    topology: Topology,
    timeout: Duration,
    conn: Option<Conn>,
}

impl Link {
    pub fn new(url: String, topology: Topology, timeout: Duration) -> Link {
        Link {
            url,
            topology,
            timeout,
            conn: None,
        }
    }

    pub fn get(&mut self) -> Result<&mut Conn, LogError> {
        if self.conn.is_none() {
            self.conn = Some(Conn::open(&self.url, &self.topology, self.timeout)?);
        }
        Ok(self.conn.as_mut().expect("invariant: connected just above"))
    }

    /// A connection of its own to the same Redis, each command bounded by `timeout`.
    pub fn separate(&self, timeout: Duration) -> Result<Conn, LogError> {
        Ok(Conn::open(&self.url, &self.topology, timeout)?)
    }

    /// The connection, if one is open.
    pub fn open(&mut self) -> Option<&mut Conn> {
        self.conn.as_mut()
    }

    /// Drops a connection that failed (it may be left mid-reply).
    pub fn reset(&mut self) {
        self.conn = None;
    }

    /// Runs `cmd`, which Redis answers when its own wait of `wait` ends, with the reply
    /// awaited that much longer than other commands' (and as late as Redis may end it,
    /// [`BLOCKED_WAIT_LATE`]): a wait that ends as asked is an answer, not a Redis that
    /// stopped answering.
    fn blocking<T: redis::FromRedisValue>(
        &mut self,
        cmd: &redis::Cmd,
        wait: Duration,
    ) -> Result<T, LogError> {
        let timeout = self.timeout;
        let conn = self.get()?;
        let answer = conn
            .set_read_timeout(timeout + wait + BLOCKED_WAIT_LATE)
            .and_then(|()| cmd.query(conn.link()));
        // A connection left with the long timeout (or mid-reply) is not used again.
        if answer.is_err() || conn.set_read_timeout(timeout).is_err() {
            self.reset();
        }
        Ok(answer?)
    }
}

/// The names of one ledger's keys.
#[derive(Debug, Clone)]
pub struct Keys {
    namespace: String,
    pub marker: String,
    pub version: String,
    pub log: String,
    pub lease: String,
    pub want: String,
    /// A token for the instance whose turn is next, pushed when the holder gives the lease
    /// up: that instance blocks on it instead of asking again and again.
    pub turn: String,
    /// The snapshot the log starts after (a hash: its name, version, parts, time, size).
    pub snapshot: String,
    /// Names of snapshots whose parts may be in Redis besides the current one's (being
    /// written, or replaced): the compactor deletes them.
    pub pending: String,
    /// The compactor's lock: one instance compacts at a time.
    pub compacting: String,
    /// The secret an instance proves it is one of the ledger's when it hands a request to
    /// the lease's holder (written once, by the first instance to look for it).
    pub peers: String,
}

impl Keys {
    pub fn new(namespace: &str) -> Keys {
        let key = |name: &str| format!("{{{namespace}}}:{name}");
        Keys {
            namespace: namespace.to_string(),
            marker: key("marker"),
            version: key("version"),
            log: key("log"),
            lease: key("lease"),
            want: key("want"),
            turn: key("turn"),
            snapshot: key("snapshot"),
            pending: key("snapshot-pending"),
            compacting: key("compacting"),
            peers: key("peers"),
        }
    }

    /// Part `i` of the snapshot named `name`.
    pub fn snapshot_part(&self, name: &str, i: u64) -> String {
        format!("{{{}}}:snapshot:{name}:{i}", self.namespace)
    }

    /// The stream of one kind of history taken out of the log.
    pub fn history(&self, kind: &str) -> String {
        format!("{{{}}}:history:{kind}", self.namespace)
    }

    /// Every key of the ledger but its snapshots' parts.
    #[cfg(any(test, feature = "testing"))]
    pub fn fixed(&self) -> Vec<String> {
        let mut keys = vec![
            self.marker.clone(),
            self.version.clone(),
            self.log.clone(),
            self.lease.clone(),
            self.want.clone(),
            self.turn.clone(),
            self.snapshot.clone(),
            self.pending.clone(),
            self.compacting.clone(),
            self.peers.clone(),
        ];
        keys.extend(super::compaction::HistoryKind::ALL.map(|k| self.history(k.name())));
        keys
    }
}

/// What a write or a lease request found, other than success.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The ledger's marker is gone: Redis lost its data (flushed, or restarted without its
    /// persistence). Nothing is served from an empty ledger.
    #[error("the ledger's marker is gone from Redis (flushed, or restarted without its data): refusing to serve")]
    Wiped,
    /// Another instance holds the writer's lease.
    #[error("another instance holds the writer's lease")]
    Lease,
    /// The log moved on since this instance last read it.
    #[error("the log is at {0}, not where this instance's round starts")]
    Stale(u64),
    /// The compactor's lock lapsed (this compaction stalled past its time to live) and
    /// another instance may compact now.
    #[error("the compactor's lock lapsed: another instance may compact")]
    CompactorLock,
}

/// A failure to talk to Redis, or what it refused.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{0}")]
    Refused(#[from] Refused),
    #[error("redis: {}", described(.0))]
    Redis(#[from] redis::RedisError),
    #[error("{0}")]
    Corrupt(String),
    /// The log no longer holds the records after the one asked for: a compaction replaced
    /// them by a snapshot, to be read instead.
    #[error("the log was compacted past record {0}: reading the ledger from its snapshot")]
    Compacted(u64),
}

/// A Redis error as an operator reads it: a timeout says which setting it ran into (the
/// socket's own words are "Resource temporarily unavailable").
fn described(e: &redis::RedisError) -> String {
    match e.is_timeout() {
        true => format!("no answer in time, see --redis-timeout-ms ({e})"),
        false => e.to_string(),
    }
}

impl LogError {
    /// Whether the command may have run although no answer came (a timeout, a dropped
    /// connection): its outcome is unknown until the log is read again.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            LogError::Redis(e) => {
                !e.is_connection_refusal()
                    && (e.is_timeout() || e.is_connection_dropped() || e.is_io_error())
            }
            _ => false,
        }
    }
}

/// The scripts, loaded by SHA and sent again when Redis answers NOSCRIPT.
pub struct Scripts {
    init: Script,
    acquire: Script,
    commit: Script,
    release: Script,
}

impl Default for Scripts {
    fn default() -> Self {
        Scripts {
            init: Script::new(include_str!("init.lua")),
            acquire: Script::new(include_str!("acquire.lua")),
            commit: Script::new(include_str!("commit.lua")),
            release: Script::new(include_str!("release.lua")),
        }
    }
}

/// The lease's answer.
pub enum Lease {
    /// Held by this instance; the log is at `version`, and Redis's clock read `redis_ms`.
    Held { version: u64, redis_ms: i64 },
    /// Held by another for `left_ms` more milliseconds (0: free, but another instance's
    /// turn is next); `next`: this instance's turn is next (it is woken through `turn`).
    Busy { left_ms: u64, next: bool },
}

/// One ledger's log, as one instance sees it.
pub struct Log {
    pub keys: Keys,
    /// Who this instance is, as its lease names it.
    pub holder: String,
    scripts: Scripts,
}

fn status(reply: &[Value]) -> Result<String, LogError> {
    match reply.first() {
        Some(v) => redis::from_redis_value_ref::<String>(v).map_err(|e| LogError::Redis(e.into())),
        None => Err(LogError::Corrupt("an empty reply from a script".into())),
    }
}

fn field<T: redis::FromRedisValue>(reply: &[Value], i: usize) -> Result<T, LogError> {
    match reply.get(i) {
        Some(v) => redis::from_redis_value_ref::<T>(v).map_err(|e| LogError::Redis(e.into())),
        None => Err(LogError::Corrupt(format!(
            "a script's reply lacks field {i}"
        ))),
    }
}

impl Log {
    pub fn new(namespace: &str, holder: String) -> Log {
        Log {
            keys: Keys::new(namespace),
            holder,
            scripts: Scripts::default(),
        }
    }

    /// Finds the ledger's marker, or marks a new ledger with `new` when `create` (an instance
    /// that has served a ledger never creates another: an empty Redis is then a wiped one).
    /// Answers the marker and whether it is new.
    pub fn init(
        &self,
        conn: &mut Conn,
        new: &str,
        create: bool,
    ) -> Result<(String, bool), LogError> {
        let k = &self.keys;
        let reply: Vec<Value> = self
            .scripts
            .init
            .key(&k.marker)
            .key(&k.version)
            .key(&k.log)
            .arg(new)
            .arg(if create { "create" } else { "find" })
            .invoke(conn.link())?;
        match status(&reply)?.as_str() {
            "OK" => Ok((field(&reply, 1)?, false)),
            "NEW" => Ok((field(&reply, 1)?, true)),
            "WIPED" => Err(Refused::Wiped.into()),
            _ => Err(LogError::Corrupt(
                "the ledger's log is in Redis without its marker: keys were lost (evicted, or \
                 partly restored); refusing to serve it"
                    .into(),
            )),
        }
    }

    /// Waits (at most `timeout`) until `replicas` replicas hold every write this connection
    /// made; answers how many do.
    pub fn wait_replicas(
        &self,
        link: &mut Link,
        replicas: u32,
        timeout: Duration,
    ) -> Result<u32, LogError> {
        let ms = timeout.as_millis().max(1) as u64;
        link.blocking(::redis::cmd("WAIT").arg(replicas).arg(ms), timeout)
    }

    /// How many replicas Redis has connected now (`INFO replication`).
    pub fn connected_replicas(&self, conn: &mut Conn) -> Result<u32, LogError> {
        let info: String = ::redis::cmd("INFO").arg("replication").query(conn.link())?;
        Ok(info
            .lines()
            .find_map(|line| line.strip_prefix("connected_slaves:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0))
    }

    /// Whether another instance is waiting for the lease.
    pub fn wanted(&self, conn: &mut Conn) -> Result<bool, LogError> {
        Ok(::redis::cmd("EXISTS")
            .arg(&self.keys.want)
            .query(conn.link())?)
    }

    pub fn acquire(&self, conn: &mut Conn, lease: Duration) -> Result<Lease, LogError> {
        let k = &self.keys;
        let reply: Vec<Value> = self
            .scripts
            .acquire
            .key(&k.marker)
            .key(&k.version)
            .key(&k.lease)
            .key(&k.want)
            .key(&k.turn)
            .arg(&self.holder)
            .arg(lease.as_millis() as u64)
            .arg(WANT_MS)
            .invoke(conn.link())?;
        match status(&reply)?.as_str() {
            "OK" => Ok(Lease::Held {
                version: parse_u64(&field::<String>(&reply, 1)?)?,
                redis_ms: millis(&field::<String>(&reply, 2)?, &field::<String>(&reply, 3)?)?,
            }),
            "HELD" => Ok(Lease::Busy {
                left_ms: field::<String>(&reply, 1)?
                    .parse::<i64>()
                    .unwrap_or(0)
                    .max(0) as u64,
                next: field::<i64>(&reply, 2)? == 1,
            }),
            "WIPED" => Err(Refused::Wiped.into()),
            other => Err(LogError::Corrupt(format!("acquire answered {other}"))),
        }
    }

    /// Appends a round (`frames`, the records after `expected` up to `upto`); answers
    /// whether another instance is waiting for the lease.
    pub fn commit(
        &self,
        conn: &mut Conn,
        expected: u64,
        upto: u64,
        lease: Duration,
        frames: &[u8],
    ) -> Result<bool, LogError> {
        let k = &self.keys;
        let reply: Vec<Value> = self
            .scripts
            .commit
            .key(&k.marker)
            .key(&k.version)
            .key(&k.log)
            .key(&k.lease)
            .key(&k.want)
            .arg(&self.holder)
            .arg(expected.to_string())
            .arg(upto)
            .arg(lease.as_millis() as u64)
            .arg(frames)
            .invoke(conn.link())?;
        match status(&reply)?.as_str() {
            "OK" => Ok(field::<i64>(&reply, 1)? == 1),
            "WIPED" => Err(Refused::Wiped.into()),
            "LEASE" => Err(Refused::Lease.into()),
            "STALE" => Err(Refused::Stale(parse_u64(&field::<String>(&reply, 1)?)?).into()),
            other => Err(LogError::Corrupt(format!("commit answered {other}"))),
        }
    }

    /// Gives the lease up, waking the instance whose turn is next.
    pub fn release(&self, conn: &mut Conn) -> Result<(), LogError> {
        let k = &self.keys;
        let _: i64 = self
            .scripts
            .release
            .key(&k.lease)
            .key(&k.want)
            .key(&k.turn)
            .arg(&self.holder)
            .arg(WANT_MS)
            .invoke(conn.link())?;
        Ok(())
    }

    /// Waits, at most `block`, for the holder to give the lease up to this instance, whose
    /// turn is next; answers whether it did (else the lease may still lapse, or the word
    /// must be renewed: the caller asks again either way).
    pub fn await_turn(&self, link: &mut Link, block: Duration) -> Result<bool, LogError> {
        let seconds = block.as_millis().max(1) as f64 / 1000.0;
        let popped: Option<(String, String)> = link.blocking(
            ::redis::cmd("BLPOP").arg(&self.keys.turn).arg(seconds),
            block,
        )?;
        Ok(popped.is_some())
    }

    /// Redis's clock, in milliseconds.
    pub fn time(&self, conn: &mut Conn) -> Result<i64, LogError> {
        let (seconds, micros): (String, String) = ::redis::cmd("TIME").query(conn.link())?;
        millis(&seconds, &micros)
    }

    /// The log's version (the last sequence number in it), and who holds the lease, if
    /// anyone does (both keys share the slot, so one command reads them on a Cluster too).
    pub fn version_and_holder(&self, conn: &mut Conn) -> Result<(u64, Option<String>), LogError> {
        let (version, holder): (Option<String>, Option<String>) = ::redis::cmd("MGET")
            .arg(&self.keys.version)
            .arg(&self.keys.lease)
            .query(conn.link())?;
        Ok((version.map_or(Ok(0), |v| parse_u64(&v))?, holder))
    }

    /// The ledger's secret among its instances (see [`Keys::peers`]), made `new` if it has
    /// none yet.
    pub fn peer_secret(&self, conn: &mut Conn, new: &str) -> Result<String, LogError> {
        let _: Option<String> = ::redis::cmd("SET")
            .arg(&self.keys.peers)
            .arg(new)
            .arg("NX")
            .query(conn.link())?;
        let secret: Option<String> = ::redis::cmd("GET")
            .arg(&self.keys.peers)
            .query(conn.link())?;
        secret.ok_or_else(|| LogError::Corrupt("the ledger's peer secret vanished".into()))
    }

    /// Reads every record after `after`, in order, up to the log's end as of the read;
    /// answers the last sequence number read (`after` when there was none).
    pub fn read_after(
        &self,
        conn: &mut Conn,
        after: u64,
        mut each: impl FnMut(JournalRecord),
    ) -> Result<u64, LogError> {
        let mut last = after;
        loop {
            let page: ::redis::streams::StreamRangeReply = ::redis::cmd("XRANGE")
                .arg(&self.keys.log)
                .arg(format!("({last}-0"))
                .arg("+")
                .arg("COUNT")
                .arg(READ_PAGE)
                .query(conn.link())?;
            if page.ids.is_empty() {
                if last == after {
                    // Nothing after `after`: the log may end there, or have been compacted
                    // past it with nothing appended since.
                    return match super::compaction::pointer(conn, &self.keys)? {
                        Some(pointer) if pointer.version > after => Err(LogError::Compacted(after)),
                        _ => Ok(last),
                    };
                }
                return Ok(last);
            }
            for entry in &page.ids {
                let frames: Vec<u8> = entry.get("r").ok_or_else(|| {
                    LogError::Corrupt(format!("log entry {} has no records", entry.id))
                })?;
                last = match decode_round(&frames, last, &mut each)? {
                    Round::Read(last) => last,
                    Round::Gap { last, next } => return Err(self.gap(conn, last, next)),
                };
            }
        }
    }

    /// What records missing after `last` mean: a compaction removed them, or the log is
    /// damaged.
    fn gap(&self, conn: &mut Conn, last: u64, next: u64) -> LogError {
        match super::compaction::pointer(conn, &self.keys) {
            Ok(Some(pointer)) if pointer.version > last => LogError::Compacted(last),
            Ok(_) => LogError::Corrupt(format!(
                "the log continues at record {next} after {last}: records are missing"
            )),
            Err(e) => e,
        }
    }
}

/// What a log entry held.
enum Round {
    /// Records continuing from the last one read, up to this one.
    Read(u64),
    /// Records missing: the last one read, and the next one found.
    Gap { last: u64, next: u64 },
}

/// Decodes one log entry's records, which must continue from `last`.
fn decode_round(
    frames: &[u8],
    mut last: u64,
    each: &mut impl FnMut(JournalRecord),
) -> Result<Round, LogError> {
    let mut gap = None;
    read_frames(frames, "log", |record| {
        if record.seq != last + 1 {
            gap = Some(record.seq);
            return false;
        }
        last = record.seq;
        each(record);
        true
    })?;
    Ok(match gap {
        Some(next) => Round::Gap { last, next },
        None => Round::Read(last),
    })
}

/// Reads a stream entry's records (journal frames, as a journal segment holds them after
/// its header) until `each` answers false; `what` names the stream in errors.
pub fn read_frames(
    frames: &[u8],
    what: &str,
    mut each: impl FnMut(JournalRecord) -> bool,
) -> Result<(), LogError> {
    // Read as a journal segment: its header, then the entry's frames (not copied).
    let header = segment_header();
    let len = (header.len() + frames.len()) as u64;
    let mut stopped = false;
    let valid = read_records(&mut header.chain(frames), len, 0, |record| {
        stopped = !each(record);
        !stopped
    })
    .map_err(|e| LogError::Corrupt(format!("a {what} entry holds {e} this build cannot read")))?;
    if !stopped && valid != Some(len) {
        return Err(LogError::Corrupt(format!("a {what} entry is damaged")));
    }
    Ok(())
}

/// Milliseconds from `TIME`'s seconds and microseconds.
fn millis(seconds: &str, micros: &str) -> Result<i64, LogError> {
    let number = |text: &str| {
        text.parse::<i64>()
            .map_err(|_| LogError::Corrupt(format!("Redis's TIME answered {text:?}")))
    };
    Ok(number(seconds)? * 1_000 + number(micros)? / 1_000)
}

fn parse_u64(text: &str) -> Result<u64, LogError> {
    text.parse()
        .map_err(|_| LogError::Corrupt(format!("a version that is not a number: {text:?}")))
}

/// The Redis settings this engine depends on, as read at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub appendonly: String,
    pub appendfsync: String,
    pub maxmemory_policy: String,
}

impl Settings {
    pub fn read(conn: &mut Conn) -> Result<Settings, LogError> {
        let mut get = |name: &str| -> Result<String, LogError> {
            let pair: Vec<String> = redis::cmd("CONFIG")
                .arg("GET")
                .arg(name)
                .query(conn.link())?;
            Ok(pair.get(1).cloned().unwrap_or_default())
        };
        Ok(Settings {
            appendonly: get("appendonly")?,
            appendfsync: get("appendfsync")?,
            maxmemory_policy: get("maxmemory-policy")?,
        })
    }
}
