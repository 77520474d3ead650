//! The embedded engine's history store: one SQLite file beside the journal.
//!
//! SQLite, not a key-value store, because the audit log's queries are many filters in any
//! combination, sorted by any of six columns, and an index per ordering turns each page into
//! an index walk (O(page), not O(entries)) with no query planner of our own. It runs in WAL
//! mode, so readers never wait for the writer, and with `synchronous = FULL`: a commit is on
//! disk when `append` returns, which is what lets the journal be pruned behind it. Its page
//! cache is bounded, so memory does not grow with the history.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ledger::{
    ArchiveLookup, Archived, AuditEntry, AuditPage, AuditQuery, AuditSort, DeliveryPage,
    DeliveryQuery, Event, EventPage, EventQuery, ListReservations, ReservationPage, SortValue,
    StatusFilter,
};
use ledger::{Position, UNAUTH_TENANT};
use rusqlite::types::Value;
use rusqlite::{params, Connection, OptionalExtension, Row};

use super::{events_sql, reservations_sql};
use super::{Cutoffs, History, Item};

pub const FILE_NAME: &str = "history.sqlite";

/// Pages of SQLite's cache per connection (negative: KiB), so memory stays flat however large
/// the history grows.
const CACHE_KIB: i64 = 8 * 1024;
/// The size the WAL is cut back to after a checkpoint.
const WAL_LIMIT_BYTES: i64 = 32 << 20;
/// Rows deleted per transaction by retention, so the writer never holds the file for long.
const EXPIRY_CHUNK: i64 = 10_000;
/// A status filter matching at most this many entries is walked through the status index
/// (its matches sorted by time: a bounded sort); one matching more walks the time index,
/// where matches are then dense enough to fill a page quickly. SQLite cannot tell the two
/// apart by itself (it has no statistics on ranges), and picks the time index for both, so
/// that "the refusals" of a large log scanned all of it.
const SPARSE_STATUS_ROWS: u64 = 20_000;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY,
    record_seq INTEGER NOT NULL,
    log_id TEXT NOT NULL,
    ts INTEGER NOT NULL,
    tenant_id TEXT NOT NULL,
    key_id TEXT NOT NULL,
    user_agent TEXT,
    source_ip TEXT,
    operation TEXT NOT NULL,
    resource_type TEXT NOT NULL,
    resource_id TEXT,
    request_id TEXT,
    trace_id TEXT,
    status INTEGER NOT NULL,
    error_code TEXT,
    metadata TEXT
);
CREATE INDEX IF NOT EXISTS audit_ts ON audit (ts);
CREATE INDEX IF NOT EXISTS audit_record ON audit (record_seq);
CREATE INDEX IF NOT EXISTS audit_tenant ON audit (tenant_id, ts);
CREATE INDEX IF NOT EXISTS audit_key ON audit (key_id, ts);
CREATE INDEX IF NOT EXISTS audit_operation ON audit (operation, ts);
CREATE INDEX IF NOT EXISTS audit_resource_type ON audit (resource_type, ts);
CREATE INDEX IF NOT EXISTS audit_status ON audit (status, ts);
CREATE INDEX IF NOT EXISTS audit_error ON audit (error_code, ts);
CREATE INDEX IF NOT EXISTS audit_resource ON audit (resource_id);
CREATE INDEX IF NOT EXISTS audit_request ON audit (request_id);
CREATE INDEX IF NOT EXISTS audit_trace ON audit (trace_id);
";

const COLUMNS: &str = "seq, log_id, ts, tenant_id, key_id, user_agent, source_ip, operation, \
    resource_type, resource_id, request_id, trace_id, status, error_code, metadata";

pub struct SqliteHistory {
    writer: Arc<Mutex<Connection>>,
    /// A second connection on a file (WAL: reads never wait for the writer); the writer's own
    /// in memory, where there is nothing to share between connections.
    reader: Arc<Mutex<Connection>>,
    /// A third, for the point reads of archived reservations, which are made in place on a
    /// request's thread: they never wait behind a page of a listing or of the audit log.
    point_reader: Arc<Mutex<Connection>>,
    /// The held sequence number, as last written (read without touching the file).
    held: AtomicU64,
    /// Audit entries held: counted once at open, then kept by appends and retention.
    entries: AtomicU64,
    /// Entries by status, kept the same way: what a status filter matches, to pick its
    /// index by.
    statuses: Mutex<BTreeMap<u16, u64>>,
    /// Events held: counted at open, then kept by appends and retention.
    events: AtomicU64,
    /// Archived reservations held: kept in `meta` by the writes that change it (counting
    /// millions of rows at every start would make a restart scale with history).
    archived: AtomicU64,
}

