//! The state and the only code that changes it: [`State::apply_effect`].

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use imbl::{HashMap as ImHashMap, OrdMap};

use serde::{Deserialize, Serialize};

use crate::archive::{reserve_key_digest, ArchivedKey, ArchivedKeys};
use crate::idempotency::{Arrival, IdemEntry, IdemTable};
use crate::intern::{share_loaded, Placement, Recent};
use crate::inventory::Inventory;
use crate::listing::ListIndex;
use crate::{
    Action, ApiKey, ApiKeyStatus, ArchiveLookup, Archived, AuditEntry, Budget, BudgetKey, Delivery,
    Endpoint, Event, EventType, IdemKey, IdemRecord, Level, Millis, Policy, RateCount, RateKey,
    Reservation, ReservationStatus, StoredOutcome, Tenant, WebhookSecurity, WebhookSubscription,
    DEFAULT_UTILIZATION_LEVELS,
};

/// How long a settled or expired reservation stays readable (and its commit/release
/// idempotency records replayable) before it is deleted: from the history store, where it
/// went when it was archived (see [`crate::archive`]).
pub const TERMINAL_RETENTION_MS: Millis = 30 * 24 * 3_600_000;

/// One change to the state. Journals record effects, not commands, so replaying them does
/// not depend on decision logic that may change between versions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Effect {
    PutTenant(Tenant),
    PutApiKey(ApiKey),
    PutBudget(Arc<Budget>),
    PutPolicy(Policy),
    PutReservation(Arc<Reservation>),
    PutIdempotency(Arc<IdemKey>, Arc<IdemRecord>),
    /// Written by earlier versions' retention, which kept settled reservations in memory for
    /// their whole retention; still replayed from their journals.
    RemoveReservation(Arc<str>),
    RemoveIdempotency(Arc<IdemKey>),
    /// An ACTIVE reservation past its grace became EXPIRED at `at_ms` (the `PutBudget`s
    /// beside it return its hold). Recorded as the change alone, not the whole reservation:
    /// expiry is the one transition a sweep makes in bulk, so its record is a fraction of
    /// a `PutReservation`, and the state's copy is changed in place when nothing else
    /// holds it (no clone of the reservation, no allocation).
    ExpireReservation {
        reservation_id: Arc<str>,
        at_ms: Millis,
    },
    /// The audit entry of the request that made this record's other effects (or of a
    /// refused one, alone). History, not state: the state ignores it, and the store projects
    /// it into its history store once the record is durable.
    Audit(Box<AuditEntry>),
    /// An event of this record's change (the outbox). History like an audit entry: the
    /// state only remembers its number, so the next event's is greater.
    Event(Box<Event>),
    PutWebhook(Arc<WebhookSubscription>),
    RemoveWebhook(String),
    PutWebhookSecurity(WebhookSecurity),
    /// A delivery created or attempted: kept in the state while it is due, dropped from it
    /// once final (the history store keeps every version).
    PutDelivery(Arc<Delivery>),
    /// A policy's count of reservations or commits in the current minute (`rate_limits`).
    PutRateCount(RateKey, RateCount),
    /// A settled reservation leaves the state with its idempotency records, for the history
    /// store (see [`crate::archive`]); its reserve key's digest stays while its window lasts.
    ArchiveReservation(Arc<Archived>),
    /// The archived reserve keys whose windows ended on `day` (days since the epoch) are
    /// forgotten.
    ForgetArchivedKeys {
        day: Millis,
    },
}

