//! A fault-injecting decorator over any [`ObjectStore`]: fails, fails-after-success, or pauses
//! the Nth call of a chosen operation (optionally only for keys containing a pattern), and
//! records every call. Integration tests use it against the real backends to reproduce each
//! failure point of a job; it never stands in for a real store.

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::Semaphore;

use super::{Download, GetResult, ObjectMeta, ObjectStore, PutMode, PutResult, StoreError};

/// A store operation, for matching faults and recording calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `put_file`
    PutFile,
    /// `put_bytes`
    PutBytes,
    /// `put_parts` (a streamed upload)
    PutParts,
    /// `get_bytes`
    GetBytes,
    /// `get_to_file`
    GetToFile,
    /// `get_range`
    GetRange,
    /// `head`
    Head,
    /// `copy` (the recorded key is the destination)
    Copy,
    /// `delete`
    Delete,
    /// `list` (the recorded key is the prefix)
    List,
    /// `abandoned_writes` (the recorded key is the prefix)
    ListUnfinished,
}

impl Op {
    /// True for operations that write to the store.
    pub fn is_write(self) -> bool {
        matches!(
            self,
            Op::PutFile | Op::PutBytes | Op::PutParts | Op::Copy | Op::Delete
        )
    }
}

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The operation.
    pub op: Op,
    /// The key (destination for copy, prefix for list).
    pub key: String,
}

/// What to do when a rule matches.
#[derive(Debug, Clone)]
pub enum Action {
    /// Fail without calling the inner store.
    Fail,
    /// Call the inner store, then report a failure anyway (an ambiguous write).
    FailAfter,
    /// Wait at the gate before calling the inner store.
    Pause(Arc<Gate>),
    /// For `put_bytes`: write with [`PutMode::Overwrite`] whatever mode was asked, as a store
    /// that ignores `If-None-Match`/`If-Match` does (other operations run unchanged).
    IgnoreCondition,
    /// For `put_bytes`: write, then answer with an etag the store will not match, as a store
    /// whose write answers and `If-Match` disagree (other operations run unchanged).
    ForeignEtag,
}

/// A rendezvous for a paused call: the test waits until the call arrives, then releases it.
#[derive(Debug)]
pub struct Gate {
    reached: Semaphore,
    released: Semaphore,
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            reached: Semaphore::new(0),
            released: Semaphore::new(0),
        })
    }

    /// Waits until a paused call has reached the gate.
    pub async fn wait_reached(&self) {
        if let Ok(permit) = self.reached.acquire().await {
            permit.forget();
        }
    }

    /// Lets every paused call (and every later one) through.
    pub fn release(&self) {
        self.released.close();
    }

    async fn pass(&self) {
        self.reached.add_permits(1);
        // Closing the semaphore is the release signal: acquire fails once closed.
        while self.released.acquire().await.is_ok() {}
    }
}

#[derive(Debug)]
struct Rule {
    op: Op,
    key_contains: Option<String>,
    nth: u32,
    seen: u32,
    action: Action,
}

/// The decorator.
#[derive(Debug)]
pub struct FaultStore {
    inner: Arc<dyn ObjectStore>,
    rules: Mutex<Vec<Rule>>,
    calls: Mutex<Vec<Call>>,
}