fn sql_error(e: rusqlite::Error) -> io::Error {
    io::Error::other(format!("history store: {e}"))
}

fn lock(connection: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    connection.lock().unwrap_or_else(|e| e.into_inner())
}

impl SqliteHistory {
    pub fn open(path: &Path) -> io::Result<Self> {
        // Created owner-only, like the rest of the data directory; SQLite gives its WAL and
        // shared-memory files the database file's permissions.
        if !path.exists() {
            crate::embedded::private_file()
                .write(true)
                .create_new(true)
                .open(path)?;
        }
        let open = || Connection::open(path).map_err(sql_error);
        let writer = open()?;
        writer
            .pragma_update(None, "journal_mode", "WAL")
            .map_err(sql_error)?;
        writer
            .pragma_update(None, "synchronous", "FULL")
            .map_err(sql_error)?;
        // A checkpoint that a reader held back lets the WAL grow; this cuts it back after.
        writer
            .pragma_update(None, "journal_size_limit", WAL_LIMIT_BYTES)
            .map_err(sql_error)?;
        Self::with(writer, Some((open()?, open()?)))
    }

    /// A history that lives in memory, for an engine that keeps nothing on disk.
    pub fn in_memory() -> io::Result<Self> {
        Self::with(Connection::open_in_memory().map_err(sql_error)?, None)
    }

    /// With `readers` `None`, reads share the writer's connection.
    fn with(writer: Connection, readers: Option<(Connection, Connection)>) -> io::Result<Self> {
        let connections = readers.iter().flat_map(|(a, b)| [a, b]);
        for c in std::iter::once(&writer).chain(connections) {
            c.pragma_update(None, "cache_size", -CACHE_KIB)
                .map_err(sql_error)?;
            c.busy_timeout(std::time::Duration::from_secs(10))
                .map_err(sql_error)?;
        }
        writer.execute_batch(SCHEMA).map_err(sql_error)?;
        writer
            .execute_batch(events_sql::SCHEMA)
            .map_err(sql_error)?;
        writer
            .execute_batch(reservations_sql::SCHEMA)
            .map_err(sql_error)?;
        let archived = meta(&writer, "archived")?;
        let events: i64 = writer
            .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
            .map_err(sql_error)?;
        let held = meta(&writer, "held_seq")?;
        let mut statuses = BTreeMap::new();
        {
            let mut by_status = writer
                .prepare("SELECT status, count(*) FROM audit GROUP BY status")
                .map_err(sql_error)?;
            let rows = by_status
                .query_map([], |r| Ok((r.get::<_, u16>(0)?, r.get::<_, i64>(1)?)))
                .map_err(sql_error)?;
            for row in rows {
                let (status, n) = row.map_err(sql_error)?;
                statuses.insert(status, n as u64);
            }
        }
        let entries: u64 = statuses.values().sum();
        let writer = Arc::new(Mutex::new(writer));
        let (reader, point_reader) = match readers {
            Some((reader, point)) => (Arc::new(Mutex::new(reader)), Arc::new(Mutex::new(point))),
            None => (writer.clone(), writer.clone()),
        };
        Ok(SqliteHistory {
            reader,
            point_reader,
            writer,
            held: AtomicU64::new(held as u64),
            entries: AtomicU64::new(entries),
            statuses: Mutex::new(statuses),
            events: AtomicU64::new(events as u64),
            archived: AtomicU64::new(archived as u64),
        })
    }
}