/// All tenants, keys, budgets, reservations and idempotency records, plus the ordered
/// indexes the state machine keeps for expiry, retention and listing.
#[derive(Debug, Clone, Default)]
pub struct State {
    // The persistent part lives in persistent (structurally shared) maps, so a consistent
    // copy for a snapshot costs O(1) under the ledger lock; the indexes below are rebuilt on
    // load and use ordinary collections.
    pub(crate) tenants: OrdMap<String, Tenant>,
    pub(crate) api_keys: OrdMap<String, ApiKey>,
    pub(crate) key_by_digest: ImHashMap<[u8; 32], String>,
    /// Behind `Arc` like reservations: the effect that writes a budget and the state share
    /// it, so a write does not copy the budget's strings again.
    pub(crate) budgets: OrdMap<BudgetKey, Arc<Budget>>,
    /// Policies by (tenant, policy id).
    pub(crate) policies: OrdMap<(String, String), Policy>,
    /// The tenants that have a policy (an index: policies are never removed). A reserve or
    /// commit of any other tenant needs no policy lookup, whose range bound would allocate.
    pub(crate) policy_tenants: HashSet<String>,
    /// Values behind `Arc`: the effect that puts a reservation or record and the state share
    /// one allocation (no deep copy per write), and the maps' nodes stay small, so copying a
    /// node for a snapshot or a write costs pointers, not 550-byte structs.
    ///
    /// Reservations are ordered by id, not hashed: ids are time-ordered, so a new one goes to
    /// the right edge of the tree and the sweep works at the left. While a snapshot holds the
    /// old tree, a hashed map copies a random path of wide nodes for every insert (measured:
    /// ~1.5 KB of new memory and 4× the time per insert over 1.5 M entries), an ordered one
    /// copies the edge once. It is also half the memory per entry; a lookup of an old id
    /// costs more (B-tree comparisons instead of a hash), ~1–2 µs.
    pub(crate) reservations: OrdMap<Arc<str>, Arc<Reservation>>,
    pub(crate) idempotency: IdemTable,
    /// ACTIVE reservations by settle deadline (expires_at + grace).
    pub(crate) expiry_index: BTreeSet<(Millis, Arc<str>)>,
    /// Settled reservations still in the state, by when they settled: the sweep archives
    /// them from the left.
    pub(crate) settled_index: BTreeSet<(Millis, Arc<str>)>,
    /// The idempotency keys of each reservation's commit, release and extensions, so that
    /// archiving it finds its records (whose client keys nothing else names).
    pub(crate) settlement_keys: HashMap<Arc<str>, Vec<Arc<IdemKey>>>,
    /// Digests of archived reserves' keys while their windows last.
    pub(crate) archived_keys: ArchivedKeys,
    /// Keys stored as ACTIVE, by expiry, for the sweep that marks them EXPIRED.
    pub(crate) key_expiry_index: BTreeSet<(Millis, String)>,
    /// Per-tenant listing orders.
    pub(crate) list_index: HashMap<String, ListIndex>,
    /// Idempotency records by eviction time, each named by its arrival (see [`IdemTable`]):
    /// a number, not a copy of its key.
    pub(crate) retention_index: BTreeSet<(Millis, Arrival)>,
    /// Counts and debt orders of tenants and budgets, for the admin overview.
    pub(crate) inventory: Inventory,
    /// Not state: the subjects (with their scopes) and actions of recent reserves, so that
    /// reservations repeating them share one copy ([`crate::intern`]). In cells because an
    /// operation sees the state read-only: filling a cache changes no state.
    pub(crate) placements: RefCell<Recent<Placement>>,
    pub(crate) actions: RefCell<Recent<Arc<Action>>>,
    pub(crate) webhooks: WebhookState,
    /// Each rate-limited policy's count in its latest minute: one entry per policy and kind
    /// that counted something, never more.
    pub(crate) rate_counts: OrdMap<RateKey, RateCount>,
}

/// The webhook part of the state: subscriptions, the deliveries still due, the security
/// configuration, and the last event and delivery numbers given out.
#[derive(Debug, Clone, Default)]
pub(crate) struct WebhookState {
    pub(crate) subscriptions: OrdMap<String, Arc<WebhookSubscription>>,
    /// Subscription ids by owner (a tenant or `__system__`), for matching an event.
    pub(crate) by_owner: HashMap<String, BTreeSet<String>>,
    pub(crate) security: Option<WebhookSecurity>,
    pub(crate) due: OrdMap<String, Arc<Delivery>>,
    /// Each subscription's due deliveries by when they are next attempted.
    pub(crate) due_by_subscription: HashMap<String, BTreeSet<(Millis, String)>>,
    /// Each subscription with a due delivery, by its earliest: the dispatcher passes over a
    /// subscription it is already serving in one step, however many it has waiting.
    pub(crate) due_subscriptions: BTreeSet<(Millis, String)>,
    pub(crate) last_event: u64,
    pub(crate) last_delivery: u64,
    /// How many subscriptions watch each utilization level beyond the defaults (see
    /// [`WebhookState::watched_levels`]).
    pub(crate) custom_levels: BTreeMap<Level, usize>,
}

impl WebhookState {
    /// Applies `change` to `subscription`'s due deliveries, and moves the subscription in
    /// [`WebhookState::due_subscriptions`] when its earliest changes.
    fn index_due(
        &mut self,
        subscription: &str,
        change: impl FnOnce(&mut BTreeSet<(Millis, String)>),
    ) {
        if !self.due_by_subscription.contains_key(subscription) {
            self.due_by_subscription
                .insert(subscription.to_string(), BTreeSet::new());
        }
        let Some(due) = self.due_by_subscription.get_mut(subscription) else {
            return;
        };
        let earliest = |due: &BTreeSet<(Millis, String)>| due.first().map(|(at, _)| *at);
        let before = earliest(due);
        change(due);
        let after = earliest(due);
        if due.is_empty() {
            self.due_by_subscription.remove(subscription);
        }
        if before != after {
            if let Some(at) = before {
                self.due_subscriptions
                    .remove(&(at, subscription.to_string()));
            }
            if let Some(at) = after {
                self.due_subscriptions
                    .insert((at, subscription.to_string()));
            }
        }
    }

    /// The utilization levels a budget's crossing is an event at: the defaults, and every
    /// level a subscription to `budget.threshold_crossed` names.
    pub(crate) fn watched_levels(&self) -> impl Iterator<Item = Level> + '_ {
        DEFAULT_UTILIZATION_LEVELS
            .into_iter()
            .chain(self.custom_levels.keys().copied())
    }

    /// Counts (`by` = 1) or uncounts (`by` = −1) the custom levels `w` watches.
    fn count_levels(&mut self, w: &WebhookSubscription, by: isize) {
        let crossing = EventType::BudgetThresholdCrossed;
        let watches =
            w.event_types.contains(&crossing) || w.event_categories.contains(&crossing.category());
        if !watches || w.thresholds.is_none() {
            return;
        }
        for level in w.utilization_levels() {
            if DEFAULT_UTILIZATION_LEVELS.contains(&level) {
                continue;
            }
            let count = self.custom_levels.entry(level).or_default();
            *count = count.saturating_add_signed(by);
            if *count == 0 {
                self.custom_levels.remove(&level);
            }
        }
    }
}

