//! `POST /v1/decide`: would a spend be admitted? Nothing is held.

use crate::{
    derive_scopes, DecideResult, Decision, Endpoint, IdemKey, Permission, Rejection, Subject, Unit,
};

use super::admission::{decision_with, Blocked};
use super::{operation, Actor, Idempotency, Idempotent, Tx, DAY_MS};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decide {
    pub actor: Actor,
    pub idem: Idempotency,
    pub subject: Subject,
    pub unit: Unit,
    pub estimate: i64,
}

operation!(Decide => Idempotent<DecideResult>, decide);

impl Tx<'_> {
    fn decide(&mut self, cmd: Decide) -> Result<Idempotent<DecideResult>, Rejection> {
        let caller = self.tenant_caller(&cmd.actor, Permission::ReservationsCreate)?;
        self.check_subject_tenant(&cmd.subject, &caller.tenant_id)?;
        let scopes = derive_scopes(&cmd.subject);
        let key = IdemKey {
            tenant_id: caller.tenant_id.clone(),
            endpoint: Endpoint::Decide,
            key: cmd.idem.key.clone(),
        };
        self.once(Some((key, cmd.idem.fingerprint)), |tx| {
            let result = match tx.admit(&caller.tenant_id, &scopes, cmd.unit, cmd.estimate) {
                Ok(_) => {
                    let path = scopes.last().cloned().unwrap_or_default();
                    let caps = tx.caps_for(&caller.tenant_id, &path);
                    DecideResult {
                        decision: decision_with(&caps),
                        reason_code: None,
                        caps,
                        affected_scopes: scopes,
                    }
                }
                Err(Blocked::Deny(reason, _)) => {
                    let tenant_scope = scopes.first().cloned().unwrap_or_default();
                    tx.denied_event(super::reserve::Denial {
                        actor: &cmd.actor,
                        tenant_id: &caller.tenant_id,
                        scope: &tenant_scope,
                        unit: cmd.unit,
                        requested: cmd.estimate,
                        reason,
                        action: None,
                    });
                    DecideResult {
                        decision: Decision::Deny,
                        reason_code: Some(reason.to_string()),
                        caps: None,
                        affected_scopes: scopes,
                    }
                }
                Err(Blocked::Error(e)) => return Err(e),
            };
            Ok((result, DAY_MS))
        })
    }
}
