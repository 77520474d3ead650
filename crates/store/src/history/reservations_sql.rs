//! Archived reservations in the embedded history file (see `ledger`'s `archive` module):
//! one row per settled reservation, its listing fields as columns with an index per listing
//! order, the reservation and its idempotency records as two postcard blobs (a listing
//! decodes only the first).
//!
//! Every index is paid for on the hot path (a row per lifecycle, by the history writer), so
//! only the reads need one. Rows are inserted in the order reservations are archived, which
//! is the order they settled (the sweep archives oldest first, and the ledger's clock never
//! steps back): retention walks the rowid order from its start, no index by settlement
//! time, and trimming the rows ahead of the journal (a history restored from a later copy)
//! walks it back from its end, no index by record.

use ledger::{
    position, ArchiveLookup, Archived, ListReservations, Millis, Reservation, ReservationPage,
    ReservationStatus, SortBy, SortValue, MAX_SCAN_PER_PAGE,
};
use rusqlite::types::Value;
use rusqlite::{params, Connection, OptionalExtension, Transaction};

pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS reservations (
    id TEXT NOT NULL UNIQUE,
    record_seq INTEGER NOT NULL,
    tenant_id TEXT NOT NULL,
    scope_path TEXT NOT NULL,
    status INTEGER NOT NULL,
    estimate INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    settled_at INTEGER NOT NULL,
    idempotency_key TEXT NOT NULL,
    reservation BLOB NOT NULL,
    records BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS reservations_tenant ON reservations (tenant_id, id);
CREATE INDEX IF NOT EXISTS reservations_scope ON reservations (tenant_id, scope_path, id);
CREATE INDEX IF NOT EXISTS reservations_status ON reservations (tenant_id, status, id);
CREATE INDEX IF NOT EXISTS reservations_estimate ON reservations (tenant_id, estimate, id);
CREATE INDEX IF NOT EXISTS reservations_created ON reservations (tenant_id, created_at, id);
CREATE INDEX IF NOT EXISTS reservations_expires ON reservations (tenant_id, expires_at, id);
CREATE INDEX IF NOT EXISTS reservations_status_created
    ON reservations (tenant_id, status, created_at, id);
";

/// The index of reserves' keys, for a reserve whose archived key has no time (read from a
/// format-4 or -5 snapshot): kept while the state holds such a key, dropped once none is
/// left ([`key_index`]). Every other lookup by key goes through `reservations_created`:
/// keys are random, so this index cost a random page write per archived reservation.
const KEY_INDEX: &str = "reservations_key";

/// Creates or drops the index of reserves' keys, as `needed` says (see [`KEY_INDEX`]).
pub fn key_index(c: &Connection, needed: bool) -> rusqlite::Result<()> {
    if needed {
        c.execute_batch(&format!(
            "CREATE INDEX IF NOT EXISTS {KEY_INDEX} ON reservations (tenant_id, idempotency_key)"
        ))
    } else {
        c.execute_batch(&format!("DROP INDEX IF EXISTS {KEY_INDEX}"))
    }
}

/// Rows read per query while a page is filled (a page's filters may skip many).
const CHUNK: usize = 256;

fn encode<T: serde::Serialize>(value: &T) -> rusqlite::Result<Vec<u8>> {
    postcard::to_stdvec(value).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> rusqlite::Result<T> {
    postcard::from_bytes(bytes).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Blob, Box::new(e))
    })
}

/// The value `r` has in `sort`'s order, as its column holds it.
fn column_value(r: &Reservation, sort: SortBy) -> Value {
    match position(r, sort).0 {
        SortValue::Int(v) => Value::Integer(v),
        SortValue::Text(t) => Value::Text(t),
    }
}

/// The column `sort` orders by (a listing is of one tenant, so by tenant is by id).
fn column(sort: SortBy) -> &'static str {
    match sort {
        SortBy::ReservationId | SortBy::Tenant => "id",
        SortBy::ScopePath => "scope_path",
        SortBy::Status => "status",
        SortBy::Reserved => "estimate",
        SortBy::CreatedAt => "created_at",
        SortBy::ExpiresAt => "expires_at",
    }
}

