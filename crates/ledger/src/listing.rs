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
    /// Whether this order's values are text (else integers).
    pub fn is_text(self) -> bool {
        matches!(Order::from(self), Order::Id | Order::Scope)
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
/// The head is kept as two big-endian integers, so comparing heads is integer comparisons
/// (the same order as comparing the bytes) rather than a call to `memcmp`; two `u64`s
/// rather than one `u128` keep the key 8-byte aligned, so an `(i64, Text)` key is 40 bytes
/// (a `u128` would pad it to 48) and more keys share a cache line.
#[derive(Debug, Clone)]
struct Text {
    head: (u64, u64),
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
        let (high, low) = head.split_at(TEXT_HEAD / 2);
        let word = |b: &[u8]| u64::from_be_bytes(b.try_into().expect("half of the 16-byte head"));
        Text {
            head: (word(high), word(low)),
            full,
        }
    }

    /// The id of `r`, sharing the reservation's allocation (no copy per index key).
    fn id_of(r: &Reservation) -> Text {
        Text::with_full(&r.reservation_id, r.reservation_id.clone())
    }

    /// The lowest key: sorts before every other string.
    fn empty() -> Text {
        Text::new("")
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

/// The orders of one tenant's reservations, each a set of keys typed for its field (an id
/// order of ids alone, integer orders of `(value, id)`: the smaller the key, the more of
/// them a B-tree node holds and the fewer cache lines an insert touches), plus ACTIVE/…
/// partitions by creation time (so "find stuck ACTIVE reservations" does not scan the
/// finished ones). Equal indexes also count the same scopes: `State::verify` compares an
/// index with one rebuilt from the rows, so a scope kept after its last row left shows
/// there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ListIndex {
    by_id: BTreeSet<Text>,
    by_scope: BTreeSet<(Text, Text)>,
    /// Indexed by [`IntOrder`].
    by_int: [BTreeSet<(i64, Text)>; INT_ORDERS],
    by_status_created: BTreeSet<(u8, i64, Text)>,
    scopes: Scopes,
}

/// The orders by an integer field, in `ListIndex::by_int`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IntOrder {
    Status,
    Reserved,
    CreatedAt,
    ExpiresAt,
}

const INT_ORDERS: usize = 4;

impl IntOrder {
    const ALL: [IntOrder; INT_ORDERS] = [
        IntOrder::Status,
        IntOrder::Reserved,
        IntOrder::CreatedAt,
        IntOrder::ExpiresAt,
    ];

    fn value(self, r: &Reservation) -> i64 {
        match self {
            IntOrder::Status => i64::from(status_rank(r.status)),
            IntOrder::Reserved => r.estimate,
            IntOrder::CreatedAt => r.created_at_ms,
            IntOrder::ExpiresAt => r.expires_at_ms,
        }
    }
}

/// Which set serves a listing order. Listings are per tenant, so ordering by tenant is
/// ordering by the tie-breaker, the reservation id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    Id,
    Scope,
    Int(IntOrder),
}

impl From<SortBy> for Order {
    fn from(sort: SortBy) -> Order {
        match sort {
            SortBy::ReservationId | SortBy::Tenant => Order::Id,
            SortBy::ScopePath => Order::Scope,
            SortBy::Status => Order::Int(IntOrder::Status),
            SortBy::Reserved => Order::Int(IntOrder::Reserved),
            SortBy::CreatedAt => Order::Int(IntOrder::CreatedAt),
            SortBy::ExpiresAt => Order::Int(IntOrder::ExpiresAt),
        }
    }
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

/// The field of `r` that `sort` orders by, borrowed.
#[derive(PartialEq)]
enum Field<'a> {
    Int(i64),
    Text(&'a str),
}

fn field(r: &Reservation, sort: SortBy) -> Field<'_> {
    match Order::from(sort) {
        Order::Id => Field::Text(&r.reservation_id),
        Order::Scope => Field::Text(&r.scope_path),
        Order::Int(order) => Field::Int(order.value(r)),
    }
}

