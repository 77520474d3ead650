//! Idempotency, once for every operation: replay the stored result of the same request,
//! refuse the same key with another request, or run the operation and store its result in
//! the same step.

use std::sync::Arc;

use crate::{
    BulkResult, CommitResult, DecideResult, Endpoint, EventResult, ExtendResult, FundResult,
    IdemKey, IdemRecord, Millis, Rejection, ReleaseResult, ReserveResult, StoredOutcome,
};

use super::Tx;

/// Fields shared by every idempotent request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotency {
    /// Shared with the idempotency record and, for a reserve, the reservation.
    pub key: Arc<str>,
    /// SHA-256 of the request's canonical JSON.
    pub fingerprint: [u8; 32],
}

/// The answer of an idempotent operation: its result, shared with the record that replays
/// it, and whether this answer is a replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotent<R> {
    pub result: Arc<R>,
    pub replayed: bool,
}

/// A result an idempotency record can hold: one variant of [`StoredOutcome`].
pub(crate) trait Replayable: Sized {
    fn stored(result: Arc<Self>) -> StoredOutcome;
    /// `None` when the record holds another kind of result.
    fn replayed(stored: &StoredOutcome) -> Option<&Arc<Self>>;
}

macro_rules! replayable {
    ($($result:ty => $variant:ident),* $(,)?) => {$(
        impl Replayable for $result {
            fn stored(result: Arc<Self>) -> StoredOutcome {
                StoredOutcome::$variant(result)
            }
            fn replayed(stored: &StoredOutcome) -> Option<&Arc<Self>> {
                match stored {
                    StoredOutcome::$variant(result) => Some(result),
                    _ => None,
                }
            }
        }
    )*};
}

replayable!(
    ReserveResult => Reserve,
    CommitResult => Commit,
    ReleaseResult => Release,
    ExtendResult => Extend,
    DecideResult => Decide,
    EventResult => Event,
    FundResult => Fund,
    BulkResult => Bulk,
);

impl Tx<'_> {
    /// The one idempotency path. With a `key` that holds a live record: the same
    /// `fingerprint` replays its result, another one is `IDEMPOTENCY_MISMATCH`. Otherwise
    /// `fresh` runs and returns the result with how long its record must be kept; the
    /// record is staged with the operation's other effects (one durable step). Without a
    /// key (funding may omit it), `fresh` just runs.
    pub(crate) fn once<R: Replayable>(
        &mut self,
        key: Option<(IdemKey, [u8; 32])>,
        fresh: impl FnOnce(&mut Self) -> Result<(R, Millis), Rejection>,
    ) -> Result<Idempotent<R>, Rejection> {
        if let Some((key, fingerprint)) = &key {
            if let Some(stored) = self.stored(key, fingerprint)? {
                let result = R::replayed(&stored).ok_or(Rejection::IdempotencyMismatch)?;
                return Ok(Idempotent {
                    result: result.clone(),
                    replayed: true,
                });
            }
        }
        let (result, retention_ms) = fresh(self)?;
        let result = Arc::new(result);
        if let Some((key, fingerprint)) = key {
            let record = IdemRecord {
                fingerprint,
                outcome: R::stored(result.clone()),
                expires_at_ms: self.now.saturating_add(retention_ms),
            };
            self.put(crate::Effect::PutIdempotency(
                Arc::new(key),
                Arc::new(record),
            ));
        }
        Ok(Idempotent {
            result,
            replayed: false,
        })
    }

    /// The stored outcome under `key`, if a live record exists, in the state or archived
    /// with its reservation. The same key with a different payload is a mismatch.
    fn stored(
        &mut self,
        key: &IdemKey,
        fingerprint: &[u8; 32],
    ) -> Result<Option<StoredOutcome>, Rejection> {
        let now = self.now;
        let record = match self.state.idempotency.get(key) {
            Some(rec) => Some(&**rec),
            None => self.archived_record(key)?,
        };
        match record {
            Some(rec) if rec.expires_at_ms > now => {
                if &rec.fingerprint == fingerprint {
                    Ok(Some(rec.outcome.clone()))
                } else {
                    Err(Rejection::IdempotencyMismatch)
                }
            }
            _ => Ok(None),
        }
    }

    /// The record under `key` among an archived reservation's. A settlement's record is
    /// archived with its reservation, which the operation has looked up already if it was
    /// archived. A reserve's key is looked up only when its digest says an archived reserve
    /// may have used it: a fresh key (nearly every reserve) costs no read of the disk.
    fn archived_record(&mut self, key: &IdemKey) -> Result<Option<&IdemRecord>, Rejection> {
        if key.endpoint == Endpoint::Reserve && self.found().is_none() {
            let Some(lookup) = self
                .state
                .archived_reserve(&key.tenant_id, &key.key, self.now)
            else {
                return Ok(None);
            };
            self.archived(lookup)?;
        }
        Ok(self.found().and_then(|a| a.record(key)))
    }
}
