//! Settling reservations: commit, release, extend, expire, and reading one.

use std::ops::Deref;
use std::sync::Arc;

use crate::{
    settle_commit, state::TERMINAL_RETENTION_MS, Actor, Balance, Budget, CommitCmd, CommitResult,
    Effect, Endpoint, ExtendCmd, ExtendResult, IdemKey, Outcome, Permission, Rejection, ReleaseCmd,
    ReleaseResult, Reservation, ReservationStatus, StoredOutcome, TenantStatus,
};

use super::{Tx, DAY_MS};

impl Tx<'_> {
    /// The reservation, if it exists and the caller may act on it (`None` caller = admin).
    fn owned_reservation(
        &self,
        id: &str,
        caller_tenant: Option<&str>,
    ) -> Result<Reservation, Rejection> {
        let r = self
            .state
            .reservations
            .get(id)
            .ok_or_else(|| Rejection::NotFound(format!("Reservation not found: {id}")))?;
        match caller_tenant {
            Some(t) if t != &*r.tenant_id => Err(Rejection::Forbidden(format!(
                "Reservation {id} belongs to another tenant"
            ))),
            _ => Ok((**r).clone()),
        }
    }

    /// The checks shared by commit, release and extend after replay detection: the owning
    /// tenant must not be CLOSED (this beats the reservation's own state), and the
    /// reservation must still be ACTIVE.
    fn settleable(&self, r: &Reservation) -> Result<(), Rejection> {
        if self
            .state
            .tenants
            .get(&*r.tenant_id)
            .is_some_and(|t| t.status == TenantStatus::Closed)
        {
            return Err(Rejection::TenantClosed(r.tenant_id.to_string()));
        }
        match r.status {
            ReservationStatus::Active => Ok(()),
            ReservationStatus::Expired => {
                Err(Rejection::ReservationExpired(r.reservation_id.to_string()))
            }
            status @ (ReservationStatus::Committed | ReservationStatus::Released) => {
                Err(Rejection::ReservationFinalized {
                    id: r.reservation_id.to_string(),
                    status: status.as_str(),
                })
            }
        }
    }

    /// The budgets a reservation holds on. They cannot disappear (budgets are never deleted),
    /// so a missing one means the state is corrupt.
    fn held_budgets(&self, r: &Reservation) -> Result<Vec<Budget>, Rejection> {
        let budgets = self.budgets_for(r.budgeted_scopes.iter().cloned(), r.unit);
        if budgets.len() != r.budgeted_scopes.len() {
            return Err(Rejection::Internal(format!(
                "reservation {} holds on a budget that does not exist",
                r.reservation_id
            )));
        }
        Ok(budgets)
    }

    /// Gives a reservation's hold back to every budget it was taken from; returns the new
    /// balances.
    fn return_hold(&mut self, r: &Reservation) -> Result<Vec<Balance>, Rejection> {
        let mut budgets = self.held_budgets(r)?;
        for b in &mut budgets {
            b.unhold(r.estimate)?;
        }
        let balances = budgets.iter().map(Balance::from).collect();
        self.put_budgets(budgets)?;
        Ok(balances)
    }

    /// Expires an ACTIVE reservation: its hold returns to every budget it was taken from.
    /// `r` is let go before the state changes, so that a caller passing the state's own
    /// `Arc` leaves it unshared and the state's copy is changed in place.
    pub(crate) fn expire(&mut self, r: impl Deref<Target = Reservation>) -> Result<(), Rejection> {
        self.return_hold(&r)?;
        let reservation_id = r.reservation_id.clone();
        drop(r);
        self.put(Effect::ExpireReservation {
            reservation_id,
            at_ms: self.now,
        });
        Ok(())
    }

    /// Refuses a settlement past the grace period, recording the expiry it discovered.
    fn refuse_if_lapsed(&mut self, r: &Reservation) -> Result<(), Rejection> {
        if self.now > r.settle_deadline() {
            self.expire(r)?;
            return Err(Rejection::ReservationExpired(r.reservation_id.to_string()));
        }
        Ok(())
    }

    pub(crate) fn commit(&mut self, cmd: CommitCmd) -> Result<Outcome, Rejection> {
        let caller = self.tenant_caller(&cmd.actor, Permission::ReservationsCommit)?;
        let r = self.owned_reservation(&cmd.reservation_id, Some(&caller.tenant_id))?;
        let idem_key = IdemKey {
            tenant_id: caller.tenant_id,
            endpoint: Endpoint::Commit(r.reservation_id.clone()),
            key: cmd.idem.key.clone(),
        };
        if let Some(stored) = self.replay(&idem_key, &cmd.idem.fingerprint)? {
            let StoredOutcome::Commit(result) = stored else {
                return Err(Rejection::IdempotencyMismatch);
            };
            return Ok(Outcome::Committed {
                result,
                replayed: true,
            });
        }
        self.settleable(&r)?;
        if cmd.unit != r.unit {
            return Err(Rejection::UnitMismatch {
                message: format!(
                    "Commit unit {} does not match the reservation's unit {}",
                    cmd.unit.as_str(),
                    r.unit.as_str()
                ),
                scope: None,
                requested: cmd.unit,
                expected: vec![r.unit],
            });
        }
        self.refuse_if_lapsed(&r)?;
        let charge = settle_commit(
            &self.held_budgets(&r)?,
            r.estimate,
            cmd.actual,
            r.overage_policy,
        )?;
        let result = CommitResult {
            unit: r.unit,
            charged: charge.charged,
            released: (charge.charged < r.estimate).then(|| r.estimate - charge.charged),
            balances: charge.budgets.iter().map(Balance::from).collect(),
        };
        self.put_budgets(charge.budgets)?;
        let mut committed = r;
        committed.status = ReservationStatus::Committed;
        committed.charged = Some(charge.charged);
        committed.finalized_at_ms = Some(self.now);
        committed.committed_metadata = cmd.metadata;
        self.put(Effect::PutReservation(Arc::new(committed)));
        let result = self.remember_result(
            idem_key,
            cmd.idem.fingerprint,
            result,
            StoredOutcome::Commit,
            TERMINAL_RETENTION_MS,
        );
        Ok(Outcome::Committed {
            result,
            replayed: false,
        })
    }

    pub(crate) fn release(&mut self, cmd: ReleaseCmd) -> Result<Outcome, Rejection> {
        let caller = self.admin_or_tenant(&cmd.actor, Permission::ReservationsRelease)?;
        let r =
            self.owned_reservation(&cmd.reservation_id, caller.as_ref().map(|c| &*c.tenant_id))?;
        let idem_key = IdemKey {
            tenant_id: r.tenant_id.clone(),
            endpoint: Endpoint::Release(r.reservation_id.clone()),
            key: cmd.idem.key.clone(),
        };
        if let Some(stored) = self.replay(&idem_key, &cmd.idem.fingerprint)? {
            let StoredOutcome::Release(result) = stored else {
                return Err(Rejection::IdempotencyMismatch);
            };
            return Ok(Outcome::Released {
                result,
                replayed: true,
            });
        }
        self.settleable(&r)?;
        self.refuse_if_lapsed(&r)?;
        let result = self.release_hold(r, cmd.reason)?;
        let result = self.remember_result(
            idem_key,
            cmd.idem.fingerprint,
            result,
            StoredOutcome::Release,
            TERMINAL_RETENTION_MS,
        );
        Ok(Outcome::Released {
            result,
            replayed: false,
        })
    }

    /// Releases an ACTIVE reservation: its hold returns to every budget it was taken from.
    pub(crate) fn release_hold(
        &mut self,
        r: Reservation,
        reason: Option<String>,
    ) -> Result<ReleaseResult, Rejection> {
        let result = ReleaseResult {
            unit: r.unit,
            released: r.estimate,
            balances: self.return_hold(&r)?,
        };
        let mut released = r;
        released.status = ReservationStatus::Released;
        released.finalized_at_ms = Some(self.now);
        released.release_reason = reason;
        self.put(Effect::PutReservation(Arc::new(released)));
        Ok(result)
    }

    pub(crate) fn extend(&mut self, cmd: ExtendCmd) -> Result<Outcome, Rejection> {
        let caller = self.tenant_caller(&cmd.actor, Permission::ReservationsExtend)?;
        let r = self.owned_reservation(&cmd.reservation_id, Some(&caller.tenant_id))?;
        let idem_key = IdemKey {
            tenant_id: caller.tenant_id,
            endpoint: Endpoint::Extend(r.reservation_id.clone()),
            key: cmd.idem.key.clone(),
        };
        if let Some(stored) = self.replay(&idem_key, &cmd.idem.fingerprint)? {
            let StoredOutcome::Extend(result) = stored else {
                return Err(Rejection::IdempotencyMismatch);
            };
            let remaining_ttl_ms = r.remaining_ttl_ms(result.expires_at_ms, self.now);
            return Ok(Outcome::Extended {
                result,
                remaining_ttl_ms,
                replayed: true,
            });
        }
        self.settleable(&r)?;
        self.refuse_if_lapsed(&r)?;
        if self.now > r.expires_at_ms {
            // Within grace a commit or release is still accepted, but the lease is over.
            return Err(Rejection::ReservationExpired(r.reservation_id.to_string()));
        }
        if r.extension_count >= r.max_extensions {
            return Err(Rejection::MaxExtensionsExceeded {
                id: r.reservation_id.to_string(),
                max: r.max_extensions,
            });
        }
        let max_ttl = self.existing_tenant(&r.tenant_id)?.max_reservation_ttl_ms;
        // The lease grows from the current expiry, but never further than the tenant's
        // maximum TTL from now (and never shrinks).
        let expires_at_ms = r
            .expires_at_ms
            .saturating_add(cmd.extend_by_ms)
            .min(self.now.saturating_add(max_ttl))
            .max(r.expires_at_ms);
        let result = ExtendResult {
            expires_at_ms,
            balances: self.held_budgets(&r)?.iter().map(Balance::from).collect(),
        };
        let mut extended = r;
        extended.expires_at_ms = expires_at_ms;
        extended.extension_count += 1;
        let retention = (extended.settle_deadline() - self.now).max(DAY_MS);
        let remaining_ttl_ms = extended.remaining_ttl_ms(expires_at_ms, self.now);
        self.put(Effect::PutReservation(Arc::new(extended)));
        let result = self.remember_result(
            idem_key,
            cmd.idem.fingerprint,
            result,
            StoredOutcome::Extend,
            retention,
        );
        Ok(Outcome::Extended {
            result,
            remaining_ttl_ms,
            replayed: false,
        })
    }

    pub(crate) fn get_reservation(
        &mut self,
        actor: &Actor,
        id: &str,
    ) -> Result<Outcome, Rejection> {
        let caller = self.admin_or_tenant(actor, Permission::ReservationsList)?;
        let mut r = self.owned_reservation(id, caller.as_ref().map(|c| &*c.tenant_id))?;
        r.status = r.effective_status(self.now);
        if r.status == ReservationStatus::Expired {
            return Err(Rejection::ReservationExpired(id.to_string()));
        }
        Ok(Outcome::Reservation(Box::new(r)))
    }
}
