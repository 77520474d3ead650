//! The event log and the deliveries in the embedded history file: their tables, how they
//! are written, and their pages.
//!
//! An event's row is keyed by its number (ids increase with time, so the key order is the
//! time order and ties need no second column). A delivery's row is keyed by its id and
//! rewritten on every attempt (the journal records each version; the last one wins).

use ledger::{
    ActorKind, Delivery, DeliveryPage, DeliveryQuery, DeliveryStatus, Event, EventActor, EventPage,
    EventQuery, EventSort, EventType, Position, SortValue,
};
use rusqlite::types::Value;
use rusqlite::{params, Connection, OptionalExtension, Row, Transaction};

pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS events (
    number INTEGER PRIMARY KEY,
    record_seq INTEGER NOT NULL,
    event_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    category TEXT NOT NULL,
    ts INTEGER NOT NULL,
    tenant_id TEXT NOT NULL,
    scope TEXT NOT NULL,
    actor_type TEXT NOT NULL,
    actor_key_id TEXT,
    actor_source_ip TEXT,
    source TEXT NOT NULL,
    data TEXT NOT NULL,
    correlation_id TEXT,
    request_id TEXT,
    trace_id TEXT
);
CREATE INDEX IF NOT EXISTS events_record ON events (record_seq);
CREATE INDEX IF NOT EXISTS events_tenant ON events (tenant_id, number);
CREATE INDEX IF NOT EXISTS events_type ON events (event_type, number);
CREATE INDEX IF NOT EXISTS events_category ON events (category, number);
CREATE INDEX IF NOT EXISTS events_scope ON events (scope, number);
CREATE INDEX IF NOT EXISTS events_ts ON events (ts, number);
CREATE INDEX IF NOT EXISTS events_correlation ON events (correlation_id);
CREATE INDEX IF NOT EXISTS events_request ON events (request_id);
CREATE INDEX IF NOT EXISTS events_trace ON events (trace_id);
CREATE TABLE IF NOT EXISTS deliveries (
    delivery_id TEXT PRIMARY KEY,
    record_seq INTEGER NOT NULL,
    subscription_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    tenant_id TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    attempted_at INTEGER,
    completed_at INTEGER,
    attempts INTEGER NOT NULL,
    response_status INTEGER,
    response_time_ms INTEGER,
    error_message TEXT,
    next_attempt_at INTEGER NOT NULL,
    trace_id TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS deliveries_subscription ON deliveries (subscription_id, delivery_id);
CREATE INDEX IF NOT EXISTS deliveries_created ON deliveries (created_at);
CREATE INDEX IF NOT EXISTS deliveries_record ON deliveries (record_seq);
";

const EVENT_COLUMNS: &str =
    "event_id, event_type, ts, tenant_id, scope, actor_type, actor_key_id, \
    actor_source_ip, source, data, correlation_id, request_id, trace_id";

pub fn insert_event(tx: &Transaction<'_>, record_seq: u64, e: &Event) -> rusqlite::Result<()> {
    let Some(number) = Event::number(&e.event_id) else {
        return Ok(());
    };
    tx.prepare_cached(
        "INSERT OR REPLACE INTO events (number, record_seq, event_id, event_type, category, ts, \
         tenant_id, scope, actor_type, actor_key_id, actor_source_ip, source, data, \
         correlation_id, request_id, trace_id) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
    )?
    .execute(params![
        number as i64,
        record_seq as i64,
        e.event_id,
        e.event_type.name(),
        e.category().name(),
        e.timestamp_ms,
        e.tenant_id,
        e.scope.as_deref().unwrap_or(""),
        e.actor.kind.name(),
        e.actor.key_id,
        e.actor.source_ip,
        e.source,
        e.data,
        e.correlation_id,
        e.request_id,
        e.trace_id,
    ])?;
    Ok(())
}

pub fn upsert_delivery(
    tx: &Transaction<'_>,
    record_seq: u64,
    d: &Delivery,
) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT OR REPLACE INTO deliveries (delivery_id, record_seq, subscription_id, event_id, \
         event_type, tenant_id, status, created_at, attempted_at, completed_at, attempts, \
         response_status, response_time_ms, error_message, next_attempt_at, trace_id) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
    )?
    .execute(params![
        d.delivery_id,
        record_seq as i64,
        d.subscription_id,
        d.event_id,
        d.event_type.name(),
        d.tenant_id,
        status_name(d.status),
        d.created_at_ms,
        d.attempted_at_ms,
        d.completed_at_ms,
        d.attempts,
        d.response_status,
        d.response_time_ms.map(|v| v as i64),
        d.error_message,
        d.next_attempt_at_ms,
        d.trace_id,
    ])?;
    Ok(())
}