/// Adds (or, replayed from the journal again, replaces) an archived reservation; answers
/// whether it was new. A replaced row keeps its place (its rowid): rows stay in the order
/// of the records that archived them, which [`TRIM_SQL`] relies on.
pub fn insert(tx: &Transaction<'_>, record_seq: u64, a: &Archived) -> rusqlite::Result<bool> {
    let r = &a.reservation;
    let Some(settled_at) = r.settled_at_ms() else {
        return Ok(false);
    };
    let integer = |sort| match column_value(r, sort) {
        Value::Integer(v) => v,
        _ => 0,
    };
    let (reservation, records) = (encode(r)?, encode(&a.records)?);
    let row = params![
        &*r.reservation_id,
        record_seq as i64,
        &*r.tenant_id,
        &*r.scope_path,
        integer(SortBy::Status),
        r.estimate,
        r.created_at_ms,
        r.expires_at_ms,
        settled_at,
        &*r.idempotency_key,
        reservation,
        records,
    ];
    // Every column is non-null and nothing is checked but the id's uniqueness, so only an
    // existing id makes the insert do nothing.
    let inserted = tx
        .prepare_cached(
            "INSERT OR IGNORE INTO reservations (id, record_seq, tenant_id, scope_path, status, \
             estimate, created_at, expires_at, settled_at, idempotency_key, reservation, records) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        )?
        .execute(row)?;
    if inserted == 0 {
        tx.prepare_cached(
            "UPDATE reservations SET record_seq = ?2, tenant_id = ?3, scope_path = ?4, \
             status = ?5, estimate = ?6, created_at = ?7, expires_at = ?8, settled_at = ?9, \
             idempotency_key = ?10, reservation = ?11, records = ?12 WHERE id = ?1",
        )?
        .execute(row)?;
    }
    Ok(inserted == 1)
}

/// An archived row's two blobs: the reservation and its records.
type Blobs = (Vec<u8>, Vec<u8>);

/// The archived reservation `lookup` names.
pub fn lookup(c: &Connection, lookup: &ArchiveLookup) -> rusqlite::Result<Option<Archived>> {
    let blobs =
        |row: &rusqlite::Row<'_>| -> rusqlite::Result<Blobs> { Ok((row.get(0)?, row.get(1)?)) };
    let row = match lookup {
        ArchiveLookup::Reservation(id) => c
            .prepare_cached("SELECT reservation, records FROM reservations WHERE id = ?1")?
            .query_row([id], blobs)
            .optional()?,
        // The newest: a key is used again only once its earlier record's window is over.
        ArchiveLookup::CreatedBy {
            tenant,
            key,
            created_at,
            any_time,
        } => {
            let mut newest: Option<(Millis, Blobs)> = None;
            // Newest first: the first found is the newest of these.
            for at in created_at {
                let found = c
                    .prepare_cached(
                        "SELECT reservation, records FROM reservations \
                         WHERE tenant_id = ?1 AND created_at = ?2 AND idempotency_key = ?3 \
                         ORDER BY id DESC LIMIT 1",
                    )?
                    .query_row(params![&**tenant, at, &**key], blobs)
                    .optional()?;
                if let Some(found) = found {
                    newest = Some((*at, found));
                    break;
                }
            }
            if *any_time {
                let found = c
                    .prepare_cached(
                        "SELECT created_at, reservation, records FROM reservations \
                         WHERE tenant_id = ?1 AND idempotency_key = ?2 \
                         ORDER BY created_at DESC LIMIT 1",
                    )?
                    .query_row([&**tenant, &**key], |row| {
                        Ok((row.get::<_, Millis>(0)?, (row.get(1)?, row.get(2)?)))
                    })
                    .optional()?;
                if let Some(found) = found {
                    if newest.as_ref().is_none_or(|(at, _)| found.0 > *at) {
                        newest = Some(found);
                    }
                }
            }
            newest.map(|(_, row)| row)
        }
    };
    let Some((reservation, records)) = row else {
        return Ok(None);
    };
    Ok(Some(Archived {
        reservation: decode(&reservation)?,
        records: decode(&records)?,
    }))
}

/// One page of `tenant`'s archived reservations for `q`: in `q`'s order after its cursor,
/// walked through the order's index and filtered as the state's rows are, at most
/// [`MAX_SCAN_PER_PAGE`] rows examined. (A listing by create key is answered by the
/// ledger: the reserve's record names the row.)
pub fn page(
    c: &Connection,
    tenant: &str,
    q: &ListReservations,
) -> rusqlite::Result<ReservationPage> {
    let empty = ReservationPage {
        rows: Vec::new(),
        next: None,
        tenant: tenant.to_string(),
    };
    // Archived rows are settled: their status is final, whatever the time.
    let now = Millis::MAX;
    if q.status == Some(ReservationStatus::Active) || q.idempotency_key.is_some() {
        return Ok(empty);
    }
    let order_column = column(q.sort_by);
    let direction = if q.descending { "DESC" } else { "ASC" };
    let after = if q.descending { "<" } else { ">" };
    let mut clauses = vec!["tenant_id = ?".to_string()];
    let mut values: Vec<Value> = vec![Value::Text(tenant.to_string())];
    if let Some(status) = q.status {
        clauses.push("status = ?".into());
        values.push(Value::Integer(status as i64));
    }
    for (name, (from, to)) in [("created_at", q.created), ("expires_at", q.expires)] {
        if let Some(from) = from {
            clauses.push(format!("{name} >= ?"));
            values.push(Value::Integer(from));
        }
        if let Some(to) = to {
            clauses.push(format!("{name} <= ?"));
            values.push(Value::Integer(to));
        }
    }
    let mut cursor = q.after.clone();
    let mut rows = Vec::new();
    let mut scanned = 0;
    loop {
        let mut sql_clauses = clauses.clone();
        let mut sql_values = values.clone();
        if let Some((value, id)) = &cursor {
            let value = match value {
                SortValue::Int(v) => Value::Integer(*v),
                SortValue::Text(t) => Value::Text(t.clone()),
            };
            if order_column == "id" {
                sql_clauses.push(format!("id {after} ?"));
                sql_values.push(Value::Text(id.clone()));
            } else {
                sql_clauses.push(format!("({order_column}, id) {after} (?, ?)"));
                sql_values.push(value);
                sql_values.push(Value::Text(id.clone()));
            }
        }
        let sql = format!(
            "SELECT reservation FROM reservations WHERE {} ORDER BY {order_column} {direction}, \
             id {direction} LIMIT {CHUNK}",
            sql_clauses.join(" AND ")
        );
        let mut statement = c.prepare_cached(&sql)?;
        let blobs = statement
            .query_map(rusqlite::params_from_iter(sql_values), |row| {
                row.get::<_, Vec<u8>>(0)
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let exhausted = blobs.len() < CHUNK;
        for blob in blobs {
            if rows.len() == q.limit || scanned == MAX_SCAN_PER_PAGE {
                return Ok(ReservationPage {
                    rows,
                    next: cursor,
                    tenant: tenant.to_string(),
                });
            }
            let r: Reservation = decode(&blob)?;
            scanned += 1;
            cursor = Some(position(&r, q.sort_by));
            if q.matches(&r, now) {
                rows.push(r);
            }
        }
        if exhausted {
            // Every row after the cursor was examined: nothing more follows.
            return Ok(ReservationPage {
                rows,
                next: None,
                tenant: tenant.to_string(),
            });
        }
    }
}

/// Deletes archived reservations settled before `cutoff`, in chunks, from the oldest row
/// (rowid order: the order they settled) to the first one settled since.
pub const EXPIRE_SQL: &str = "DELETE FROM reservations WHERE rowid IN (SELECT rowid FROM \
     reservations WHERE rowid < coalesce((SELECT rowid FROM reservations WHERE settled_at >= ?1 \
     ORDER BY rowid LIMIT 1), 9223372036854775807) ORDER BY rowid LIMIT ?2)";

/// Deletes the reservations archived by journal records after `?1`, up to `?2` of them:
/// the rows after the last one of a record up to `?1`. Rows are in the order of the records
/// that archived them ([`insert`]), so those are exactly the ones to go, and finding them
/// walks back from the end over them alone: a history restored a few records ahead of its
/// journal is trimmed at once, however many rows it holds (a search by `record_seq` would
/// read the whole table, minutes for ten million rows, or cost every insert an index).
pub const TRIM_SQL: &str = "DELETE FROM reservations WHERE rowid IN (SELECT rowid FROM \
     reservations WHERE rowid > coalesce((SELECT rowid FROM reservations WHERE record_seq <= ?1 \
     ORDER BY rowid DESC LIMIT 1), 0) ORDER BY rowid DESC LIMIT ?2)";

#[cfg(test)]
mod tests {
    use super::*;

    fn has_key_index(c: &Connection) -> bool {
        c.query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = ?1",
            [KEY_INDEX],
            |r| r.get::<_, i64>(0),
        )
        .expect("query")
            == 1
    }

    /// The index of keys is made only while keys without times need it, and each call
    /// can be repeated (every start makes one).
    #[test]
    fn the_key_index_follows_what_the_state_needs() {
        let c = Connection::open_in_memory().expect("open");
        c.execute_batch(SCHEMA).expect("schema");
        assert!(!has_key_index(&c), "a new history has none");
        for needed in [true, true, false, false, true] {
            key_index(&c, needed).expect("index");
            assert_eq!(has_key_index(&c), needed);
        }
    }
}
