//! A probe of what the jobs need from a store (docs/operations.md, `doctor`): the store answers
//! a listing, one object round-trips (put, get with the bytes compared, head, delete), and
//! conditional writes are honoured — an `If-Match` with the current etag lands, while a
//! create-if-absent over an existing key and an `If-Match` with a stale etag are refused with
//! [`StoreError::Conflict`]. The probe writes one object, under the prefix it is given, and
//! deletes it whatever happened.

use bytes::Bytes;

use super::{ObjectStore, PutMode, StoreError};

/// What a conditional write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The write landed.
    Accepted,
    /// The store refused it with [`StoreError::Conflict`].
    Refused,
    /// Any other failure (its message).
    Failed(String),
}

/// The three conditional writes of the probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conditional {
    /// `If-Match` with the object's current etag (must be accepted).
    pub current_etag: Verdict,
    /// Create-if-absent over the existing object (must be refused).
    pub create_existing: Verdict,
    /// `If-Match` with an etag the object no longer has (must be refused).
    pub stale_etag: Verdict,
}

impl Conditional {
    /// True when the store honoured all three conditions.
    pub fn honoured(&self) -> bool {
        self.current_etag == Verdict::Accepted
            && self.create_existing == Verdict::Refused
            && self.stale_etag == Verdict::Refused
    }
}

/// When the probe object was written: the host's clock right before and right after the put,
/// and the store's last-modified time of the object (epoch milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteTimes {
    /// The host's clock before the put.
    pub before_ms: i64,
    /// The host's clock after the put.
    pub after_ms: i64,
    /// The store's `last_modified_ms` of the object.
    pub last_modified_ms: i64,
}

/// What the probe found. A step that was not reached (an earlier one failed) is `None`.
#[derive(Debug)]
pub struct ProbeReport {
    /// The probe object's key.
    pub key: String,
    /// Listing the probe prefix.
    pub reachable: Result<(), StoreError>,
    /// Put, get (the bytes compared), head, delete (the object then gone); the first failure.
    pub round_trip: Option<Result<(), String>>,
    /// The conditional writes.
    pub conditional: Option<Conditional>,
    /// When the object was written, by both clocks.
    pub written: Option<WriteTimes>,
    /// Deleting the probe object at the end (also after a failure).
    pub cleanup: Result<(), StoreError>,
}

/// Probes `store` with one object at `key` (which must lie under `prefix`, listed first);
/// `now_ms` is the host's clock. The object is deleted before this returns, whatever failed.
pub async fn probe(
    store: &dyn ObjectStore,
    prefix: &str,
    key: &str,
    now_ms: &(dyn Fn() -> i64 + Sync),
) -> ProbeReport {
    let mut report = ProbeReport {
        key: key.to_string(),
        reachable: store.list(prefix).await.map(|_| ()),
        round_trip: None,
        conditional: None,
        written: None,
        cleanup: Ok(()),
    };
    if report.reachable.is_err() {
        return report;
    }
    let round_trip = steps(store, key, now_ms, &mut report).await;
    report.round_trip = Some(round_trip);
    // Idempotent: also when the round trip already deleted it, or a put failed after landing.
    report.cleanup = store.delete(key).await;
    report
}

/// The probe's writes and reads, in order; the first failure ends them.
async fn steps(
    store: &dyn ObjectStore,
    key: &str,
    now_ms: &(dyn Fn() -> i64 + Sync),
    report: &mut ProbeReport,
) -> Result<(), String> {
    let body = |what: &str| Bytes::from(format!("lakecdc doctor probe: {what}\n"));
    let step = |what: &'static str| move |e: StoreError| format!("{what}: {e}");
    let before_ms = now_ms();
    let first = store
        .put_bytes(key, body("first"), PutMode::Overwrite)
        .await
        .map_err(step("put"))?;
    let after_ms = now_ms();
    let read = store.get_bytes(key).await.map_err(step("get"))?;
    if read.bytes != body("first") {
        return Err(format!(
            "get: read back {} bytes that differ from the {} written",
            read.bytes.len(),
            body("first").len()
        ));
    }
    let meta = store.head(key).await.map_err(step("head"))?;
    report.written = Some(WriteTimes {
        before_ms,
        after_ms,
        last_modified_ms: meta.last_modified_ms,
    });
    let verdict = |r: Result<_, StoreError>| match r {
        Ok(_) => Verdict::Accepted,
        Err(StoreError::Conflict) => Verdict::Refused,
        Err(e) => Verdict::Failed(e.to_string()),
    };
    // The first put's etag is stale once this lands (the body differs, and so does its etag).
    let current_etag = verdict(
        store
            .put_bytes(key, body("second"), PutMode::Update(first.etag.clone()))
            .await,
    );
    let create_existing = verdict(store.put_bytes(key, body("third"), PutMode::Create).await);
    let stale_etag = verdict(
        store
            .put_bytes(key, body("fourth"), PutMode::Update(first.etag))
            .await,
    );
    report.conditional = Some(Conditional {
        current_etag,
        create_existing,
        stale_etag,
    });
    store.delete(key).await.map_err(step("delete"))?;
    match store.head(key).await {
        Err(StoreError::NotFound) => Ok(()),
        Ok(_) => Err("delete: the object is still there after its delete".to_string()),
        Err(e) => Err(format!("head after delete: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::fault::{Action, FaultStore, Op};
    use crate::store::memory::MemoryStore;

    fn clock() -> i64 {
        1_700_000_000_000
    }

    #[tokio::test]
    async fn a_store_honouring_conditions_passes_and_nothing_is_left() {
        let store = MemoryStore::new();
        let r = probe(&store, "_doctor/", "_doctor/a", &clock).await;
        assert!(r.reachable.is_ok());
        assert_eq!(r.round_trip, Some(Ok(())));
        assert!(r.conditional.as_ref().is_some_and(Conditional::honoured));
        assert!(r.written.is_some());
        assert!(r.cleanup.is_ok());
        assert!(store.list("").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn an_ignored_create_is_seen_and_a_failed_get_still_cleans_up() {
        let store = FaultStore::new(Arc::new(MemoryStore::new()));
        store.arm(Op::PutBytes, Some("_doctor/"), 3, Action::IgnoreCondition);
        let r = probe(&store, "_doctor/", "_doctor/a", &clock).await;
        let c = r.conditional.unwrap();
        assert_eq!(c.create_existing, Verdict::Accepted);
        assert_eq!(c.stale_etag, Verdict::Refused);
        assert!(!c.honoured());
        assert!(store.list("").await.unwrap().is_empty());

        let store = FaultStore::new(Arc::new(MemoryStore::new()));
        store.arm(Op::GetBytes, None, 1, Action::Fail);
        let r = probe(&store, "_doctor/", "_doctor/a", &clock).await;
        assert!(matches!(r.round_trip, Some(Err(ref e)) if e.starts_with("get:")));
        assert!(r.conditional.is_none());
        assert!(store.list("").await.unwrap().is_empty());
    }
}
