//! Listing reservations from ordered per-tenant indexes, so a page costs O(page) however
//! many reservations are stored (filters that match few rows cost what they skip).

use std::collections::{BTreeSet, HashMap};
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

/// A string in an index key, with its first bytes inline. A B-tree search compares a dozen
/// keys or more, and following a pointer for each comparison costs a cache miss each time;
/// the inline bytes decide most comparisons alone (ids differ within their first bytes).
/// Ordered exactly as the string: zero padding sorts before every byte that could follow.
/// The head is kept as one big-endian integer, so comparing heads is an integer comparison
/// (the same order as comparing the bytes) rather than a call to `memcmp`.
#[derive(Debug, Clone)]
struct Text {
    head: u128,
    full: Arc<str>,
}

const TEXT_HEAD: usize = 16;

impl Text {
    fn new(s: &str) -> Text {
        Text::with_full(s, Arc::from(s))
    }

    /// `s`, kept as `full` (which holds the same string).
    fn with_full(s: &str, full: Arc<str>) -> Text {
        let mut head = [0; TEXT_HEAD];
        let n = s.len().min(TEXT_HEAD);
        head[..n].copy_from_slice(&s.as_bytes()[..n]);
        Text {
            head: u128::from_be_bytes(head),
            full,
        }
    }
}

impl Ord for Text {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.head.cmp(&other.head).then_with(|| {
            if Arc::ptr_eq(&self.full, &other.full) {
                std::cmp::Ordering::Equal
            } else {
                self.full.cmp(&other.full)
            }
        })
    }
}

impl PartialOrd for Text {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Text {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Text {}

/// A [`SortValue`] as stored in an index key (same order).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Int(i64),
    Text(Text),
}

impl From<&SortValue> for Key {
    fn from(value: &SortValue) -> Key {
        match value {
            SortValue::Int(v) => Key::Int(*v),
            SortValue::Text(t) => Key::Text(Text::new(t)),
        }
    }
}

type Entry = (Key, Text);

/// The six orders of one tenant's reservations, plus ACTIVE/… partitions by creation time
/// (so "find stuck ACTIVE reservations" does not scan the finished ones). Equal indexes
/// also count the same scopes: `State::verify` compares an index with one rebuilt from the
/// rows, so a scope kept after its last row left shows there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ListIndex {
    sorted: [BTreeSet<Entry>; 6],
    by_status_created: BTreeSet<(u8, i64, Text)>,
    scopes: Scopes,
}

/// One shared copy of each scope path of a tenant's reservations, with the number of rows
/// using it. Many reservations share a scope, and scope paths share long prefixes
/// (`tenant:…/workspace:…`), so keys in the scope order tie on their inline heads all the
/// time: with one shared string per scope such a tie is settled by comparing pointers
/// instead of the strings, and a reserve allocates no copy of its scope for the index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Scopes(HashMap<Arc<str>, usize>);

impl Scopes {
    /// `scope` for a row entering the index.
    fn acquire(&mut self, scope: &str) -> Text {
        match self.0.get_mut(scope) {
            Some(rows) => *rows += 1,
            None => {
                self.0.insert(Arc::from(scope), 1);
            }
        }
        self.find(scope)
    }

    /// `scope` for finding a row's key: the shared copy (any copy compares equal).
    fn find(&self, scope: &str) -> Text {
        match self.0.get_key_value(scope) {
            Some((shared, _)) => Text::with_full(scope, shared.clone()),
            None => Text::new(scope),
        }
    }

    /// A row using `scope` left the index; the scope is forgotten with its last row.
    fn release(&mut self, scope: &str) {
        if let Some(rows) = self.0.get_mut(scope) {
            *rows -= 1;
            if *rows == 0 {
                self.0.remove(scope);
            }
        }
    }
}

fn status_rank(s: ReservationStatus) -> u8 {
    s as u8
}

/// The index keys of `r`, in index order (`id` is `r`'s id, shared by all of them; `scope`
/// gives the scope path's key).
fn sort_keys(r: &Reservation, id: &Text, mut scope: impl FnMut(&str) -> Text) -> [Key; 6] {
    std::array::from_fn(|order| sort_key(r, id, order, &mut scope))
}

/// The field of `r` that index `order` sorts by (see [`SortBy::index`]), borrowed.
#[derive(PartialEq)]
enum Field<'a> {
    Int(i64),
    Text(&'a str),
}

fn field(r: &Reservation, order: usize) -> Field<'_> {
    match order {
        0 => Field::Text(&r.reservation_id),
        1 => Field::Text(&r.scope_path),
        2 => Field::Int(i64::from(status_rank(r.status))),
        3 => Field::Int(r.estimate),
        4 => Field::Int(r.created_at_ms),
        _ => Field::Int(r.expires_at_ms),
    }
}