/// The persistent part of the state, as written to a snapshot. Indexes are rebuilt on load.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotData {
    pub tenants: Vec<Tenant>,
    pub api_keys: Vec<ApiKey>,
    pub budgets: Vec<Budget>,
    pub policies: Vec<Policy>,
    pub reservations: Vec<Reservation>,
    pub idempotency: Vec<(IdemKey, IdemRecord)>,
    // Since format 2 (a format-1 snapshot has none of these: see [`SnapshotV1`]).
    pub webhooks: Vec<WebhookSubscription>,
    pub webhook_security: Option<WebhookSecurity>,
    pub deliveries: Vec<Delivery>,
    pub last_event: u64,
    pub last_delivery: u64,
    // Since format 3 (see [`SnapshotV2`]).
    pub rate_counts: Vec<(RateKey, RateCount)>,
    // Since format 4 (see [`SnapshotV3`]): archived reserves' key digests by day, sorted;
    // since format 5 (see [`SnapshotV4`]) 4 bytes each, stored as differences; since format
    // 6 (see [`SnapshotV5`]) each with its reservation's creation time.
    #[serde(
        serialize_with = "crate::archive::serialize_days",
        deserialize_with = "crate::archive::deserialize_days"
    )]
    pub archived_keys: Vec<(Millis, Vec<ArchivedKey>)>,
}

/// The persistent state as formats 4 and 5 wrote it: today's, but for how the digests of
/// archived reserves' keys are stored (`D`), with no times. Read from older snapshots.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotWithDigests<D> {
    pub tenants: Vec<Tenant>,
    pub api_keys: Vec<ApiKey>,
    pub budgets: Vec<Budget>,
    pub policies: Vec<Policy>,
    pub reservations: Vec<Reservation>,
    pub idempotency: Vec<(IdemKey, IdemRecord)>,
    pub webhooks: Vec<WebhookSubscription>,
    pub webhook_security: Option<WebhookSecurity>,
    pub deliveries: Vec<Delivery>,
    pub last_event: u64,
    pub last_delivery: u64,
    pub rate_counts: Vec<(RateKey, RateCount)>,
    pub archived_keys: D,
}

/// Format 4: 8-byte digests, whole (their first 4 bytes are today's).
pub type SnapshotV4 = SnapshotWithDigests<Vec<(Millis, Vec<u64>)>>;

/// Format 5: 4-byte digests, stored as differences.
pub type SnapshotV5 = SnapshotWithDigests<crate::archive::DigestsV5>;

impl<D: crate::archive::UntimedDays> From<SnapshotWithDigests<D>> for SnapshotData {
    fn from(old: SnapshotWithDigests<D>) -> Self {
        SnapshotData {
            tenants: old.tenants,
            api_keys: old.api_keys,
            budgets: old.budgets,
            policies: old.policies,
            reservations: old.reservations,
            idempotency: old.idempotency,
            webhooks: old.webhooks,
            webhook_security: old.webhook_security,
            deliveries: old.deliveries,
            last_event: old.last_event,
            last_delivery: old.last_delivery,
            rate_counts: old.rate_counts,
            archived_keys: old.archived_keys.into_keys(),
        }
    }
}

/// The persistent state as format 3 wrote it, before settled reservations were archived:
/// read from older snapshots.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotV3 {
    pub tenants: Vec<Tenant>,
    pub api_keys: Vec<ApiKey>,
    pub budgets: Vec<Budget>,
    pub policies: Vec<Policy>,
    pub reservations: Vec<Reservation>,
    pub idempotency: Vec<(IdemKey, IdemRecord)>,
    pub webhooks: Vec<WebhookSubscription>,
    pub webhook_security: Option<WebhookSecurity>,
    pub deliveries: Vec<Delivery>,
    pub last_event: u64,
    pub last_delivery: u64,
    pub rate_counts: Vec<(RateKey, RateCount)>,
}

impl From<SnapshotV3> for SnapshotData {
    fn from(v3: SnapshotV3) -> Self {
        SnapshotData {
            tenants: v3.tenants,
            api_keys: v3.api_keys,
            budgets: v3.budgets,
            policies: v3.policies,
            reservations: v3.reservations,
            idempotency: v3.idempotency,
            webhooks: v3.webhooks,
            webhook_security: v3.webhook_security,
            deliveries: v3.deliveries,
            last_event: v3.last_event,
            last_delivery: v3.last_delivery,
            rate_counts: v3.rate_counts,
            archived_keys: Vec::new(),
        }
    }
}

/// The persistent state as format 2 wrote it, before policies' rate counts: read from
/// older snapshots.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotV2 {
    pub tenants: Vec<Tenant>,
    pub api_keys: Vec<ApiKey>,
    pub budgets: Vec<Budget>,
    pub policies: Vec<Policy>,
    pub reservations: Vec<Reservation>,
    pub idempotency: Vec<(IdemKey, IdemRecord)>,
    pub webhooks: Vec<WebhookSubscription>,
    pub webhook_security: Option<WebhookSecurity>,
    pub deliveries: Vec<Delivery>,
    pub last_event: u64,
    pub last_delivery: u64,
}

