//! Listing reservations from ordered per-tenant indexes, so a page costs O(page) however
//! many reservations are stored (filters that match few rows cost what they skip).

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{Millis, Reservation, ReservationStatus};

/// What a listing is ordered by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SortBy {
    ReservationId,
    Tenant,
    ScopePath,
    Status,
    Reserved,
    CreatedAt,
    ExpiresAt,
}

impl SortBy {
    pub const ALL: [SortBy; 7] = [
        SortBy::ReservationId,
        SortBy::Tenant,
        SortBy::ScopePath,
        SortBy::Status,
        SortBy::Reserved,
        SortBy::CreatedAt,
        SortBy::ExpiresAt,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SortBy::ReservationId => "reservation_id",
            SortBy::Tenant => "tenant",
            SortBy::ScopePath => "scope_path",
            SortBy::Status => "status",
            SortBy::Reserved => "reserved",
            SortBy::CreatedAt => "created_at_ms",
            SortBy::ExpiresAt => "expires_at_ms",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// Which index serves this order. Listings are per tenant, so ordering by tenant is
    /// ordering by the tie-breaker, the reservation id.
    fn index(self) -> usize {
        match self {
            SortBy::ReservationId | SortBy::Tenant => 0,
            SortBy::ScopePath => 1,
            SortBy::Status => 2,
            SortBy::Reserved => 3,
            SortBy::CreatedAt => 4,
            SortBy::ExpiresAt => 5,
        }
    }
}

/// A sort key value; rows with equal values are ordered by reservation id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum SortValue {
    Int(i64),
    Text(String),
}

/// The position of a row in an order: its sort value, then its id.
pub type Position = (SortValue, String);

type Entry = (SortValue, Arc<str>);

/// The six orders of one tenant's reservations, plus ACTIVE/… partitions by creation time
/// (so "find stuck ACTIVE reservations" does not scan the finished ones).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ListIndex {
    sorted: [BTreeSet<Entry>; 6],
    by_status_created: BTreeSet<(u8, i64, Arc<str>)>,
}

fn status_rank(s: ReservationStatus) -> u8 {
    s as u8
}

/// The sort value of `r` under each index, in index order.
fn sort_values(r: &Reservation) -> [SortValue; 6] {
    std::array::from_fn(|order| sort_value(r, order))
}

/// The sort value of `r` under index `order` (see [`SortBy::index`]).
fn sort_value(r: &Reservation, order: usize) -> SortValue {
    match order {
        0 => SortValue::Text(r.reservation_id.clone()),
        1 => SortValue::Text(r.scope_path.clone()),
        2 => SortValue::Int(i64::from(status_rank(r.status))),
        3 => SortValue::Int(r.estimate),
        4 => SortValue::Int(r.created_at_ms),
        _ => SortValue::Int(r.expires_at_ms),
    }
}

/// Whether `a` and `b` sort alike under index `order`, compared without copying.
fn same_sort_value(a: &Reservation, b: &Reservation, order: usize) -> bool {
    match order {
        0 => a.reservation_id == b.reservation_id,
        1 => a.scope_path == b.scope_path,
        2 => a.status == b.status,
        3 => a.estimate == b.estimate,
        4 => a.created_at_ms == b.created_at_ms,
        _ => a.expires_at_ms == b.expires_at_ms,
    }
}

