//! An in-memory store for unit tests. It honours conditional writes exactly like the real
//! backends so that the shared conformance suite can hold it to the same contract.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use async_trait::async_trait;
use bytes::Bytes;

use super::{
    Download, GetResult, ObjectMeta, ObjectStore, PutMode, PutResult, StoreError, range_within,
    sha256,
};
use crate::clock::{Clock, SystemClock};

#[derive(Debug, Clone)]
struct Entry {
    bytes: Bytes,
    etag: String,
    last_modified_ms: i64,
}

/// A store held in a map; every etag is unique for the life of the store.
#[derive(Debug, Default)]
pub struct MemoryStore {
    objects: Mutex<(BTreeMap<String, Entry>, u64)>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut BTreeMap<String, Entry>, &mut u64) -> T) -> T {
        let mut guard = match self.objects.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let (map, counter) = &mut *guard;
        f(map, counter)
    }

    fn write(&self, key: &str, bytes: Bytes, mode: &PutMode) -> Result<PutResult, StoreError> {
        let digest = sha256(&bytes);
        let size = bytes.len() as u64;
        self.with(|map, counter| {
            match (mode, map.get(key)) {
                (PutMode::Create, Some(_)) => return Err(StoreError::Conflict),
                (PutMode::Update(_), None) => return Err(StoreError::Conflict),
                (PutMode::Update(etag), Some(cur)) if &cur.etag != etag => {
                    return Err(StoreError::Conflict);
                }
                _ => {}
            }
            *counter += 1;
            let etag = format!("m{counter}-{}", hex::encode(&digest[..8]));
            map.insert(
                key.to_string(),
                Entry {
                    bytes,
                    etag: etag.clone(),
                    last_modified_ms: SystemClock.now_ms(),
                },
            );
            Ok(PutResult {
                size,
                sha256: digest,
                etag,
            })
        })
    }

    fn entry(&self, key: &str) -> Result<Entry, StoreError> {
        self.with(|map, _| map.get(key).cloned().ok_or(StoreError::NotFound))
    }

    /// The entry at `key`, refused when it holds more than `limit` bytes.
    fn within(&self, key: &str, limit: u64) -> Result<Entry, StoreError> {
        let e = self.entry(key)?;
        let size = e.bytes.len() as u64;
        if size > limit {
            return Err(StoreError::TooLarge { size, limit });
        }
        Ok(e)
    }
}

fn meta(key: &str, e: &Entry) -> ObjectMeta {
    ObjectMeta {
        key: key.to_string(),
        size: e.bytes.len() as u64,
        etag: e.etag.clone(),
        last_modified_ms: e.last_modified_ms,
    }
}

#[async_trait]
impl ObjectStore for MemoryStore {
    fn describe(&self) -> String {
        "memory".to_string()
    }

    async fn put_file(&self, key: &str, path: &Path) -> Result<PutResult, StoreError> {
        let bytes = tokio::fs::read(path).await?;
        self.write(key, Bytes::from(bytes), &PutMode::Overwrite)
    }

    async fn put_bytes(
        &self,
        key: &str,
        body: Bytes,
        mode: PutMode,
    ) -> Result<PutResult, StoreError> {
        self.write(key, body, &mode)
    }

    async fn put_parts(
        &self,
        key: &str,
        parts: super::stream::Parts,
    ) -> Result<PutResult, StoreError> {
        let body = super::stream::collect(parts).await?;
        self.write(key, body, &PutMode::Overwrite)
    }

    async fn get_bytes_within(&self, key: &str, limit: u64) -> Result<GetResult, StoreError> {
        let e = self.within(key, limit)?;
        Ok(GetResult {
            bytes: e.bytes,
            etag: e.etag,
        })
    }

    async fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Bytes, StoreError> {
        if len == 0 {
            return Ok(Bytes::new());
        }
        let e = self.entry(key)?;
        let range = range_within(offset, len, e.bytes.len() as u64)?;
        Ok(e.bytes.slice(range))
    }

    async fn get_to_file_within(
        &self,
        key: &str,
        path: &Path,
        limit: u64,
    ) -> Result<Download, StoreError> {
        let e = self.within(key, limit)?;
        std::io::Write::write_all(&mut crate::scratch::create_writer(path)?, &e.bytes)?;
        Ok(Download {
            size: e.bytes.len() as u64,
            sha256: sha256(&e.bytes),
        })
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        let e = self.entry(key)?;
        Ok(meta(key, &e))
    }

    async fn copy(&self, from: &str, to: &str) -> Result<(), StoreError> {
        let e = self.entry(from)?;
        self.write(to, e.bytes, &PutMode::Overwrite).map(|_| ())
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.with(|map, _| map.remove(key));
        Ok(())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StoreError> {
        Ok(self.with(|map, _| {
            map.range(prefix.to_string()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .map(|(k, e)| meta(k, e))
                .collect()
        }))
    }
}