impl From<SnapshotV2> for SnapshotData {
    fn from(v2: SnapshotV2) -> Self {
        SnapshotData {
            tenants: v2.tenants,
            api_keys: v2.api_keys,
            budgets: v2.budgets,
            policies: v2.policies,
            reservations: v2.reservations,
            idempotency: v2.idempotency,
            webhooks: v2.webhooks,
            webhook_security: v2.webhook_security,
            deliveries: v2.deliveries,
            last_event: v2.last_event,
            last_delivery: v2.last_delivery,
            ..SnapshotData::default()
        }
    }
}

/// The persistent state as format 1 wrote it, before webhooks: read from older snapshots.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotV1 {
    pub tenants: Vec<Tenant>,
    pub api_keys: Vec<ApiKey>,
    pub budgets: Vec<Budget>,
    pub policies: Vec<Policy>,
    pub reservations: Vec<Reservation>,
    pub idempotency: Vec<(IdemKey, IdemRecord)>,
}

impl From<SnapshotV1> for SnapshotData {
    fn from(v1: SnapshotV1) -> Self {
        SnapshotData {
            tenants: v1.tenants,
            api_keys: v1.api_keys,
            budgets: v1.budgets,
            policies: v1.policies,
            reservations: v1.reservations,
            idempotency: v1.idempotency,
            ..SnapshotData::default()
        }
    }
}

/// A frozen view of the persistent state (see [`State::snapshot_source`]).
#[derive(Debug, Clone)]
pub struct SnapshotSource {
    tenants: OrdMap<String, Tenant>,
    api_keys: OrdMap<String, ApiKey>,
    budgets: OrdMap<BudgetKey, Arc<Budget>>,
    policies: OrdMap<(String, String), Policy>,
    reservations: OrdMap<Arc<str>, Arc<Reservation>>,
    idempotency: OrdMap<Arrival, IdemEntry>,
    webhooks: OrdMap<String, Arc<WebhookSubscription>>,
    webhook_security: Option<WebhookSecurity>,
    deliveries: OrdMap<String, Arc<Delivery>>,
    last_event: u64,
    last_delivery: u64,
    rate_counts: OrdMap<RateKey, RateCount>,
    archived_keys: ArchivedKeys,
}

/// Serializes exactly as [`SnapshotData`] does (the same fields, in the same order), straight
/// from the shared maps: a snapshot is streamed to disk without a second copy of the state.
impl Serialize for SnapshotSource {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("SnapshotData", 13)?;
        s.serialize_field(
            "tenants",
            &Seq(self.tenants.len(), || self.tenants.values()),
        )?;
        s.serialize_field(
            "api_keys",
            &Seq(self.api_keys.len(), || self.api_keys.values()),
        )?;
        s.serialize_field(
            "budgets",
            &Seq(self.budgets.len(), || self.budgets.values()),
        )?;
        s.serialize_field(
            "policies",
            &Seq(self.policies.len(), || self.policies.values()),
        )?;
        s.serialize_field(
            "reservations",
            &Seq(self.reservations.len(), || self.reservations.values()),
        )?;
        s.serialize_field(
            "idempotency",
            &Seq(self.idempotency.len(), || {
                self.idempotency.values().map(|e| (&*e.key, &*e.record))
            }),
        )?;
        s.serialize_field(
            "webhooks",
            &Seq(self.webhooks.len(), || self.webhooks.values().map(|w| &**w)),
        )?;
        s.serialize_field("webhook_security", &self.webhook_security)?;
        s.serialize_field(
            "deliveries",
            &Seq(self.deliveries.len(), || {
                self.deliveries.values().map(|d| &**d)
            }),
        )?;
        s.serialize_field("last_event", &self.last_event)?;
        s.serialize_field("last_delivery", &self.last_delivery)?;
        s.serialize_field(
            "rate_counts",
            &Seq(self.rate_counts.len(), || self.rate_counts.iter()),
        )?;
        s.serialize_field("archived_keys", &self.archived_keys.snapshot_form())?;
        s.end()
    }
}

/// A sequence of known length produced by an iterator (as a `Vec` of its items would be).
struct Seq<F>(usize, F);

impl<F, I> Serialize for Seq<F>
where
    F: Fn() -> I,
    I: Iterator,
    I::Item: Serialize,
{
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = serializer.serialize_seq(Some(self.0))?;
        for item in (self.1)() {
            seq.serialize_element(&item)?;
        }
        seq.end()
    }
}

impl SnapshotSource {
    pub fn into_data(self) -> SnapshotData {
        SnapshotData {
            tenants: self.tenants.values().cloned().collect(),
            api_keys: self.api_keys.values().cloned().collect(),
            budgets: self.budgets.values().map(|b| (**b).clone()).collect(),
            policies: self.policies.values().cloned().collect(),
            reservations: self.reservations.values().map(|r| (**r).clone()).collect(),
            idempotency: self
                .idempotency
                .values()
                .map(|e| ((*e.key).clone(), (*e.record).clone()))
                .collect(),
            webhooks: self.webhooks.values().map(|w| (**w).clone()).collect(),
            webhook_security: self.webhook_security.clone(),
            deliveries: self.deliveries.values().map(|d| (**d).clone()).collect(),
            last_event: self.last_event,
            last_delivery: self.last_delivery,
            rate_counts: self
                .rate_counts
                .iter()
                .map(|(k, c)| (k.clone(), *c))
                .collect(),
            archived_keys: self.archived_keys.days(),
        }
    }
}

