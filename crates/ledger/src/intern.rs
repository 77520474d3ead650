//! Sharing the values that many reservations repeat verbatim.
//!
//! An agent's reservations usually carry the same subject and action, and so the same scopes.
//! A reservation keeps them behind `Arc`; [`Recent`] hands out the `Arc` of an equal value seen
//! recently instead of a new allocation, so the held reservations of one agent share one copy
//! (about 500 bytes per reservation otherwise) and the reserve skips deriving the scopes.
//!
//! The caches are direct-mapped and fixed in size: a value that is not in its slot takes it
//! over. So they never grow and need no cleanup, and a workload whose values are all distinct
//! pays only a hash and a comparison per reserve. They are not state: not persisted, not
//! compared, empty after a restart; no reply or effect depends on whether two reservations
//! share an allocation.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher, Hash};
use std::sync::Arc;

use crate::{derive_scopes, Action, Reservation, Subject};

/// Slots per cache: a fleet with more distinct (subject, action) pairs in flight than this
/// shares less, never incorrectly.
const SLOTS: usize = 4096;

/// A direct-mapped cache of recently seen values.
#[derive(Clone)]
pub(crate) struct Recent<E> {
    slots: Vec<Option<E>>,
}

/// Only how full it is: a debug print of the state should not list thousands of slots.
impl<E> fmt::Debug for Recent<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let occupied = self.slots.iter().filter(|s| s.is_some()).count();
        write!(f, "Recent {{ {occupied} of {} slots }}", self.slots.len())
    }
}

impl<E> Default for Recent<E> {
    fn default() -> Self {
        Recent {
            slots: std::iter::repeat_with(|| None).take(SLOTS).collect(),
        }
    }
}

/// A fixed hasher: which slot a value lands in must not vary between runs, so that sharing is
/// as reproducible as everything else in the ledger.
fn slot_of<K: Hash + ?Sized>(key: &K) -> usize {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(key) as usize % SLOTS
}

impl<E: Clone> Recent<E> {
    /// The cached entry equal to `key` (as `equal` decides), or the one `make` builds from
    /// it, which then takes the slot. `key` is owned or already shared (`K` borrows as the
    /// value), so a hit allocates nothing either way.
    fn share<T: Hash + ?Sized, K: Borrow<T>>(
        &mut self,
        key: K,
        equal: impl Fn(&E, &T) -> bool,
        make: impl FnOnce(K) -> E,
    ) -> E {
        let slot = &mut self.slots[slot_of(key.borrow())];
        match slot {
            Some(entry) if equal(entry, key.borrow()) => entry.clone(),
            _ => slot.insert(make(key)).clone(),
        }
    }
}

/// A subject with the scopes it derives: `scopes` from the tenant down, `scope_path` the
/// most specific of them.
#[derive(Debug, Clone)]
pub(crate) struct Placement {
    pub subject: Arc<Subject>,
    pub scope_path: Arc<str>,
    pub scopes: Arc<[String]>,
}

impl Placement {
    fn of(subject: Arc<Subject>) -> Self {
        let scopes: Arc<[String]> = derive_scopes(&subject).into();
        Placement {
            scope_path: Arc::from(scopes.last().map_or("", String::as_str)),
            scopes,
            subject,
        }
    }
}

impl Recent<Placement> {
    /// `subject`'s placement, shared with earlier reservations of an equal subject.
    pub(crate) fn place<S>(&mut self, subject: S) -> Placement
    where
        S: Borrow<Subject> + Into<Arc<Subject>>,
    {
        self.share(
            subject,
            |p, s: &Subject| *p.subject == *s,
            |s| Placement::of(s.into()),
        )
    }
}

impl Recent<Arc<Action>> {
    /// `action`, shared with earlier reservations of an equal action.
    pub(crate) fn action<A>(&mut self, action: A) -> Arc<Action>
    where
        A: Borrow<Action> + Into<Arc<Action>>,
    {
        self.share(action, |a, b: &Action| **a == *b, Into::into)
    }
}

/// Makes a reservation loaded from a snapshot share its subject, action and scopes with the
/// equal ones loaded before it, as reserves do live. Only equal values are swapped in: a
/// stored scope list that differs from what its subject derives today is kept as stored.
pub(crate) fn share_loaded(
    placements: &mut Recent<Placement>,
    actions: &mut Recent<Arc<Action>>,
    r: &mut Reservation,
) {
    let place = placements.place(r.subject.clone());
    r.subject = place.subject;
    if place.scopes == r.affected_scopes {
        r.affected_scopes = place.scopes;
    }
    if place.scope_path == r.scope_path {
        r.scope_path = place.scope_path;
    }
    r.action = actions.action(r.action.clone());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subject(agent: &str) -> Subject {
        Subject {
            tenant: Some("acme".into()),
            agent: Some(agent.into()),
            ..Subject::default()
        }
    }

    #[test]
    fn an_equal_subject_gets_the_same_allocations() {
        let mut cache = Recent::<Placement>::default();
        let a = cache.place(subject("Bot"));
        let b = cache.place(subject("Bot"));
        assert!(Arc::ptr_eq(&a.subject, &b.subject));
        assert!(Arc::ptr_eq(&a.scopes, &b.scopes));
        assert!(Arc::ptr_eq(&a.scope_path, &b.scope_path));
        assert_eq!(&*a.scopes, ["tenant:acme", "tenant:acme/agent:bot"]);
        assert_eq!(&*a.scope_path, "tenant:acme/agent:bot");
    }

    #[test]
    fn a_different_subject_is_never_shared() {
        let mut cache = Recent::<Placement>::default();
        let a = cache.place(subject("one"));
        let mut with_dimension = subject("one");
        with_dimension.dimensions.push(("run".into(), "7".into()));
        let b = cache.place(with_dimension.clone());
        assert!(!Arc::ptr_eq(&a.subject, &b.subject));
        assert_eq!(*b.subject, with_dimension);
        // Every distinct value fits in some slot or replaces its occupant: a lookup never
        // returns an unequal value, however many there are.
        for i in 0..3 * SLOTS {
            let s = subject(&format!("agent-{i}"));
            assert_eq!(*cache.place(s.clone()).subject, s);
        }
    }

    #[test]
    fn actions_are_shared_by_value() {
        let mut cache = Recent::<Arc<Action>>::default();
        let action = |name: &str| Action {
            kind: "llm.completion".into(),
            name: name.into(),
            tags: None,
        };
        let a = cache.action(action("gpt"));
        assert!(Arc::ptr_eq(&a, &cache.action(action("gpt"))));
        assert_eq!(cache.action(action("claude")).name, "claude");
    }
}