impl FaultStore {
    /// Wraps `inner` with no faults armed.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        Self {
            inner,
            rules: Mutex::new(Vec::new()),
            calls: Mutex::new(Vec::new()),
        }
    }

    /// The wrapped store, for a test's own writes that neither count as calls nor meet rules.
    pub fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.inner
    }

    /// Arms `action` for the `nth` (1-based) call of `op` whose key contains `key_contains`
    /// (any key when `None`). Each rule fires once.
    pub fn arm(&self, op: Op, key_contains: Option<&str>, nth: u32, action: Action) {
        lock(&self.rules).push(Rule {
            op,
            key_contains: key_contains.map(str::to_string),
            nth: nth.max(1),
            seen: 0,
            action,
        });
    }

    /// Every call made so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        lock(&self.calls).clone()
    }

    /// The calls that wrote to the store.
    pub fn writes(&self) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.op.is_write())
            .collect()
    }

    fn record(&self, op: Op, key: &str) -> Option<Action> {
        lock(&self.calls).push(Call {
            op,
            key: key.to_string(),
        });
        let mut rules = lock(&self.rules);
        let mut fired = None;
        for rule in rules.iter_mut() {
            let matches = rule.op == op
                && rule
                    .key_contains
                    .as_deref()
                    .is_none_or(|pat| key.contains(pat));
            if matches && rule.seen < rule.nth {
                rule.seen += 1;
                if rule.seen == rule.nth && fired.is_none() {
                    fired = Some(rule.action.clone());
                }
            }
        }
        fired
    }

    async fn run<T>(
        &self,
        op: Op,
        key: &str,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.apply(self.record(op, key), call).await
    }

    async fn apply<T>(
        &self,
        action: Option<Action>,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match action {
            None | Some(Action::IgnoreCondition | Action::ForeignEtag) => call.await,
            Some(Action::Fail) => Err(StoreError::Injected),
            Some(Action::FailAfter) => {
                call.await?;
                Err(StoreError::Injected)
            }
            Some(Action::Pause(gate)) => {
                gate.pass().await;
                call.await
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

#[async_trait]
impl ObjectStore for FaultStore {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn uri(&self, key: &str) -> String {
        self.inner.uri(key)
    }

    fn is_local(&self) -> bool {
        self.inner.is_local()
    }

    async fn open_local(&self, key: &str) -> Option<Result<std::fs::File, StoreError>> {
        self.inner.open_local(key).await
    }

    async fn put_file(&self, key: &str, path: &Path) -> Result<PutResult, StoreError> {
        self.run(Op::PutFile, key, self.inner.put_file(key, path))
            .await
    }

    async fn put_parts(
        &self,
        key: &str,
        parts: super::stream::Parts,
    ) -> Result<PutResult, StoreError> {
        self.run(Op::PutParts, key, self.inner.put_parts(key, parts))
            .await
    }

    async fn put_bytes(
        &self,
        key: &str,
        body: Bytes,
        mode: PutMode,
    ) -> Result<PutResult, StoreError> {
        let action = self.record(Op::PutBytes, key);
        let mode = match action {
            Some(Action::IgnoreCondition) => PutMode::Overwrite,
            _ => mode,
        };
        let foreign = matches!(action, Some(Action::ForeignEtag));
        let put = self.apply(action, self.inner.put_bytes(key, body, mode));
        put.await.map(|put| match foreign {
            true => PutResult {
                etag: format!("foreign-{}", put.etag),
                ..put
            },
            false => put,
        })
    }

    async fn get_bytes_within(&self, key: &str, limit: u64) -> Result<GetResult, StoreError> {
        self.run(Op::GetBytes, key, self.inner.get_bytes_within(key, limit))
            .await
    }

    async fn get_to_file_within(
        &self,
        key: &str,
        path: &Path,
        limit: u64,
    ) -> Result<Download, StoreError> {
        let call = self.inner.get_to_file_within(key, path, limit);
        self.run(Op::GetToFile, key, call).await
    }

    async fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Bytes, StoreError> {
        let call = self.inner.get_range(key, offset, len);
        self.run(Op::GetRange, key, call).await
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        self.run(Op::Head, key, self.inner.head(key)).await
    }

    async fn copy(&self, from: &str, to: &str) -> Result<(), StoreError> {
        self.run(Op::Copy, to, self.inner.copy(from, to)).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.run(Op::Delete, key, self.inner.delete(key)).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StoreError> {
        self.run(Op::List, prefix, self.inner.list(prefix)).await
    }

    async fn abandoned_writes(
        &self,
        prefix: &str,
    ) -> Result<Vec<super::AbandonedWrite>, StoreError> {
        self.run(
            Op::ListUnfinished,
            prefix,
            self.inner.abandoned_writes(prefix),
        )
        .await
    }

    async fn remove_abandoned(&self, write: &super::AbandonedWrite) -> Result<(), StoreError> {
        self.inner.remove_abandoned(write).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    #[tokio::test]
    async fn fails_only_the_nth_matching_call_and_records_all() {
        let store = FaultStore::new(Arc::new(MemoryStore::new()));
        store.arm(Op::PutBytes, Some("manifest"), 2, Action::Fail);
        let put =
            |k: &'static str| store.put_bytes(k, Bytes::from_static(b"x"), PutMode::Overwrite);
        assert!(put("manifest/1.json").await.is_ok());
        assert!(put("data/1/a.parquet").await.is_ok());
        assert!(matches!(
            put("manifest/1.json").await,
            Err(StoreError::Injected)
        ));
        assert!(put("manifest/1.json").await.is_ok());
        assert_eq!(store.writes().len(), 4);
        assert_eq!(store.calls()[1].key, "data/1/a.parquet");
    }

    #[tokio::test]
    async fn an_ignored_condition_overwrites_once() {
        let store = FaultStore::new(Arc::new(MemoryStore::new()));
        let put = |mode| store.put_bytes("k", Bytes::from_static(b"v"), mode);
        put(PutMode::Create).await.unwrap();
        store.arm(Op::PutBytes, Some("k"), 1, Action::IgnoreCondition);
        assert!(
            put(PutMode::Create).await.is_ok(),
            "the condition was ignored"
        );
        assert!(matches!(
            put(PutMode::Create).await,
            Err(StoreError::Conflict)
        ));
    }

    #[tokio::test]
    async fn fail_after_performs_the_write() {
        let store = FaultStore::new(Arc::new(MemoryStore::new()));
        store.arm(Op::PutBytes, None, 1, Action::FailAfter);
        let res = store
            .put_bytes("k", Bytes::from_static(b"v"), PutMode::Create)
            .await;
        assert!(matches!(res, Err(StoreError::Injected)));
        assert_eq!(&store.get_bytes("k").await.unwrap().bytes[..], b"v");
    }

    #[tokio::test]
    async fn an_injected_get_range_failure_fails_once() {
        let store = FaultStore::new(Arc::new(MemoryStore::new()));
        let body = Bytes::from_static(b"0123456789");
        store
            .put_bytes("data/1/a.parquet", body, PutMode::Overwrite)
            .await
            .unwrap();
        store.arm(Op::GetRange, Some("data/"), 1, Action::Fail);
        // Another operation on the key does not trip the rule.
        assert_eq!(
            &store.get_bytes("data/1/a.parquet").await.unwrap().bytes[..],
            b"0123456789"
        );
        assert!(matches!(
            store.get_range("data/1/a.parquet", 2, 3).await,
            Err(StoreError::Injected)
        ));
        assert_eq!(
            &store.get_range("data/1/a.parquet", 2, 3).await.unwrap()[..],
            b"234"
        );
        let ops: Vec<Op> = store.calls().into_iter().map(|c| c.op).collect();
        assert_eq!(
            ops,
            [Op::PutBytes, Op::GetBytes, Op::GetRange, Op::GetRange]
        );
        assert!(!Op::GetRange.is_write());
    }

    #[tokio::test]
    async fn pause_holds_the_call_until_released() {
        let store = Arc::new(FaultStore::new(Arc::new(MemoryStore::new())));
        let gate = Gate::new();
        store.arm(Op::Delete, None, 1, Action::Pause(gate.clone()));
        let s = store.clone();
        let task = tokio::spawn(async move { s.delete("k").await });
        gate.wait_reached().await;
        assert!(!task.is_finished());
        gate.release();
        assert!(task.await.unwrap().is_ok());
    }
}