/// A broken rule found by [`State::verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

impl State {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn tenant(&self, id: &str) -> Option<&Tenant> {
        self.tenants.get(id)
    }

    pub fn budget(&self, key: &BudgetKey) -> Option<&Budget> {
        self.budgets.get(key).map(|b| &**b)
    }

    pub fn budgets(&self) -> impl Iterator<Item = &Budget> {
        self.budgets.values().map(|b| &**b)
    }

    pub fn reservation(&self, id: &str) -> Option<&Reservation> {
        self.reservations.get(id).map(|r| &**r)
    }

    pub fn tenants(&self) -> impl Iterator<Item = &Tenant> {
        self.tenants.values()
    }

    pub fn api_keys(&self) -> impl Iterator<Item = &ApiKey> {
        self.api_keys.values()
    }

    pub fn reservations(&self) -> impl Iterator<Item = &Reservation> {
        self.reservations.values().map(|r| &**r)
    }

    /// Webhook deliveries queued or waiting for a retry.
    pub fn deliveries_due(&self) -> usize {
        self.webhooks.due.len()
    }

    pub fn budget_count(&self) -> usize {
        self.budgets.len()
    }

    /// The id of the API key whose secret has this digest, whatever its status.
    pub fn key_id_by_digest(&self, digest: &[u8; 32]) -> Option<&str> {
        self.key_by_digest.get(digest).map(String::as_str)
    }

    /// Reservations in the state: the ACTIVE ones and those settled too recently to be
    /// archived yet.
    pub fn reservation_count(&self) -> usize {
        self.reservations.len()
    }

    /// The tenant of the API key whose secret has this digest, whatever its status.
    pub(crate) fn tenant_of_key(&self, digest: &[u8; 32]) -> Option<&str> {
        let key_id = self.key_by_digest.get(digest)?;
        Some(&self.api_keys.get(key_id)?.tenant_id)
    }

    /// What a reserve of `tenant` with idempotency `key` must look up in the store's
    /// history: the archived reservation it created, when the key has no record in the
    /// state but the digests of archived keys say an archived reserve may have used it in
    /// a window not over by `now`. A fresh key (nearly every reserve) needs no read of the
    /// disk.
    pub(crate) fn archived_reserve(
        &self,
        tenant: &str,
        key: &str,
        now: Millis,
    ) -> Option<ArchiveLookup> {
        let keys = &self.archived_keys;
        if keys.is_empty() {
            return None;
        }
        let times = keys.times(now, reserve_key_digest(tenant, key))?;
        let record = IdemKey {
            tenant_id: Arc::from(tenant),
            endpoint: Endpoint::Reserve,
            key: Arc::from(key),
        };
        self.idempotency
            .get(&record)
            .is_none()
            .then_some(ArchiveLookup::CreatedBy {
                tenant: record.tenant_id,
                key: record.key,
                created_at: times.created_at,
                any_time: times.any_time,
            })
    }

    /// Digests of archived reserves' keys held while their windows last.
    pub fn archived_key_count(&self) -> usize {
        self.archived_keys.len()
    }

    /// Whether an archived reserve's key is held without its time (read from a format-4 or
    /// -5 snapshot): while one is, the history store keeps its index of keys, by which
    /// alone that reserve is found.
    pub fn archived_keys_need_key_index(&self) -> bool {
        self.archived_keys.any_unknown_time()
    }

    /// Applies one effect, keeping every index in step.
    pub fn apply_effect(&mut self, effect: &Effect) {
        match effect {
            Effect::PutTenant(t) => {
                let old = self.tenants.insert(t.tenant_id.clone(), t.clone());
                self.inventory.tenant_written(old.as_ref(), t);
            }
            Effect::PutApiKey(k) => {
                self.key_by_digest.insert(k.digest, k.key_id.clone());
                if let Some(old) = self.api_keys.insert(k.key_id.clone(), k.clone()) {
                    self.key_expiry_index
                        .remove(&(old.expires_at_ms, old.key_id));
                }
                if k.status == ApiKeyStatus::Active {
                    self.key_expiry_index
                        .insert((k.expires_at_ms, k.key_id.clone()));
                }
            }
            Effect::PutBudget(b) => {
                let old = self.budgets.insert(b.key(), b.clone());
                self.inventory.budget_written(old.as_deref(), b);
            }
            Effect::PutPolicy(p) => {
                if !self.policy_tenants.contains(&p.tenant_id) {
                    self.policy_tenants.insert(p.tenant_id.clone());
                }
                self.policies
                    .insert((p.tenant_id.clone(), p.policy_id.clone()), p.clone());
            }
            Effect::PutRateCount(key, count) => {
                self.rate_counts.insert(key.clone(), *count);
            }
            Effect::PutReservation(r) => self.put_reservation(r),
            Effect::PutIdempotency(k, rec) => self.put_record(k, rec),
            Effect::RemoveReservation(id) => self.remove_reservation(id),
            Effect::RemoveIdempotency(k) => self.remove_record(k),
            Effect::ArchiveReservation(archived) => self.archive(archived),
            Effect::ForgetArchivedKeys { day } => self.archived_keys.forget_day(*day),
            Effect::ExpireReservation {
                reservation_id,
                at_ms,
            } => self.expire_reservation(reservation_id, *at_ms),
            Effect::Audit(_) => {}
            Effect::Event(event) => {
                if let Some(n) = Event::number(&event.event_id) {
                    self.webhooks.last_event = self.webhooks.last_event.max(n);
                }
            }
            Effect::PutWebhook(w) => {
                self.webhooks
                    .by_owner
                    .entry(w.tenant_id.clone())
                    .or_default()
                    .insert(w.subscription_id.clone());
                let old = self
                    .webhooks
                    .subscriptions
                    .insert(w.subscription_id.clone(), w.clone());
                if let Some(old) = old {
                    self.webhooks.count_levels(&old, -1);
                }
                self.webhooks.count_levels(w, 1);
            }
            Effect::RemoveWebhook(id) => {
                if let Some(old) = self.webhooks.subscriptions.remove(id) {
                    self.webhooks.count_levels(&old, -1);
                    if let Some(ids) = self.webhooks.by_owner.get_mut(&old.tenant_id) {
                        ids.remove(id);
                        if ids.is_empty() {
                            self.webhooks.by_owner.remove(&old.tenant_id);
                        }
                    }
                }
            }
            Effect::PutWebhookSecurity(config) => self.webhooks.security = Some(config.clone()),
            Effect::PutDelivery(d) => self.put_delivery(d),
        }
    }