pub fn status_name(s: DeliveryStatus) -> &'static str {
    match s {
        DeliveryStatus::Pending => "PENDING",
        DeliveryStatus::Success => "SUCCESS",
        DeliveryStatus::Failed => "FAILED",
        DeliveryStatus::Retrying => "RETRYING",
    }
}

fn status_of(s: &str) -> DeliveryStatus {
    match s {
        "SUCCESS" => DeliveryStatus::Success,
        "FAILED" => DeliveryStatus::Failed,
        "RETRYING" => DeliveryStatus::Retrying,
        _ => DeliveryStatus::Pending,
    }
}

fn event_row(r: &Row<'_>) -> rusqlite::Result<Event> {
    let event_type: String = r.get(1)?;
    let actor_type: String = r.get(5)?;
    let scope: String = r.get(4)?;
    Ok(Event {
        event_id: r.get(0)?,
        // Only names of known types are ever written.
        event_type: EventType::parse(&event_type).unwrap_or(EventType::SystemWebhookTest),
        timestamp_ms: r.get(2)?,
        tenant_id: r.get(3)?,
        scope: (!scope.is_empty()).then_some(scope),
        actor: EventActor {
            kind: ActorKind::parse(&actor_type).unwrap_or(ActorKind::System),
            key_id: r.get(6)?,
            source_ip: r.get(7)?,
        },
        source: r.get(8)?,
        data: r.get(9)?,
        correlation_id: r.get(10)?,
        request_id: r.get(11)?,
        trace_id: r.get(12)?,
    })
}

pub fn event(reader: &Connection, event_id: &str) -> rusqlite::Result<Option<Event>> {
    let Some(number) = Event::number(event_id) else {
        return Ok(None);
    };
    reader
        .prepare_cached(&format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE number = ?1"
        ))?
        .query_row([number as i64], event_row)
        .optional()
}

/// Events since `since_ms` by category (a range of the time index).
pub fn counts_since(reader: &Connection, since_ms: i64) -> rusqlite::Result<Vec<(String, u64)>> {
    let mut statement = reader.prepare_cached(
        "SELECT category, count(*) FROM events INDEXED BY events_ts WHERE ts >= ?1 \
         GROUP BY category",
    )?;
    let rows = statement.query_map([since_ms], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
    })?;
    rows.collect()
}

fn column(sort: EventSort) -> &'static str {
    match sort {
        EventSort::Timestamp => "number",
        EventSort::EventType => "event_type",
        EventSort::Category => "category",
        EventSort::Scope => "scope",
        EventSort::TenantId => "tenant_id",
    }
}

/// One page of the event log (one row more, to know whether more follow).
pub fn event_page(reader: &Connection, query: &EventQuery) -> rusqlite::Result<EventPage> {
    let f = &query.filter;
    let mut clauses: Vec<String> = Vec::new();
    let mut values: Vec<Value> = Vec::new();
    let bind = |values: &mut Vec<Value>, v: Value| {
        values.push(v);
        format!("?{}", values.len())
    };
    let text = |s: &str| Value::Text(s.to_string());
    for (col, value) in [
        ("tenant_id", f.tenant_id.as_deref()),
        ("event_type", f.event_type.map(EventType::name)),
        ("category", f.category.map(|c| c.name())),
        ("correlation_id", f.correlation_id.as_deref()),
        ("trace_id", f.trace_id.as_deref()),
        ("request_id", f.request_id.as_deref()),
    ] {
        if let Some(v) = value {
            let p = bind(&mut values, text(v));
            clauses.push(format!("{col} = {p}"));
        }
    }
    if f.tenant_accessible_only {
        clauses.push("category IN ('budget', 'reservation', 'tenant')".into());
    }
    if let Some(prefix) = &f.scope_prefix {
        // A range on the scope index: [prefix, prefix + U+10FFFF).
        let lo = bind(&mut values, text(prefix));
        let hi = bind(&mut values, Value::Text(format!("{prefix}\u{10FFFF}")));
        clauses.push(format!("scope >= {lo} AND scope < {hi}"));
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
            "(instr(lower(coalesce(correlation_id, '')), {p}) > 0 \
             OR instr(lower(scope), {p}) > 0)"
        ));
    }
    let col = column(query.sort);
    let (dir, cmp) = if query.window.descending {
        ("DESC", "<")
    } else {
        ("ASC", ">")
    };
    if let Some((value, number)) = &query.window.after {
        let number = Value::Integer(number.parse().unwrap_or(0));
        if query.sort == EventSort::Timestamp {
            let n = bind(&mut values, number);
            clauses.push(format!("number {cmp} {n}"));
        } else {
            let value = match value {
                SortValue::Int(v) => Value::Integer(*v),
                SortValue::Text(s) => text(s),
            };
            let v = bind(&mut values, value);
            let n = bind(&mut values, number);
            clauses.push(format!("({col}, number) {cmp} ({v}, {n})"));
        }
    }
    let filter = if clauses.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", clauses.join(" AND "))
    };
    let limit = bind(&mut values, Value::Integer(query.window.limit as i64 + 1));
    let order = if query.sort == EventSort::Timestamp {
        format!("number {dir}")
    } else {
        format!("{col} {dir}, number {dir}")
    };
    let sql = format!("SELECT {EVENT_COLUMNS} FROM events{filter} ORDER BY {order} LIMIT {limit}");
    let mut statement = reader.prepare_cached(&sql)?;
    let rows = statement.query_map(rusqlite::params_from_iter(values), event_row)?;
    let mut events = Vec::new();
    for row in rows {
        events.push(row?);
    }
    let next = if events.len() > query.window.limit {
        events.truncate(query.window.limit);
        events.last().map(|e| position(query.sort, e))
    } else {
        None
    };
    Ok(EventPage { events, next })
}

