//! The application state shared by every handler.

use std::sync::Arc;

use ledger::{
    Actor, AuditPage, AuditQuery, Authenticate, ListReservations, Operation, Principal,
    ReservationPage,
};
use protocol::{ApiError, Plane};
use store::RequestContext;
use store::{AuditFn, Engine, Reply, Store, StoreError};

use crate::audit::{self, AuditDetail, AuditScope, UnauthenticatedBudget};
use crate::forward::Forwarder;
use crate::origin;
use crate::webhooks::{DispatchCounters, Webhooks};

use crate::auth::AdminKey;
use crate::detector::Detector;
use crate::jobs::SweepCounters;
use crate::limits::{self, Bounds};
use crate::load::LoadTracker;
use crate::metrics::HttpMetrics;
use crate::reply::Failure;

pub struct App {
    store: Arc<Engine>,
    admin_key: AdminKey,
    load: LoadTracker,
    http_metrics: HttpMetrics,
    sweep_counters: Arc<SweepCounters>,
    public_metrics: bool,
    unauthenticated: Arc<UnauthenticatedBudget>,
    webhooks: Arc<Webhooks>,
    dispatch_counters: Arc<DispatchCounters>,
    bounds: Arc<Bounds>,
    detector: Arc<Detector>,
    /// Hands writes to the instance holding the Redis engine's lease (`crate::forward`).
    forwarder: Option<Forwarder>,
}

impl App {
    pub fn new(
        store: Arc<Engine>,
        admin_api_key: &str,
        public_metrics: bool,
        audit_unauthenticated_per_minute: u32,
        webhooks: Arc<Webhooks>,
        bounds: Arc<Bounds>,
        detector: Arc<Detector>,
    ) -> Self {
        App {
            forwarder: Forwarder::new(store.clone()),
            store,
            admin_key: AdminKey::new(admin_api_key),
            load: LoadTracker::default(),
            http_metrics: HttpMetrics::default(),
            sweep_counters: Arc::default(),
            public_metrics,
            unauthenticated: Arc::new(UnauthenticatedBudget::new(audit_unauthenticated_per_minute)),
            webhooks,
            dispatch_counters: Arc::default(),
            bounds,
            detector,
        }
    }

    /// Sealing, the SSRF guard and the outbound client.
    pub fn webhooks(&self) -> &Arc<Webhooks> {
        &self.webhooks
    }

    /// What the webhook dispatcher has done (shared with it).
    pub fn dispatch_counters(&self) -> &Arc<DispatchCounters> {
        &self.dispatch_counters
    }

    /// The client that hands writes to the instance holding the Redis engine's lease, when
    /// this instance does (`--redis-advertise-url`).
    pub fn forwarder(&self) -> Option<&Forwarder> {
        self.forwarder.as_ref()
    }

    /// The limits on connections and requests, what they share and how often they bit.
    pub fn bounds(&self) -> &Arc<Bounds> {
        &self.bounds
    }

    /// The anomaly detector's counts (shared with its task).
    pub fn detector(&self) -> &Arc<Detector> {
        &self.detector
    }

    /// Counts a reservation decision for the detector: an answer (`denied` says whether it
    /// was a DENY), or a refusal by a budget.
    pub fn note_decision<T>(
        &self,
        ran: &Result<(T, Option<Arc<str>>), Failure>,
        denied: impl FnOnce(&T) -> bool,
    ) {
        match ran {
            Ok((output, Some(tenant))) => self.detector.decided(tenant, denied(output)),
            Err(Failure {
                error,
                tenant: Some(tenant),
                ..
            }) if error.code.is_denial() => self.detector.decided(tenant, true),
            _ => {}
        }
    }

    /// Counts a commit or a release for the detector's expiry rate.
    pub fn note_settled<T>(&self, ran: &Result<(T, Option<Arc<str>>), Failure>) {
        if let Ok((_, Some(tenant))) = ran {
            self.detector.settled(tenant, 0, 1);
        }
    }