    fn put_record(&mut self, k: &Arc<IdemKey>, rec: &Arc<IdemRecord>) {
        let (arrival, replaced) = self.idempotency.put(k, rec);
        match replaced {
            Some(old) => {
                self.retention_index.remove(&(old.expires_at_ms, arrival));
            }
            None => {
                if let Some(id) = settled_by(k) {
                    self.settlement_keys
                        .entry(id.clone())
                        .or_default()
                        .push(k.clone());
                }
            }
        }
        self.retention_index.insert((rec.expires_at_ms, arrival));
    }

    fn remove_record(&mut self, k: &IdemKey) {
        let Some((arrival, old)) = self.idempotency.remove(k) else {
            return;
        };
        self.retention_index.remove(&(old.expires_at_ms, arrival));
        if let Some(id) = settled_by(k) {
            if let Some(keys) = self.settlement_keys.get_mut(id) {
                keys.retain(|other| **other != *k);
                if keys.is_empty() {
                    self.settlement_keys.remove(id);
                }
            }
        }
    }

    fn remove_reservation(&mut self, id: &str) {
        if let Some(old) = self.reservations.remove(id) {
            self.unindex_reservation(&old);
        }
    }

    /// Takes a settled reservation and its records out of the state; the digest of its
    /// reserve's key stays while that record's window lasts.
    fn archive(&mut self, archived: &Archived) {
        let r = &archived.reservation;
        self.remove_reservation(&r.reservation_id);
        for (key, record) in &archived.records {
            self.remove_record(key);
            if key.endpoint == Endpoint::Reserve {
                self.archived_keys.insert(
                    record.expires_at_ms,
                    reserve_key_digest(&key.tenant_id, &key.key),
                    r.created_at_ms,
                );
            }
        }
    }

    /// The records of `id`'s commit, release and extensions, and its reserve's if that
    /// record names it: what leaves the state with it.
    pub(crate) fn records_of(&self, r: &Reservation) -> Vec<(Arc<IdemKey>, Arc<IdemRecord>)> {
        let reserve = IdemKey {
            tenant_id: r.tenant_id.clone(),
            endpoint: Endpoint::Reserve,
            key: r.idempotency_key.clone(),
        };
        let created = self.idempotency.entry(&reserve).filter(|(_, rec)| {
            matches!(&rec.outcome, StoredOutcome::Reserve(res)
                if res.reservation_id.as_deref() == Some(&*r.reservation_id))
        });
        let settlements = self
            .settlement_keys
            .get(&r.reservation_id)
            .into_iter()
            .flatten()
            .filter_map(|k| self.idempotency.entry(k));
        created
            .into_iter()
            .chain(settlements)
            .map(|(key, record)| (key.clone(), record.clone()))
            .collect()
    }

    fn put_delivery(&mut self, d: &Arc<Delivery>) {
        let w = &mut self.webhooks;
        if let Some(n) = d
            .delivery_id
            .strip_prefix("del_")
            .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        {
            w.last_delivery = w.last_delivery.max(n);
        }
        if let Some(old) = w.due.remove(&d.delivery_id) {
            w.index_due(&old.subscription_id, |due| {
                due.remove(&(old.next_attempt_at_ms, old.delivery_id.clone()));
            });
        }
        if !d.status.is_final() {
            w.index_due(&d.subscription_id, |due| {
                due.insert((d.next_attempt_at_ms, d.delivery_id.clone()));
            });
            w.due.insert(d.delivery_id.clone(), d.clone());
        }
    }