/// The index key of `r` under index `order`.
fn sort_key(r: &Reservation, id: &Text, order: usize, scope: &mut impl FnMut(&str) -> Text) -> Key {
    match field(r, order) {
        Field::Int(v) => Key::Int(v),
        // The id order keys by the id itself: share it rather than copy it.
        Field::Text(_) if order == 0 => Key::Text(id.clone()),
        Field::Text(t) => Key::Text(scope(t)),
    }
}

/// Whether `a` and `b` sort alike under index `order`.
fn same_sort_value(a: &Reservation, b: &Reservation, order: usize) -> bool {
    field(a, order) == field(b, order)
}

impl ListIndex {
    /// Builds the index of many reservations at once (sorting, then bulk-loading each set:
    /// far faster than inserting one by one when a snapshot is loaded).
    pub(crate) fn build<'a>(rows: impl Iterator<Item = &'a Reservation>) -> Self {
        let mut sorted: [Vec<Entry>; 6] = Default::default();
        let mut by_status_created = Vec::new();
        let mut scopes = Scopes::default();
        for r in rows {
            let id = Text::new(&r.reservation_id);
            let keys = sort_keys(r, &id, |s| scopes.acquire(s));
            for (entries, key) in sorted.iter_mut().zip(keys) {
                entries.push((key, id.clone()));
            }
            by_status_created.push((status_rank(r.status), r.created_at_ms, id));
        }
        ListIndex {
            sorted: sorted.map(BTreeSet::from_iter),
            by_status_created: by_status_created.into_iter().collect(),
            scopes,
        }
    }

    pub(crate) fn insert(&mut self, r: &Reservation) {
        let id = Text::new(&r.reservation_id);
        let keys = sort_keys(r, &id, |s| self.scopes.acquire(s));
        for (set, key) in self.sorted.iter_mut().zip(keys) {
            set.insert((key, id.clone()));
        }
        self.by_status_created
            .insert((status_rank(r.status), r.created_at_ms, id));
    }

    pub(crate) fn remove(&mut self, r: &Reservation) {
        let id = Text::new(&r.reservation_id);
        let keys = sort_keys(r, &id, |s| self.scopes.find(s));
        for (set, key) in self.sorted.iter_mut().zip(keys) {
            set.remove(&(key, id.clone()));
        }
        self.by_status_created
            .remove(&(status_rank(r.status), r.created_at_ms, id));
        self.scopes.release(&r.scope_path);
    }

    /// Moves `old` to where `new` (the same reservation, changed) belongs, touching only
    /// the orders whose value changed.
    pub(crate) fn update(&mut self, old: &Reservation, new: &Reservation) {
        let id = Text::new(&new.reservation_id);
        let scopes = &mut self.scopes;
        for (order, set) in self.sorted.iter_mut().enumerate() {
            if !same_sort_value(old, new, order) {
                set.remove(&(
                    sort_key(old, &id, order, &mut |s| scopes.find(s)),
                    id.clone(),
                ));
                set.insert((
                    sort_key(new, &id, order, &mut |s| scopes.acquire(s)),
                    id.clone(),
                ));
            }
        }
        if old.scope_path != new.scope_path {
            scopes.release(&old.scope_path);
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
        let cursor = after.map(|(v, id)| (Key::from(v), Text::new(id)));
        let ids = |e: &'a Entry| -> &'a str { &e.1.full };
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
        let empty = Text::new("");
        let mut lower = Bound::Included((rank, from.unwrap_or(i64::MIN), empty.clone()));
        let mut upper = match to.and_then(|t| t.checked_add(1)) {
            Some(t) => Bound::Excluded((rank, t, empty)),
            None => Bound::Excluded((rank.saturating_add(1), i64::MIN, empty)),
        };
        if let Some((SortValue::Int(at), id)) = after {
            let c = Bound::Excluded((rank, *at, Text::new(id)));
            if descending {
                upper = c;
            } else {
                lower = c;
            }
        }
        let iter = self.by_status_created.range((lower, upper));
        let ids = |e: &'a (u8, i64, Text)| -> &'a str { &e.2.full };
        if descending {
            Box::new(iter.rev().map(ids))
        } else {
            Box::new(iter.map(ids))
        }
    }
}

/// The position of `r` in `sort` order (for cursors).
pub fn position(r: &Reservation, sort: SortBy) -> Position {
    let value = match field(r, sort.index()) {
        Field::Int(v) => SortValue::Int(v),
        Field::Text(t) => SortValue::Text(t.to_string()),
    };
    (value, r.reservation_id.clone())
}

#[cfg(test)]
mod tests {
    use super::Text;
    use proptest::prelude::*;

    proptest! {
        /// The inline head never changes the order: keys sort exactly as their strings
        /// (including strings with NUL bytes, and prefixes of each other).
        #[test]
        fn text_keys_sort_as_their_strings(
            a in "[a\\x00b]{0,20}",
            b in "[a\\x00b]{0,20}",
        ) {
            prop_assert_eq!(Text::new(&a).cmp(&Text::new(&b)), a.cmp(&b));
            prop_assert_eq!(Text::new(&a) == Text::new(&b), a == b);
        }
    }
}