    /// The budget of unauthenticated refusals' audit entries (see [`UnauthenticatedBudget`]).
    pub fn unauthenticated(&self) -> &Arc<UnauthenticatedBudget> {
        &self.unauthenticated
    }

    pub fn admin_key(&self) -> &AdminKey {
        &self.admin_key
    }

    /// Requests in flight, and whether one is alone.
    pub fn load(&self) -> &LoadTracker {
        &self.load
    }

    pub fn http_metrics(&self) -> &HttpMetrics {
        &self.http_metrics
    }

    /// What the background sweep has done (shared with it).
    pub fn sweep_counters(&self) -> &Arc<SweepCounters> {
        &self.sweep_counters
    }

    pub fn public_metrics(&self) -> bool {
        self.public_metrics
    }

    pub fn store(&self) -> &Arc<Engine> {
        &self.store
    }

    /// Executes an operation; a refusal becomes the protocol error of `plane`. Answers the
    /// operation's own output and the caller's tenant, once known.
    pub async fn run<O: Operation>(
        &self,
        operation: O,
        plane: Plane,
    ) -> Result<(O::Output, Option<Arc<str>>), Failure> {
        let load = self.load.current();
        let context = RequestContext {
            origin: origin::current,
            audit: None,
        };
        Self::answer(self.store.execute_in(operation, load, context).await, plane)
    }

    /// Executes an operation that changes something; inside an audited request (see
    /// [`audit`]) its audit entry is written with its effects, in the same durable step.
    pub async fn mutate<O: Operation>(
        &self,
        operation: O,
        plane: Plane,
    ) -> Result<(O::Output, Option<Arc<str>>), Failure>
    where
        O::Output: AuditDetail,
    {
        let Some(scope) = audit::current() else {
            return self.run(operation, plane).await;
        };
        let audit: AuditFn<O::Output> = Box::new(move |facts| scope.entry(facts, plane));
        let load = self.load.current();
        let context = RequestContext {
            origin: origin::current,
            audit: Some(audit),
        };
        Self::answer(self.store.execute_in(operation, load, context).await, plane)
    }

    /// Writes the entry of an audited request that was answered `error` before its
    /// operation reached the store. The caller is resolved on the way (an operation that
    /// changes nothing carries the entry), so the entry names the tenant and key it can.
    ///
    /// Answers the instance holding the Redis engine's lease if the entry is to be written
    /// there: the request is then sent to it whole (`crate::forward`), refused there alike,
    /// and its entry written with its refusal.
    pub async fn audit_refusal(&self, scope: Arc<AuditScope>, error: ApiError) -> Option<Arc<str>> {
        // With no credential, resolving the admin is the no-op that carries the entry.
        let actor = scope.presented().actor().unwrap_or(Actor::Admin);
        let audit: AuditFn<Principal> = Box::new(move |facts| {
            let caller = match facts.result {
                Ok(Principal::Tenant { .. }) => facts.tenant,
                _ => None,
            };
            scope.refusal_entry(&error, caller, facts.state, facts.now)
        });
        let load = self.load.current();
        let context = RequestContext {
            origin: origin::current,
            audit: Some(audit),
        };
        let written = self
            .store
            .execute_in(Authenticate(actor), load, context)
            .await;
        match written {
            Ok(_) => None,
            Err(StoreError::Forward(peer)) => Some(peer),
            Err(e) => {
                tracing::warn!(error = %e, "the audit entry of a refused request was not written");
                None
            }
        }
    }

    /// Reads the history store (events, deliveries).
    pub async fn store_history<T, F>(&self, read: F) -> Result<T, Failure>
    where
        T: Send + 'static,
        F: FnOnce(&dyn store::History) -> std::io::Result<T> + Send + 'static,
    {
        self.store.read_history(read).await.map_err(|e| {
            ApiError::unavailable(format!("The history store is unavailable: {e}")).into()
        })
    }