    /// Marks an ACTIVE reservation EXPIRED at `at` and moves it in the indexes (its status
    /// and its lapse change; the other orders do not). Anything but an ACTIVE reservation
    /// is left alone: the effect is only ever recorded for one.
    fn expire_reservation(&mut self, id: &Arc<str>, at: Millis) {
        let Some(slot) = self.reservations.get_mut(id) else {
            return;
        };
        if slot.status != ReservationStatus::Active {
            return;
        }
        let before = Lapse::of(slot);
        // In place unless a snapshot or a reply still shares this copy.
        let r = Arc::make_mut(slot);
        r.status = ReservationStatus::Expired;
        r.expired_at_ms = Some(at);
        let r = slot.clone();
        if let Some(index) = self.list_index.get_mut(&*r.tenant_id) {
            index.restatus(&r, ReservationStatus::Active);
        }
        self.remove_lapse_at(before, &r.reservation_id);
        self.add_lapse(&r);
    }

    fn put_reservation(&mut self, r: &Arc<Reservation>) {
        match self
            .reservations
            .insert(r.reservation_id.clone(), r.clone())
        {
            Some(old) => self.reindex_reservation(&old, r),
            None => self.index_reservation(r),
        }
    }

    fn index_reservation(&mut self, r: &Reservation) {
        self.tenant_index(&r.tenant_id).insert(r);
        self.add_lapse(r);
    }

    /// The listing index of `tenant`, created on first use. Looked up before inserting:
    /// `entry` would copy the tenant id on every reserve.
    fn tenant_index(&mut self, tenant: &str) -> &mut ListIndex {
        if !self.list_index.contains_key(tenant) {
            self.list_index
                .insert(tenant.to_string(), ListIndex::default());
        }
        self.list_index
            .get_mut(tenant)
            .expect("the index was inserted above")
    }

    fn unindex_reservation(&mut self, r: &Reservation) {
        if let Some(index) = self.list_index.get_mut(&*r.tenant_id) {
            index.remove(r);
            if index.is_empty() {
                self.list_index.remove(&*r.tenant_id);
            }
        }
        self.remove_lapse(r);
    }

    /// Moves a changed reservation in the indexes, touching only the orders whose value
    /// changed (a commit changes the status and the lapse time, not the other five orders).
    fn reindex_reservation(&mut self, old: &Reservation, new: &Reservation) {
        debug_assert_eq!(
            old.tenant_id, new.tenant_id,
            "a reservation never moves tenant"
        );
        match self.list_index.get_mut(&*new.tenant_id) {
            Some(index) => index.update(old, new),
            None => self.tenant_index(&new.tenant_id).insert(new),
        }
        if Lapse::of(old) != Lapse::of(new) {
            self.remove_lapse(old);
            self.add_lapse(new);
        }
    }

    fn add_lapse(&mut self, r: &Reservation) {
        let id = r.reservation_id.clone();
        match Lapse::of(r) {
            Lapse::Expires(at) => self.expiry_index.insert((at, id)),
            Lapse::Settled(at) => self.settled_index.insert((at, id)),
        };
    }

    fn remove_lapse(&mut self, r: &Reservation) {
        self.remove_lapse_at(Lapse::of(r), &r.reservation_id);
    }

    fn remove_lapse_at(&mut self, lapse: Lapse, id: &Arc<str>) {
        let id = id.clone();
        match lapse {
            Lapse::Expires(at) => self.expiry_index.remove(&(at, id)),
            Lapse::Settled(at) => self.settled_index.remove(&(at, id)),
        };
    }

    /// A consistent copy of the persistent part of the state, in O(1): the maps are shared
    /// until either side changes. Turning it into [`SnapshotData`] is the expensive part and
    /// can happen on another thread.
    pub fn snapshot_source(&self) -> SnapshotSource {
        SnapshotSource {
            tenants: self.tenants.clone(),
            api_keys: self.api_keys.clone(),
            budgets: self.budgets.clone(),
            policies: self.policies.clone(),
            reservations: self.reservations.clone(),
            idempotency: self.idempotency.shared(),
            webhooks: self.webhooks.subscriptions.clone(),
            webhook_security: self.webhooks.security.clone(),
            deliveries: self.webhooks.due.clone(),
            last_event: self.webhooks.last_event,
            last_delivery: self.webhooks.last_delivery,
            rate_counts: self.rate_counts.clone(),
            archived_keys: self.archived_keys.clone(),
        }
    }

    /// The persistent part of the state.
    pub fn to_snapshot(&self) -> SnapshotData {
        self.snapshot_source().into_data()
    }