impl History for SqliteHistory {
    fn append(&self, upto: u64, items: &[(u64, Item)]) -> io::Result<()> {
        let entries: Vec<(u64, &AuditEntry)> = items
            .iter()
            .filter_map(|(seq, item)| match item {
                Item::Audit(e) => Some((*seq, e)),
                _ => None,
            })
            .collect();
        let mut events = 0;
        let mut archived = 0;
        let mut writer = lock(&self.writer);
        let tx = writer.transaction().map_err(sql_error)?;
        {
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO audit (log_id, ts, tenant_id, key_id, user_agent, source_ip, \
                     operation, resource_type, resource_id, request_id, trace_id, status, \
                     error_code, metadata, record_seq) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
                )
                .map_err(sql_error)?;
            for (record_seq, e) in &entries {
                insert
                    .execute(params![
                        e.log_id,
                        e.timestamp_ms,
                        e.tenant_id,
                        e.key_id.as_deref().unwrap_or(""),
                        e.user_agent,
                        e.source_ip,
                        e.operation,
                        e.resource_type.as_deref().unwrap_or(""),
                        e.resource_id,
                        e.request_id,
                        e.trace_id,
                        e.status,
                        e.error_code,
                        e.metadata,
                        *record_seq as i64,
                    ])
                    .map_err(sql_error)?;
            }
            for (record_seq, item) in items {
                match item {
                    Item::Event(e) => {
                        events_sql::insert_event(&tx, *record_seq, e).map_err(sql_error)?;
                        events += 1;
                    }
                    Item::Delivery(d) => {
                        events_sql::upsert_delivery(&tx, *record_seq, d).map_err(sql_error)?
                    }
                    Item::Archived(a) => {
                        if reservations_sql::insert(&tx, *record_seq, a).map_err(sql_error)? {
                            archived += 1;
                        }
                    }
                    Item::Audit(_) => {}
                }
            }
            set_meta(&tx, "held_seq", upto as i64)?;
            if archived > 0 {
                let total = self.archived.load(Ordering::Acquire) + archived;
                set_meta(&tx, "archived", total as i64)?;
            }
        }
        tx.commit().map_err(sql_error)?;
        self.held.store(upto, Ordering::Release);
        self.archived.fetch_add(archived, Ordering::AcqRel);
        self.entries
            .fetch_add(entries.len() as u64, Ordering::AcqRel);
        self.events.fetch_add(events, Ordering::AcqRel);
        let mut statuses = self.statuses.lock().unwrap_or_else(|e| e.into_inner());
        for (_, e) in entries {
            *statuses.entry(e.status).or_default() += 1;
        }
        Ok(())
    }

    fn held_seq(&self) -> io::Result<u64> {
        Ok(self.held.load(Ordering::Acquire))
    }

    fn audit_page(&self, query: &AuditQuery) -> io::Result<AuditPage> {
        let sparse_status = self
            .status_matches(query.filter.status)
            .is_some_and(|n| n <= SPARSE_STATUS_ROWS);
        let (sql, values) = page_sql(query, sparse_status);
        let reader = lock(&self.reader);
        let mut statement = reader.prepare_cached(&sql).map_err(sql_error)?;
        let rows = statement
            .query_map(rusqlite::params_from_iter(values), entry_row)
            .map_err(sql_error)?;
        let mut entries = Vec::new();
        let mut positions = Vec::new();
        for row in rows {
            let (seq, entry) = row.map_err(sql_error)?;
            positions.push(position(query.sort, &entry, seq));
            entries.push(entry);
        }
        let next = if entries.len() > query.window.limit {
            entries.truncate(query.window.limit);
            positions.truncate(query.window.limit);
            positions.pop()
        } else {
            None
        };
        Ok(AuditPage { entries, next })
    }

    fn event_page(&self, query: &EventQuery) -> io::Result<EventPage> {
        events_sql::event_page(&lock(&self.reader), query).map_err(sql_error)
    }

    fn event(&self, event_id: &str) -> io::Result<Option<Event>> {
        events_sql::event(&lock(&self.reader), event_id).map_err(sql_error)
    }

    fn event_counts(&self, since_ms: ledger::Millis) -> io::Result<Vec<(String, u64)>> {
        events_sql::counts_since(&lock(&self.reader), since_ms).map_err(sql_error)
    }

    fn delivery_page(&self, query: &DeliveryQuery) -> io::Result<DeliveryPage> {
        events_sql::delivery_page(&lock(&self.reader), query).map_err(sql_error)
    }

    fn archived(&self, lookup: &ArchiveLookup) -> io::Result<Option<Archived>> {
        reservations_sql::lookup(&lock(&self.point_reader), lookup).map_err(sql_error)
    }

    fn index_keys(&self, needed: bool) -> io::Result<()> {
        reservations_sql::key_index(&lock(&self.writer), needed).map_err(sql_error)
    }

    fn archived_page(&self, tenant: &str, query: &ListReservations) -> io::Result<ReservationPage> {
        reservations_sql::page(&lock(&self.reader), tenant, query).map_err(sql_error)
    }

    fn expire(&self, cutoffs: Cutoffs) -> io::Result<u64> {
        let writer = lock(&self.writer);
        let mut deleted = 0;
        if let Some(cutoff) = cutoffs.settled {
            let n = delete_rows(&writer, reservations_sql::EXPIRE_SQL, cutoff)?;
            deleted += self.archived_gone(&writer, n)?;
        }
        // Each walks an index from its oldest end: no scan of what is kept.
        if let Some(cutoff) = cutoffs.events {
            let sql = "DELETE FROM events WHERE number IN (SELECT number FROM events                        WHERE ts < ?1 ORDER BY ts LIMIT ?2)";
            let n = delete_rows(&writer, sql, cutoff)?;
            self.events.fetch_sub(n, Ordering::AcqRel);
            deleted += n;
        }
        if let Some(cutoff) = cutoffs.deliveries {
            let sql = "DELETE FROM deliveries WHERE delivery_id IN (SELECT delivery_id                        FROM deliveries WHERE created_at < ?1 LIMIT ?2)";
            deleted += delete_rows(&writer, sql, cutoff)?;
        }
        let (authenticated, unauthenticated) = (cutoffs.authenticated, cutoffs.unauthenticated);
        if let Some(cutoff) = unauthenticated {
            let sql = format!(
                "DELETE FROM audit WHERE seq IN (SELECT seq FROM audit \
                 WHERE tenant_id = '{UNAUTH_TENANT}' AND ts < ?1 LIMIT ?2) RETURNING status"
            );
            deleted += self.delete_chunked(&writer, &sql, cutoff)?;
        }
        if let Some(cutoff) = authenticated {
            let sql = format!(
                "DELETE FROM audit WHERE seq IN (SELECT seq FROM audit WHERE ts < ?1 \
                 AND tenant_id <> '{UNAUTH_TENANT}' LIMIT ?2) RETURNING status"
            );
            deleted += self.delete_chunked(&writer, &sql, cutoff)?;
        }
        Ok(deleted)
    }

    fn trim_after(&self, seq: u64) -> io::Result<u64> {
        let writer = lock(&self.writer);
        let sql = "DELETE FROM audit WHERE seq IN (SELECT seq FROM audit WHERE record_seq > ?1 \
                   LIMIT ?2) RETURNING status";
        let mut deleted = self.delete_chunked(&writer, sql, seq as i64)?;
        let events = delete_rows(
            &writer,
            "DELETE FROM events WHERE number IN (SELECT number FROM events              WHERE record_seq > ?1 LIMIT ?2)",
            seq as i64,
        )?;
        self.events.fetch_sub(events, Ordering::AcqRel);
        deleted += events;
        // A delivery's row is its newest version, and its earlier ones are not kept apart:
        // a row written after `seq` goes whole. One still due is written again by its next
        // attempt; a final one's record is lost with the copy that was ahead.
        deleted += delete_rows(
            &writer,
            "DELETE FROM deliveries WHERE delivery_id IN (SELECT delivery_id FROM deliveries              WHERE record_seq > ?1 LIMIT ?2)",
            seq as i64,
        )?;
        let archived = delete_rows(&writer, reservations_sql::TRIM_SQL, seq as i64)?;
        deleted += self.archived_gone(&writer, archived)?;
        set_meta(&writer, "held_seq", seq as i64)?;
        self.held.store(seq, Ordering::Release);
        Ok(deleted)
    }

    fn audit_count(&self) -> u64 {
        self.entries.load(Ordering::Acquire)
    }

    fn event_count(&self) -> u64 {
        self.events.load(Ordering::Acquire)
    }

    fn archived_count(&self) -> u64 {
        self.archived.load(Ordering::Acquire)
    }
}