    /// A page of reservations: the state's (the ACTIVE ones and the recently settled),
    /// then the history store's archived ones after the same cursor, merged in the
    /// listing's order. The state is read first: a reservation archived meanwhile is in
    /// the history store by then (and one in both is taken once).
    pub async fn list_reservations(
        &self,
        query: ListReservations,
    ) -> Result<(ReservationPage, Option<Arc<str>>), Failure> {
        let listing = query.clone();
        let (page, tenant) = self.run(query, Plane::Runtime).await?;
        if listing.idempotency_key.is_some() {
            // At most one row, which the ledger found wherever its reserve's record is.
            return Ok((page, tenant));
        }
        let (listed, archive_query) = (page.tenant.clone(), listing.clone());
        let archived = self
            .store_history(move |history| history.archived_page(&listed, &archive_query))
            .await
            .map_err(|mut failure| {
                failure.tenant = tenant.clone();
                failure
            })?;
        Ok((listing.merge(page, archived), tenant))
    }

    /// A page of the audit log.
    pub async fn audit_page(&self, query: AuditQuery) -> Result<AuditPage, Failure> {
        self.store
            .read_history(move |history| history.audit_page(&query))
            .await
            .map_err(|e| ApiError::unavailable(format!("The audit log is unavailable: {e}")).into())
    }

    /// A store's reply as a handler's result; a refusal becomes the protocol error of
    /// `plane`.
    fn result<T>(reply: Reply<T>, plane: Plane) -> Result<(T, Option<Arc<str>>), Failure> {
        match reply.result {
            Ok(output) => Ok((output, reply.tenant)),
            Err(rejection) => Err(Failure {
                error: ApiError::from_rejection(rejection, plane),
                tenant: reply.tenant,
                forward: None,
            }),
        }
    }

    fn answer<T>(
        reply: Result<Reply<T>, StoreError>,
        plane: Plane,
    ) -> Result<(T, Option<Arc<str>>), Failure> {
        match reply {
            Ok(reply) => {
                // The ledger resolved the request's key to its tenant: it has a share of
                // requests in flight of its own (`limits::KeyShares`).
                if reply.tenant.is_some() {
                    limits::credential_accepted();
                }
                Self::result(reply, plane)
            }
            Err(StoreError::Unavailable(why)) => Err(ApiError::unavailable(format!(
                "Storage is unavailable, nothing was recorded: {why}"
            ))
            .retry_after(1)
            .into()),
            Err(StoreError::OutcomeUnknown(why)) => Err(ApiError::unavailable(format!(
                "Storage did not answer, so whether this was recorded is unknown; retry with the \
                 same idempotency key, which answers it either way: {why}"
            ))
            .retry_after(1)
            .into()),
            Err(StoreError::ShuttingDown) => {
                Err(ApiError::unavailable("The server is shutting down").into())
            }
            // Answered by `crate::forward`, which sends the request to that instance; the
            // error is what a request that could not be sent would be told.
            Err(StoreError::Forward(peer)) => Err(Failure {
                error: ApiError::unavailable(
                    "Another instance writes the ledger now, and the request was not sent to it",
                )
                .retry_after(1),
                tenant: None,
                forward: Some(peer),
            }),
        }
    }

    /// Parses a request with `parse` (see [`App::validated`]) and runs the operation it
    /// becomes.
    pub async fn run_parsed<T, O: Operation>(
        &self,
        actor: &Actor,
        plane: Plane,
        parse: impl FnOnce() -> Result<T, ApiError>,
        operation: impl FnOnce(T) -> O,
    ) -> Result<(O::Output, Option<Arc<str>>), Failure> {
        let parsed = self.validated(actor, plane, parse).await?;
        self.run(operation(parsed), plane).await
    }

    /// Parses and validates a request. When that fails, the caller's credentials are checked
    /// first, so an unauthenticated caller gets 401 rather than a hint about the body.
    pub async fn validated<T>(
        &self,
        actor: &Actor,
        plane: Plane,
        parse: impl FnOnce() -> Result<T, ApiError>,
    ) -> Result<T, Failure> {
        match parse() {
            Ok(value) => Ok(value),
            Err(invalid) => {
                self.run(Authenticate(actor.clone()), plane).await?;
                Err(invalid.into())
            }
        }
    }
}