    /// Rebuilds a state (indexes included) from a snapshot.
    pub fn from_snapshot(data: SnapshotData) -> Self {
        let mut state = State::new();
        for t in data.tenants {
            state.apply_effect(&Effect::PutTenant(t));
        }
        for k in data.api_keys {
            state.apply_effect(&Effect::PutApiKey(k));
        }
        for b in data.budgets {
            state.apply_effect(&Effect::PutBudget(Arc::new(b)));
        }
        for p in data.policies {
            state.apply_effect(&Effect::PutPolicy(p));
        }
        for w in data.webhooks {
            state.apply_effect(&Effect::PutWebhook(Arc::new(w)));
        }
        if let Some(config) = data.webhook_security {
            state.apply_effect(&Effect::PutWebhookSecurity(config));
        }
        for d in data.deliveries {
            state.apply_effect(&Effect::PutDelivery(Arc::new(d)));
        }
        for (key, count) in data.rate_counts {
            state.apply_effect(&Effect::PutRateCount(key, count));
        }
        state.webhooks.last_event = state.webhooks.last_event.max(data.last_event);
        state.webhooks.last_delivery = state.webhooks.last_delivery.max(data.last_delivery);
        // Reservations and idempotency records can number millions: build their maps and
        // ordered indexes in bulk rather than one effect at a time.
        let mut expiry = Vec::new();
        let mut settled = Vec::new();
        let mut per_tenant: HashMap<&str, Vec<&Reservation>> = HashMap::new();
        for r in &data.reservations {
            per_tenant.entry(&r.tenant_id).or_default().push(r);
            let id = r.reservation_id.clone();
            match Lapse::of(r) {
                Lapse::Expires(at) => expiry.push((at, id)),
                Lapse::Settled(at) => settled.push((at, id)),
            }
        }
        state.list_index = per_tenant
            .into_iter()
            .map(|(tenant, rows)| (tenant.to_string(), ListIndex::build(rows.into_iter())))
            .collect();
        state.idempotency = IdemTable::from_records(data.idempotency);
        state.retention_index = state
            .idempotency
            .entries()
            .map(|(arrival, e)| (e.record.expires_at_ms, arrival))
            .collect();
        for (_, e) in state.idempotency.entries() {
            if let Some(id) = settled_by(&e.key) {
                state
                    .settlement_keys
                    .entry(id.clone())
                    .or_default()
                    .push(e.key.clone());
            }
        }
        state.expiry_index = expiry.into_iter().collect();
        state.settled_index = settled.into_iter().collect();
        state.archived_keys = ArchivedKeys::from_days(data.archived_keys);
        let (placements, actions) = (state.placements.get_mut(), state.actions.get_mut());
        state.reservations = data
            .reservations
            .into_iter()
            .map(|mut r| {
                share_loaded(placements, actions, &mut r);
                (r.reservation_id.clone(), Arc::new(r))
            })
            .collect();
        state
    }

    /// The retention order with records named by key, comparable across rebuilds (arrivals
    /// are numbered per process, so a state rebuilt from a snapshot numbers the same records
    /// differently, in the same order).
    fn retention_by_name(&self) -> Vec<(Millis, Option<&IdemKey>)> {
        self.retention_index
            .iter()
            .map(|(at, arrival)| (*at, self.idempotency.key_at(*arrival).map(|k| &**k)))
            .collect()
    }

    /// Checks the ledger's rules on the whole state: the balance invariant on every budget,
    /// that each budget's `reserved` equals the holds of its ACTIVE reservations, and that
    /// the ordered indexes (kept incrementally) equal indexes rebuilt from scratch.
    pub fn verify(&self) -> Vec<Violation> {
        let mut violations = Vec::new();
        let rebuilt = State::from_snapshot(self.to_snapshot());
        if rebuilt.list_index != self.list_index
            || rebuilt.expiry_index != self.expiry_index
            || rebuilt.settled_index != self.settled_index
            || rebuilt.settlement_keys != self.settlement_keys
            || rebuilt.archived_keys != self.archived_keys
            || rebuilt.key_expiry_index != self.key_expiry_index
            || rebuilt.webhooks.custom_levels != self.webhooks.custom_levels
            || rebuilt.retention_by_name() != self.retention_by_name()
            || rebuilt.inventory != self.inventory
            || rebuilt.policy_tenants != self.policy_tenants
        {
            violations.push(Violation(
                "the ordered indexes differ from indexes rebuilt from the rows".into(),
            ));
        }
        if !self.idempotency.is_consistent() {
            violations.push(Violation(
                "the idempotency lookup table and its ordered records differ".into(),
            ));
        }
        let mut holds: HashMap<BudgetKey, i64> = HashMap::new();
        for r in self.reservations.values() {
            if r.status != ReservationStatus::Active {
                continue;
            }
            for scope in r.budgeted_scopes.iter() {
                let key = BudgetKey {
                    scope: scope.clone(),
                    unit: r.unit,
                };
                let sum = holds.entry(key).or_insert(0);
                *sum = sum.saturating_add(r.estimate);
            }
        }
        for b in self.budgets.values() {
            if let Err(e) = b.check_invariant() {
                violations.push(Violation(e.to_string()));
            }
            let held = holds.remove(&b.key()).unwrap_or(0);
            if held != b.reserved {
                violations.push(Violation(format!(
                    "{} {}: reserved {} but ACTIVE reservations hold {held}",
                    b.scope,
                    b.unit.as_str(),
                    b.reserved
                )));
            }
        }
        for (key, held) in holds {
            violations.push(Violation(format!(
                "{} {}: ACTIVE reservations hold {held} on a budget that does not exist",
                key.scope,
                key.unit.as_str()
            )));
        }
        violations
    }
}

/// When a reservation next needs the ledger's attention: an ACTIVE one expires at its
/// settle deadline; a settled one is archived some time after it settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lapse {
    Expires(Millis),
    Settled(Millis),
}

impl Lapse {
    fn of(r: &Reservation) -> Lapse {
        match r.settled_at_ms() {
            None => Lapse::Expires(r.settle_deadline()),
            Some(at) => Lapse::Settled(at),
        }
    }
}

/// The reservation a commit's, release's or extension's record belongs to.
fn settled_by(key: &IdemKey) -> Option<&Arc<str>> {
    match &key.endpoint {
        Endpoint::Commit(id) | Endpoint::Release(id) | Endpoint::Extend(id) => Some(id),
        _ => None,
    }
}