/// A counter or mark kept in `meta` (0 when never written).
fn meta(c: &Connection, name: &str) -> io::Result<i64> {
    Ok(
        c.query_row("SELECT value FROM meta WHERE name = ?1", [name], |r| {
            r.get::<_, i64>(0)
        })
        .optional()
        .map_err(sql_error)?
        .unwrap_or(0),
    )
}

fn set_meta(c: &Connection, name: &str, value: i64) -> io::Result<()> {
    c.execute(
        "INSERT INTO meta (name, value) VALUES (?1, ?2) \
         ON CONFLICT (name) DO UPDATE SET value = excluded.value",
        params![name, value],
    )
    .map_err(sql_error)?;
    Ok(())
}

/// Runs `sql` (a `DELETE … LIMIT ?2` with `?1` bound to `bound`) until it deletes less than a
/// chunk; answers how many rows went.
fn delete_rows(writer: &Connection, sql: &str, bound: i64) -> io::Result<u64> {
    let mut deleted = 0;
    loop {
        let n = writer
            .prepare_cached(sql)
            .and_then(|mut s| s.execute(params![bound, EXPIRY_CHUNK]))
            .map_err(sql_error)?;
        deleted += n as u64;
        if (n as i64) < EXPIRY_CHUNK {
            return Ok(deleted);
        }
    }
}