/// Walks `set` from just after `cursor` (or from its start), ascending or descending.
fn walk<'a, K: Ord>(
    set: &'a BTreeSet<K>,
    cursor: Option<K>,
    descending: bool,
    id: fn(&'a K) -> &'a str,
) -> Box<dyn Iterator<Item = &'a str> + 'a> {
    match (descending, cursor) {
        (false, None) => Box::new(set.iter().map(id)),
        (true, None) => Box::new(set.iter().rev().map(id)),
        (false, Some(c)) => Box::new(set.range((Bound::Excluded(c), Bound::Unbounded)).map(id)),
        (true, Some(c)) => Box::new(
            set.range((Bound::Unbounded, Bound::Excluded(c)))
                .rev()
                .map(id),
        ),
    }
}

impl ListIndex {
    /// Builds the index of many reservations at once (sorting, then bulk-loading each set:
    /// far faster than inserting one by one when a snapshot is loaded).
    pub(crate) fn build<'a>(rows: impl Iterator<Item = &'a Reservation>) -> Self {
        let mut by_id = Vec::new();
        let mut by_scope = Vec::new();
        let mut by_int: [Vec<(i64, Text)>; INT_ORDERS] = Default::default();
        let mut by_status_created = Vec::new();
        let mut scopes = Scopes::default();
        for r in rows {
            let id = Text::id_of(r);
            by_scope.push((scopes.acquire(&r.scope_path), id.clone()));
            for (entries, order) in by_int.iter_mut().zip(IntOrder::ALL) {
                entries.push((order.value(r), id.clone()));
            }
            by_status_created.push((status_rank(r.status), r.created_at_ms, id.clone()));
            by_id.push(id);
        }
        ListIndex {
            by_id: BTreeSet::from_iter(by_id),
            by_scope: BTreeSet::from_iter(by_scope),
            by_int: by_int.map(BTreeSet::from_iter),
            by_status_created: BTreeSet::from_iter(by_status_created),
            scopes,
        }
    }

    pub(crate) fn insert(&mut self, r: &Reservation) {
        let id = Text::id_of(r);
        self.add_scope(&r.scope_path, &id);
        for (set, order) in self.by_int.iter_mut().zip(IntOrder::ALL) {
            set.insert((order.value(r), id.clone()));
        }
        self.by_status_created
            .insert((status_rank(r.status), r.created_at_ms, id.clone()));
        self.by_id.insert(id);
    }

    pub(crate) fn remove(&mut self, r: &Reservation) {
        let id = Text::id_of(r);
        self.remove_scope(&r.scope_path, &id);
        for (set, order) in self.by_int.iter_mut().zip(IntOrder::ALL) {
            set.remove(&(order.value(r), id.clone()));
        }
        self.by_status_created
            .remove(&(status_rank(r.status), r.created_at_ms, id.clone()));
        self.by_id.remove(&id);
    }

    /// Moves `old` to where `new` (the same reservation, changed) belongs, touching only
    /// the orders whose value changed. The id never changes.
    pub(crate) fn update(&mut self, old: &Reservation, new: &Reservation) {
        let id = Text::id_of(new);
        if old.scope_path != new.scope_path {
            self.remove_scope(&old.scope_path, &id);
            self.add_scope(&new.scope_path, &id);
        }
        for order in IntOrder::ALL {
            self.move_int(order, &id, order.value(old), order.value(new));
        }
        self.move_partition(
            &id,
            (old.status, old.created_at_ms),
            (new.status, new.created_at_ms),
        );
    }

    /// Moves `r` from status `old` to its current status, nothing else about it changed
    /// (what [`ListIndex::update`] would do, without the reservation as it was).
    pub(crate) fn restatus(&mut self, r: &Reservation, old: ReservationStatus) {
        let id = Text::id_of(r);
        let rank = |s| i64::from(status_rank(s));
        self.move_int(IntOrder::Status, &id, rank(old), rank(r.status));
        self.move_partition(&id, (old, r.created_at_ms), (r.status, r.created_at_ms));
    }

    fn add_scope(&mut self, scope: &str, id: &Text) {
        let scope = self.scopes.acquire(scope);
        self.by_scope.insert((scope, id.clone()));
    }

    fn remove_scope(&mut self, scope: &str, id: &Text) {
        self.by_scope.remove(&(self.scopes.find(scope), id.clone()));
        self.scopes.release(scope);
    }

    /// Moves `id` in an integer order from `before` to `after` (nothing when equal).
    fn move_int(&mut self, order: IntOrder, id: &Text, before: i64, after: i64) {
        if before != after {
            let set = &mut self.by_int[order as usize];
            set.remove(&(before, id.clone()));
            set.insert((after, id.clone()));
        }
    }

    /// Moves `id` between the status partitions by creation time (nothing when equal).
    fn move_partition(
        &mut self,
        id: &Text,
        (old_status, old_created): (ReservationStatus, Millis),
        (new_status, new_created): (ReservationStatus, Millis),
    ) {
        if (old_status, old_created) != (new_status, new_created) {
            self.by_status_created
                .remove(&(status_rank(old_status), old_created, id.clone()));
            self.by_status_created
                .insert((status_rank(new_status), new_created, id.clone()));
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_status_created.is_empty()
    }

    /// Reservation ids in order, starting after `after`. With `status` and a creation-time
    /// order, only that status's partition is walked. A cursor whose value is not of the
    /// order's kind (the protocol layer refuses those) lists nothing.
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
        match (Order::from(sort), after) {
            (Order::Id, None) => walk(&self.by_id, None, descending, |t| &t.full),
            (Order::Id, Some((_, id))) => {
                walk(&self.by_id, Some(Text::new(id)), descending, |t| &t.full)
            }
            (Order::Scope, None) => walk(&self.by_scope, None, descending, |e| &e.1.full),
            (Order::Scope, Some((SortValue::Text(scope), id))) => walk(
                &self.by_scope,
                Some((Text::new(scope), Text::new(id))),
                descending,
                |e| &e.1.full,
            ),
            (Order::Int(order), None) => {
                walk(&self.by_int[order as usize], None, descending, |e| {
                    &e.1.full
                })
            }
            (Order::Int(order), Some((SortValue::Int(v), id))) => walk(
                &self.by_int[order as usize],
                Some((*v, Text::new(id))),
                descending,
                |e| &e.1.full,
            ),
            (Order::Scope, Some((SortValue::Int(_), _)))
            | (Order::Int(_), Some((SortValue::Text(_), _))) => Box::new(std::iter::empty()),
        }
    }

    fn status_partition<'a>(
        &'a self,
        rank: u8,
        descending: bool,
        after: Option<&Position>,
        (from, to): (Option<Millis>, Option<Millis>),
    ) -> Box<dyn Iterator<Item = &'a str> + 'a> {
        let mut lower = Bound::Included((rank, from.unwrap_or(i64::MIN), Text::empty()));
        let mut upper = match to.and_then(|t| t.checked_add(1)) {
            Some(t) => Bound::Excluded((rank, t, Text::empty())),
            None => Bound::Excluded((rank.saturating_add(1), i64::MIN, Text::empty())),
        };
        match after {
            Some((SortValue::Int(at), id)) => {
                let c = Bound::Excluded((rank, *at, Text::new(id)));
                if descending {
                    upper = c;
                } else {
                    lower = c;
                }
            }
            Some((SortValue::Text(_), _)) => return Box::new(std::iter::empty()),
            None => {}
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
    let value = match field(r, sort) {
        Field::Int(v) => SortValue::Int(v),
        Field::Text(t) => SortValue::Text(t.to_string()),
    };
    (value, r.reservation_id.to_string())
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