impl ListIndex {
    /// Builds the index of many reservations at once (sorting, then bulk-loading each set:
    /// far faster than inserting one by one when a snapshot is loaded).
    pub(crate) fn build<'a>(rows: impl Iterator<Item = &'a Reservation>) -> Self {
        let mut sorted: [Vec<Entry>; 6] = Default::default();
        let mut by_status_created = Vec::new();
        for r in rows {
            let id: Arc<str> = Arc::from(r.reservation_id.as_str());
            for (entries, value) in sorted.iter_mut().zip(sort_values(r)) {
                entries.push((value, id.clone()));
            }
            by_status_created.push((status_rank(r.status), r.created_at_ms, id));
        }
        ListIndex {
            sorted: sorted.map(BTreeSet::from_iter),
            by_status_created: by_status_created.into_iter().collect(),
        }
    }

    pub(crate) fn insert(&mut self, r: &Reservation) {
        let id: Arc<str> = Arc::from(r.reservation_id.as_str());
        for (set, value) in self.sorted.iter_mut().zip(sort_values(r)) {
            set.insert((value, id.clone()));
        }
        self.by_status_created
            .insert((status_rank(r.status), r.created_at_ms, id));
    }

    pub(crate) fn remove(&mut self, r: &Reservation) {
        let id: Arc<str> = Arc::from(r.reservation_id.as_str());
        for (set, value) in self.sorted.iter_mut().zip(sort_values(r)) {
            set.remove(&(value, id.clone()));
        }
        self.by_status_created
            .remove(&(status_rank(r.status), r.created_at_ms, id));
    }

    /// Moves `old` to where `new` (the same reservation, changed) belongs, touching only
    /// the orders whose value changed.
    pub(crate) fn update(&mut self, old: &Reservation, new: &Reservation) {
        let id: Arc<str> = Arc::from(new.reservation_id.as_str());
        for (order, set) in self.sorted.iter_mut().enumerate() {
            if !same_sort_value(old, new, order) {
                set.remove(&(sort_value(old, order), id.clone()));
                set.insert((sort_value(new, order), id.clone()));
            }
        }
        if (old.status, old.created_at_ms) != (new.status, new.created_at_ms) {
            self.by_status_created.remove(&(
                status_rank(old.status),
                old.created_at_ms,
                id.clone(),
            ));
            self.by_status_created
                .insert((status_rank(new.status), new.created_at_ms, id));
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_status_created.is_empty()
    }

    /// Reservation ids in order, starting after `after`. With `status` and a creation-time
    /// order, only that status's partition is walked.
    pub(crate) fn ids<'a>(
        &'a self,
        sort: SortBy,
        descending: bool,
        after: Option<&Position>,
        status: Option<ReservationStatus>,
        created: (Option<Millis>, Option<Millis>),
    ) -> Box<dyn Iterator<Item = &'a str> + 'a> {
        if let (SortBy::CreatedAt, Some(status)) = (sort, status) {
            return self.status_partition(status_rank(status), descending, after, created);
        }
        let set = &self.sorted[sort.index()];
        let cursor = after.map(|(v, id)| (v.clone(), Arc::<str>::from(id.as_str())));
        let ids = |e: &'a Entry| -> &'a str { &e.1 };
        match (descending, cursor) {
            (false, None) => Box::new(set.iter().map(ids)),
            (true, None) => Box::new(set.iter().rev().map(ids)),
            (false, Some(c)) => {
                Box::new(set.range((Bound::Excluded(c), Bound::Unbounded)).map(ids))
            }
            (true, Some(c)) => Box::new(
                set.range((Bound::Unbounded, Bound::Excluded(c)))
                    .rev()
                    .map(ids),
            ),
        }
    }

    fn status_partition<'a>(
        &'a self,
        rank: u8,
        descending: bool,
        after: Option<&Position>,
        (from, to): (Option<Millis>, Option<Millis>),
    ) -> Box<dyn Iterator<Item = &'a str> + 'a> {
        let empty: Arc<str> = Arc::from("");
        let mut lower = Bound::Included((rank, from.unwrap_or(i64::MIN), empty.clone()));
        let mut upper = match to.and_then(|t| t.checked_add(1)) {
            Some(t) => Bound::Excluded((rank, t, empty)),
            None => Bound::Excluded((rank.saturating_add(1), i64::MIN, Arc::from(""))),
        };
        if let Some((SortValue::Int(at), id)) = after {
            let c = Bound::Excluded((rank, *at, Arc::<str>::from(id.as_str())));
            if descending {
                upper = c;
            } else {
                lower = c;
            }
        }
        let iter = self.by_status_created.range((lower, upper));
        let ids = |e: &'a (u8, i64, Arc<str>)| -> &'a str { &e.2 };
        if descending {
            Box::new(iter.rev().map(ids))
        } else {
            Box::new(iter.map(ids))
        }
    }
}

/// The position of `r` in `sort` order (for cursors).
pub fn position(r: &Reservation, sort: SortBy) -> Position {
    let value = sort_values(r)[sort.index()].clone();
    (value, r.reservation_id.clone())
}