impl SqliteHistory {
    /// Counts `n` archived reservations deleted; answers `n`.
    fn archived_gone(&self, writer: &Connection, n: u64) -> io::Result<u64> {
        if n > 0 {
            let left = self
                .archived
                .fetch_sub(n, Ordering::AcqRel)
                .saturating_sub(n);
            set_meta(writer, "archived", left as i64)?;
        }
        Ok(n)
    }

    /// Runs `sql` (a `DELETE … LIMIT ?2 RETURNING status` with `?1` bound to `bound`) until
    /// it deletes less than a chunk, keeping the counts; answers how many rows went.
    fn delete_chunked(&self, writer: &Connection, sql: &str, bound: i64) -> io::Result<u64> {
        let mut gone: BTreeMap<u16, u64> = BTreeMap::new();
        let mut deleted = 0;
        loop {
            let mut statement = writer.prepare_cached(sql).map_err(sql_error)?;
            let rows = statement
                .query_map(params![bound, EXPIRY_CHUNK], |r| r.get::<_, u16>(0))
                .map_err(sql_error)?;
            let mut n = 0;
            for status in rows {
                *gone.entry(status.map_err(sql_error)?).or_default() += 1;
                n += 1;
            }
            deleted += n;
            if (n as i64) < EXPIRY_CHUNK {
                break;
            }
        }
        self.entries.fetch_sub(deleted, Ordering::AcqRel);
        let mut statuses = self.statuses.lock().unwrap_or_else(|e| e.into_inner());
        for (status, n) in gone {
            if let Some(count) = statuses.get_mut(&status) {
                *count = count.saturating_sub(n);
            }
        }
        Ok(deleted)
    }

    /// How many entries a status filter matches (`None`: there is no status filter).
    fn status_matches(&self, filter: StatusFilter) -> Option<u64> {
        let (min, max) = match filter {
            StatusFilter::Any => return None,
            StatusFilter::Exactly(s) => (s, s),
            StatusFilter::Between(min, max) => (min.unwrap_or(0), max.unwrap_or(u16::MAX)),
        };
        let statuses = self.statuses.lock().unwrap_or_else(|e| e.into_inner());
        Some(statuses.range(min..=max).map(|(_, n)| n).sum())
    }
}

fn column(sort: AuditSort) -> &'static str {
    match sort {
        AuditSort::Timestamp => "ts",
        AuditSort::Operation => "operation",
        AuditSort::ResourceType => "resource_type",
        AuditSort::TenantId => "tenant_id",
        AuditSort::KeyId => "key_id",
        AuditSort::Status => "status",
    }
}