/// An event's position in `sort`'s order: the column's value, then its number.
fn position(sort: EventSort, e: &Event) -> Position {
    let value = match sort {
        EventSort::Timestamp => SortValue::Int(e.timestamp_ms),
        EventSort::EventType => SortValue::Text(e.event_type.name().into()),
        EventSort::Category => SortValue::Text(e.category().name().into()),
        EventSort::Scope => SortValue::Text(e.scope.clone().unwrap_or_default()),
        EventSort::TenantId => SortValue::Text(e.tenant_id.clone()),
    };
    let number = Event::number(&e.event_id).unwrap_or(0);
    (value, number.to_string())
}

const DELIVERY_COLUMNS: &str = "delivery_id, subscription_id, event_id, event_type, tenant_id, \
    status, created_at, attempted_at, completed_at, attempts, response_status, \
    response_time_ms, error_message, next_attempt_at, trace_id";

fn delivery_row(r: &Row<'_>) -> rusqlite::Result<Delivery> {
    let event_type: String = r.get(3)?;
    let status: String = r.get(5)?;
    Ok(Delivery {
        delivery_id: r.get(0)?,
        subscription_id: r.get(1)?,
        event_id: r.get(2)?,
        event_type: EventType::parse(&event_type).unwrap_or(EventType::SystemWebhookTest),
        tenant_id: r.get(4)?,
        status: status_of(&status),
        created_at_ms: r.get(6)?,
        attempted_at_ms: r.get(7)?,
        completed_at_ms: r.get(8)?,
        attempts: r.get(9)?,
        response_status: r.get(10)?,
        response_time_ms: r.get::<_, Option<i64>>(11)?.map(|v| v as u64),
        error_message: r.get(12)?,
        next_attempt_at_ms: r.get(13)?,
        trace_id: r.get(14)?,
    })
}

pub fn delivery_page(reader: &Connection, q: &DeliveryQuery) -> rusqlite::Result<DeliveryPage> {
    let mut clauses = vec!["subscription_id = ?1".to_string()];
    let mut values: Vec<Value> = vec![Value::Text(q.subscription_id.clone())];
    let mut bind = |v: Value| {
        values.push(v);
        format!("?{}", values.len())
    };
    if let Some(status) = q.status {
        let p = bind(Value::Text(status_name(status).into()));
        clauses.push(format!("status = {p}"));
    }
    if let Some(from) = q.from_ms {
        let p = bind(Value::Integer(from));
        clauses.push(format!("created_at >= {p}"));
    }
    if let Some(to) = q.to_ms {
        let p = bind(Value::Integer(to));
        clauses.push(format!("created_at <= {p}"));
    }
    if let Some(after) = &q.after {
        let p = bind(Value::Text(after.clone()));
        clauses.push(format!("delivery_id < {p}"));
    }
    let limit = bind(Value::Integer(q.limit as i64 + 1));
    let sql = format!(
        "SELECT {DELIVERY_COLUMNS} FROM deliveries INDEXED BY deliveries_subscription \
         WHERE {} ORDER BY delivery_id DESC LIMIT {limit}",
        clauses.join(" AND ")
    );
    let mut statement = reader.prepare_cached(&sql)?;
    let rows = statement.query_map(rusqlite::params_from_iter(values), delivery_row)?;
    let mut deliveries = Vec::new();
    for row in rows {
        deliveries.push(row?);
    }
    let has_more = deliveries.len() > q.limit;
    deliveries.truncate(q.limit);
    Ok(DeliveryPage {
        deliveries,
        has_more,
    })
}