/// The SQL of one page (one row more than the page, to know whether more follow) and its
/// parameters; with `sparse_status`, walked through the status index (see
/// [`SPARSE_STATUS_ROWS`]).
fn page_sql(query: &AuditQuery, sparse_status: bool) -> (String, Vec<Value>) {
    let f = &query.filter;
    let mut clauses: Vec<String> = Vec::new();
    let mut values: Vec<Value> = Vec::new();
    let bind = |values: &mut Vec<Value>, v: Value| {
        values.push(v);
        format!("?{}", values.len())
    };
    let text = |s: &str| Value::Text(s.to_string());
    for (col, value) in [
        ("tenant_id", &f.tenant_id),
        ("key_id", &f.key_id),
        ("resource_id", &f.resource_id),
        ("trace_id", &f.trace_id),
        ("request_id", &f.request_id),
    ] {
        if let Some(v) = value {
            let p = bind(&mut values, text(v));
            clauses.push(format!("{col} = {p}"));
        }
    }
    for (col, list, negate) in [
        ("operation", &f.operations, false),
        ("resource_type", &f.resource_types, false),
        ("error_code", &f.error_codes, false),
        ("error_code", &f.error_codes_excluded, true),
    ] {
        if list.is_empty() {
            continue;
        }
        let params: Vec<String> = list.iter().map(|v| bind(&mut values, text(v))).collect();
        let set = params.join(", ");
        // NOT IN passes a NULL error code (a success); IN never matches one.
        clauses.push(if negate {
            format!("({col} IS NULL OR {col} NOT IN ({set}))")
        } else {
            format!("{col} IN ({set})")
        });
    }
    match f.status {
        StatusFilter::Any => {}
        StatusFilter::Exactly(s) => {
            let p = bind(&mut values, Value::Integer(s.into()));
            clauses.push(format!("status = {p}"));
        }
        StatusFilter::Between(min, max) => {
            if let Some(min) = min {
                let p = bind(&mut values, Value::Integer(min.into()));
                clauses.push(format!("status >= {p}"));
            }
            if let Some(max) = max {
                let p = bind(&mut values, Value::Integer(max.into()));
                clauses.push(format!("status <= {p}"));
            }
        }
    }
    if let Some(from) = f.from_ms {
        let p = bind(&mut values, Value::Integer(from));
        clauses.push(format!("ts >= {p}"));
    }
    if let Some(to) = f.to_ms {
        let p = bind(&mut values, Value::Integer(to));
        clauses.push(format!("ts <= {p}"));
    }
    if let Some(search) = &f.search {
        let p = bind(&mut values, text(&search.to_lowercase()));
        clauses.push(format!(
            "(instr(lower(coalesce(resource_id, '')), {p}) > 0 OR instr(lower(log_id), {p}) > 0 \
             OR instr(lower(coalesce(error_code, '')), {p}) > 0 \
             OR instr(lower(operation), {p}) > 0)"
        ));
    }
    let col = column(query.sort);
    let (dir, cmp) = if query.window.descending {
        ("DESC", "<")
    } else {
        ("ASC", ">")
    };
    if let Some((value, seq)) = &query.window.after {
        let value = match value {
            SortValue::Int(v) => Value::Integer(*v),
            SortValue::Text(s) => text(s),
        };
        let v = bind(&mut values, value);
        let s = bind(&mut values, Value::Integer(seq.parse().unwrap_or(0)));
        clauses.push(format!("({col}, seq) {cmp} ({v}, {s})"));
    }
    let filter = if clauses.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", clauses.join(" AND "))
    };
    let limit = bind(&mut values, Value::Integer(query.window.limit as i64 + 1));
    (
        format!(
            "SELECT {COLUMNS} FROM audit{index}{filter} ORDER BY {col} {dir}, seq {dir} \
             LIMIT {limit}",
            index = if sparse_status {
                " INDEXED BY audit_status"
            } else {
                ""
            }
        ),
        values,
    )
}

fn entry_row(r: &Row<'_>) -> rusqlite::Result<(i64, AuditEntry)> {
    let some = |s: String| (!s.is_empty()).then_some(s);
    Ok((
        r.get(0)?,
        AuditEntry {
            log_id: r.get(1)?,
            timestamp_ms: r.get(2)?,
            tenant_id: r.get(3)?,
            key_id: some(r.get(4)?),
            user_agent: r.get(5)?,
            source_ip: r.get(6)?,
            operation: r.get(7)?,
            resource_type: some(r.get(8)?),
            resource_id: r.get(9)?,
            request_id: r.get(10)?,
            trace_id: r.get(11)?,
            status: r.get(12)?,
            error_code: r.get(13)?,
            metadata: r.get(14)?,
        },
    ))
}

/// An entry's position in `sort`'s order: the column's value, then its `seq`.
fn position(sort: AuditSort, e: &AuditEntry, seq: i64) -> Position {
    let text = |s: &Option<String>| SortValue::Text(s.clone().unwrap_or_default());
    let value = match sort {
        AuditSort::Timestamp => SortValue::Int(e.timestamp_ms),
        AuditSort::Status => SortValue::Int(e.status.into()),
        AuditSort::Operation => SortValue::Text(e.operation.clone()),
        AuditSort::ResourceType => text(&e.resource_type),
        AuditSort::TenantId => SortValue::Text(e.tenant_id.clone()),
        AuditSort::KeyId => text(&e.key_id),
    };
    (value, seq.to_string())
}
