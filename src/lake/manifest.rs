//! The per-schema manifest (forma's JSON format, docs/design.md §3.2) and its only write path:
//! [`commit`] = load → modify → conditional PUT (`If-Match` on the loaded etag, `If-None-Match: *`
//! when absent), retried only on a confirmed conflict. "No manifest" is only the store's typed
//! not-found (docs/hazards.md #464); every load checks the schema stamp (#520/#522/#536), reads
//! at most [`ReadLimits::manifest_bytes`] (S2), and refuses a path listed twice and a negative
//! size or row count (S3, S4). Unknown fields, top-level and per entry, survive a rewrite.
//! Every save is followed by a copy of the saved bytes under `<manifest key>.history/`
//! ([`super::history`], docs/design.md §3.5) while history is on.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use super::keys::{ForeignPath, Layout, history_key_of};
use super::{Capped, ReadLimits, read_capped};
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::retry::Backoff;
use crate::store::{ObjectStore, PutMode, StoreError};

/// The largest `size_bytes` or `row_count` a manifest may hold: 2^53-1, the largest integer
/// every JSON reader represents exactly. No file holds more rows or bytes; a larger number is
/// corruption or an attack on the sums (docs/hazards.md S4), refused at load.
pub const MAX_COUNT: i64 = (1 << 53) - 1;

/// Which tier a file belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// Written by init or compact.
    Base,
    /// Written by flush.
    Delta,
}

impl Tier {
    /// The JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Base => "base",
            Tier::Delta => "delta",
        }
    }
}

impl Serialize for Tier {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Tier {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s.eq_ignore_ascii_case("base") {
            Ok(Tier::Base)
        } else if s.eq_ignore_ascii_case("delta") {
            Ok(Tier::Delta)
        } else {
            Err(serde::de::Error::custom(format!(
                "unknown tier {s:?} (expected base or delta)"
            )))
        }
    }
}

/// One listed Parquet object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Base or delta.
    pub tier: Tier,
    /// The object key, used verbatim.
    pub path: String,
    /// Smallest `row_id` in the file (UUID byte order), or empty.
    #[serde(default)]
    pub row_id_min: String,
    /// Largest `row_id` in the file, or empty.
    #[serde(default)]
    pub row_id_max: String,
    /// Writer-defined lower time bound (epoch ms).
    #[serde(default)]
    pub created_min: i64,
    /// Writer-defined upper time bound (epoch ms).
    #[serde(default)]
    pub created_max: i64,
    /// Object size in bytes.
    #[serde(default)]
    pub size_bytes: i64,
    /// Rows in the file.
    #[serde(default)]
    pub row_count: i64,
    /// `sha256:<hex>` of the object's bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
    /// Column name → DuckDB type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub columns: Option<BTreeMap<String, String>>,
    /// Fields this version does not know, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The manifest document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// The schema this manifest belongs to (the stamp).
    #[serde(default)]
    pub schema_id: i16,
    /// The schema's name when the save was made (every writer records it; absent in manifests
    /// written before names were recorded): what readers name the schema's view.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_name: Option<String>,
    /// +1 per save.
    #[serde(default)]
    pub version: i64,
    /// Strictly increasing save time (epoch ms).
    #[serde(default)]
    pub updated_at_ms: i64,
    /// Every listed object.
    #[serde(default)]
    pub files: Vec<FileEntry>,
    /// Objects no longer listed that a reader of an earlier version may still read: compact's
    /// merged inputs and init's replaced files. gc deletes them past its grace and then drops
    /// them here. Absent (not empty) in a manifest no lakecdc job has retired anything in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired: Option<Vec<Retired>>,
    /// The database the lake is written from, recorded by its first writer and checked by
    /// every writer after it ([`super::identity`]). Absent in manifests written before
    /// identities were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<super::identity::SourceIdentity>,
    /// Fields this version does not know, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Which of a manifest's own members a JSON document holds (present with any value).
#[derive(Debug, Deserialize)]
struct Members {
    #[serde(default, deserialize_with = "present")]
    files: bool,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<bool, D::Error> {
    serde::de::IgnoredAny::deserialize(d).map(|_| true)
}

/// One entry of a manifest's `retired` list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Retired {
    /// The object key.
    pub path: String,
    /// When the save that unlisted it was made (epoch ms; 0 when unknown).
    #[serde(default)]
    pub retired_at_ms: i64,
    /// Fields this version does not know, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Manifest {
    /// An empty manifest stamped for `schema_id`.
    pub fn empty(schema_id: i16) -> Self {
        Self {
            schema_id,
            schema_name: None,
            version: 0,
            updated_at_ms: 0,
            files: Vec::new(),
            retired: None,
            source: None,
            extra: Map::new(),
        }
    }

    /// Records `paths` as retired at `now` (each path once; a path already listed keeps its
    /// first time, so gc's grace is never restarted).
    pub fn retire<'a>(&mut self, paths: impl IntoIterator<Item = &'a String>, now: i64) {
        let list = self.retired.get_or_insert_with(Vec::new);
        for path in paths {
            if !list.iter().any(|r| &r.path == path) {
                list.push(Retired {
                    path: path.clone(),
                    retired_at_ms: now,
                    extra: Map::new(),
                });
            }
        }
    }

    /// Drops `paths` from the retired list (gc, once their objects are gone).
    pub fn forget_retired(&mut self, paths: &BTreeSet<String>) {
        if let Some(list) = &mut self.retired {
            list.retain(|r| !paths.contains(&r.path));
        }
    }

    /// When each retired path was retired (epoch ms; 0 when unknown).
    pub fn retired_since(&self) -> BTreeMap<String, i64> {
        self.retired
            .iter()
            .flatten()
            .map(|r| (r.path.clone(), r.retired_at_ms))
            .collect()
    }

    /// The retired paths.
    pub fn retired_paths(&self) -> BTreeSet<String> {
        self.retired
            .iter()
            .flatten()
            .map(|r| r.path.clone())
            .collect()
    }

    /// Entries of one tier.
    pub fn tier(&self, tier: Tier) -> impl Iterator<Item = &FileEntry> {
        self.files.iter().filter(move |f| f.tier == tier)
    }

    /// The first listed or retired path that is not a data file of this manifest's schema
    /// under `layout` ([`Layout::check_listed`]).
    pub fn foreign_path(&self, layout: &Layout) -> Option<ForeignPath> {
        let retired = self.retired.iter().flatten().map(|r| &r.path);
        self.files
            .iter()
            .map(|f| &f.path)
            .chain(retired)
            .find_map(|p| layout.check_listed(self.schema_id, p).err())
    }

    /// The sum of the listed row counts, saturating (each is checked to be non-negative at
    /// load; their sum may still overflow, docs/hazards.md S4).
    pub fn total_rows<'a>(entries: impl IntoIterator<Item = &'a FileEntry>) -> i64 {
        entries
            .into_iter()
            .fold(0i64, |sum, f| sum.saturating_add(f.row_count))
    }

    /// The sum of the listed sizes, saturating (as [`Manifest::total_rows`]).
    pub fn total_bytes<'a>(entries: impl IntoIterator<Item = &'a FileEntry>) -> i64 {
        entries
            .into_iter()
            .fold(0i64, |sum, f| sum.saturating_add(f.size_bytes))
    }

    /// Refuses what no job can use safely: a path listed twice (it would be downloaded, merged
    /// and counted twice), a size or row count that is negative or above [`MAX_COUNT`]
    /// (sums of them would be nonsense), and a checksum that is not `sha256:` and 64 lowercase
    /// hex digits (no object can match it, and readers name cached files by it: docs/hazards.md
    /// S15). Each error names the manifest key and the entry's path.
    pub(crate) fn check_entries(&self, key: &str) -> Result<()> {
        let refuse = |message: String| Error::Manifest {
            key: key.to_string(),
            message,
        };
        let mut seen = BTreeSet::new();
        for f in &self.files {
            if !seen.insert(f.path.as_str()) {
                return Err(refuse(format!(
                    "lists {:?} more than once; remove the duplicate entry",
                    f.path
                )));
            }
            if let Some(c) = f.checksum.as_deref().filter(|c| sha256_hex(c).is_none()) {
                let shown: String = c.chars().take(80).collect();
                return Err(refuse(format!(
                    "entry {:?} has a malformed checksum {shown:?} (want sha256: and 64 lowercase hex digits); the manifest is corrupt",
                    f.path
                )));
            }
            for (field, n) in [("size_bytes", f.size_bytes), ("row_count", f.row_count)] {
                if n < 0 {
                    return Err(refuse(format!(
                        "entry {:?} has a negative {field} ({n}); the manifest is corrupt",
                        f.path
                    )));
                }
                if n > MAX_COUNT {
                    return Err(refuse(format!(
                        "entry {:?} has an impossible {field} ({n}, above 2^53-1); the manifest is corrupt",
                        f.path
                    )));
                }
            }
        }
        Ok(())
    }

    /// Parses a manifest's bytes (no stamp check).
    pub fn from_json(key: &str, bytes: &[u8]) -> Result<Self> {
        let manifest: Self = serde_json::from_slice(bytes).map_err(|e| Error::Manifest {
            key: key.to_string(),
            message: format!(
                "not a valid manifest ({e}); restore it from a backup or remove it and re-run init"
            ),
        })?;
        // Every field defaults, so any JSON object would parse: one without a `files` list
        // (every writer, forma's too, writes one) is another tool's document at this key, and
        // a writer would otherwise claim and overwrite it. A document listing files has the
        // list: only an empty one is read again, for the member alone.
        let has_files = !manifest.files.is_empty()
            || serde_json::from_slice::<Members>(bytes).is_ok_and(|m| m.files);
        if !has_files {
            return Err(Error::Manifest {
                key: key.to_string(),
                message: "is not a lakecdc manifest: it has no `files` list (another tool's document at this key?); check --lake and --manifest-template, or move the object away".into(),
            });
        }
        Ok(manifest)
    }

    /// The canonical serialisation: pretty JSON with a 2-space indent.
    pub fn to_json(&self) -> Result<Vec<u8>> {
        serde_json::to_vec_pretty(self).map_err(Error::json("manifest"))
    }

    /// Checks the schema stamp for a load on behalf of `schema_id`, stamping an unstamped
    /// empty manifest.
    pub(crate) fn check_stamp(&mut self, key: &str, schema_id: i16) -> Result<()> {
        match self.schema_id {
            id if id == schema_id => Ok(()),
            0 if self.files.is_empty() => {
                self.schema_id = schema_id;
                Ok(())
            }
            0 => Err(Error::Manifest {
                key: key.to_string(),
                message: format!(
                    "has no schema_id stamp but lists {} files; refusing to guess its schema (expected {schema_id})",
                    self.files.len()
                ),
            }),
            other => Err(Error::Manifest {
                key: key.to_string(),
                message: format!(
                    "belongs to schema {other}, not {schema_id}: does --manifest-template give every schema its own key?"
                ),
            }),
        }
    }
}

/// A manifest with the etag of the version read.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The document.
    pub manifest: Manifest,
    /// Its etag, for `If-Match`.
    pub etag: String,
}

/// [`load_within`] the default [`ReadLimits`].
pub async fn load(store: &dyn ObjectStore, key: &str, schema_id: i16) -> Result<Option<Loaded>> {
    load_within(store, key, schema_id, &ReadLimits::default()).await
}

/// Loads the manifest of `schema_id`. `Ok(None)` only when the store says the object does not
/// exist; any other failure is an error. A manifest larger than `limits.manifest_bytes` is
/// refused before it is read; one that lists a path twice or a negative size or row count is
/// refused naming the entry.
pub async fn load_within(
    store: &dyn ObjectStore,
    key: &str,
    schema_id: i16,
    limits: &ReadLimits,
) -> Result<Option<Loaded>> {
    if schema_id <= 0 {
        return Err(Error::Invariant(format!(
            "schema id {schema_id} is not positive"
        )));
    }
    let cap = Capped {
        op: "load manifest",
        what: "manifest",
        limit: limits.manifest_bytes,
        why: "a manifest this large is corrupt or hostile; if it is genuine, raise --max-manifest-size",
    };
    let Some(got) = read_capped(store, key, cap).await? else {
        return Ok(None);
    };
    let mut manifest = Manifest::from_json(key, &got.bytes)?;
    manifest.check_stamp(key, schema_id)?;
    manifest.check_entries(key)?;
    Ok(Some(Loaded {
        manifest,
        etag: got.etag,
    }))
}

/// Bounds for [`commit`].
#[derive(Debug, Clone, Copy)]
pub struct CommitPolicy {
    /// Conditional writes tried before giving up on conflicts.
    pub max_attempts: u32,
    /// First backoff after a conflict; doubled per attempt, jittered ×[0.5, 1.5).
    pub base_backoff: Duration,
    /// Cap on one backoff.
    pub max_backoff: Duration,
}

impl CommitPolicy {
    /// The backoff between attempts.
    pub fn backoff(&self) -> Backoff {
        Backoff {
            base: self.base_backoff,
            max: self.max_backoff,
        }
    }
}

impl Default for CommitPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            base_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
        }
    }
}

/// A committed manifest.
#[derive(Debug, Clone)]
pub struct Committed {
    /// The document as written.
    pub manifest: Manifest,
    /// Its new etag.
    pub etag: String,
    /// Conditional writes it took (1 = no conflict).
    pub attempts: u32,
    /// Whether a later save may start from this one ([`Committed::into_known`]): false when
    /// the save started from a known manifest that the store refused although nothing had
    /// been saved since, so the store does not take its own etags back in `If-Match`.
    pub resumable: bool,
    /// The history copy of the saved version, when the save left it to its caller
    /// ([`SaveFrom::leave_copy`]); `None` when it was written or history is off.
    pub copy: Option<HistoryCopy>,
}

/// How a save of a run that saves once per batch (a flush) starts and ends ([`commit_from`]).
#[derive(Debug, Default)]
pub struct SaveFrom {
    /// The run's last save of this manifest ([`Committed::into_known`]): the save starts from
    /// it instead of a load.
    pub known: Option<Loaded>,
    /// The history copy is not written by the save but handed back ([`Committed::copy`]), for
    /// the caller to write while it goes on: one request fewer before the next step.
    pub leave_copy: bool,
}

/// The history copy of a saved version, not yet written ([`SaveFrom::leave_copy`]).
#[derive(Debug, Clone)]
#[must_use = "a history copy left to the caller is lost unless written"]
pub struct HistoryCopy {
    manifest_key: String,
    version: i64,
    body: Bytes,
}

impl HistoryCopy {
    /// Writes the copy. A failure is logged and counted ([`history_copy_failures`]), never
    /// returned: the save stands, only time travel to this version is lost.
    pub async fn write(self, store: &dyn ObjectStore) {
        save_copy(store, &self.manifest_key, self.version, self.body).await;
    }
}

impl Committed {
    /// The saved manifest and its etag, for the next save of the same run to start from
    /// ([`commit_from`]); `None` when the store does not take its etags back.
    pub fn into_known(self) -> Option<Loaded> {
        self.resumable.then_some(Loaded {
            manifest: self.manifest,
            etag: self.etag,
        })
    }
}

/// [`commit_within`] the manifest at `key`, read within the default [`ReadLimits`] and
/// followed by its history copy (history is on by default).
pub async fn commit<F>(
    store: &dyn ObjectStore,
    key: &str,
    schema_id: i16,
    clock: &dyn Clock,
    policy: CommitPolicy,
    modify: F,
) -> Result<Committed>
where
    F: FnMut(&mut Manifest) -> Result<()>,
{
    let rules = SaveRules {
        limits: &ReadLimits::default(),
        history: true,
        clock,
        policy,
    };
    let from = SaveFrom::default();
    save(store, key, schema_id, &rules, from, modify).await
}

/// Loads the manifest of `schema_id` under `layout` (within its limits, [`load_within`]),
/// applies `modify`, and writes the manifest conditionally, re-running the whole cycle from a
/// fresh load on a confirmed conflict. `modify` must be a pure function of the manifest it is
/// given (it may run several times). A manifest that a load would refuse (a path listed twice,
/// a negative number, over the size limit) is not written.
/// Any non-conflict write failure is [`Error::AmbiguousCommit`]: the write may have landed.
/// After the save, while the layout keeps history ([`Layout::history_retention`] above zero),
/// the same bytes are copied to the version's history key ([`super::history`]); a failed
/// copy is logged and counted, never an error of the save.
/// Every job saves through it or [`commit_from`] (flush, init, compact, gc).
pub async fn commit_within<F>(
    store: &dyn ObjectStore,
    layout: &Layout,
    schema_id: i16,
    clock: &dyn Clock,
    policy: CommitPolicy,
    modify: F,
) -> Result<Committed>
where
    F: FnMut(&mut Manifest) -> Result<()>,
{
    let from = SaveFrom::default();
    commit_from(store, layout, schema_id, clock, policy, from, modify).await
}

/// [`commit_within`], its first write starting from `from.known` when given instead of a
/// load: the manifest as this run's last save left it ([`Committed::into_known`]), so that a
/// job saving once per batch reads the manifest only when someone else wrote it. The write is
/// conditional on the known etag: if the manifest changed since, the store refuses it and the
/// save goes on from a fresh load at once (no backoff; the refused write does not count
/// against `policy`'s attempts). Nothing is saved from a stale manifest (docs/design.md
/// §3.2.3). With `from.leave_copy`, the history copy is the caller's to write.
pub async fn commit_from<F>(
    store: &dyn ObjectStore,
    layout: &Layout,
    schema_id: i16,
    clock: &dyn Clock,
    policy: CommitPolicy,
    from: SaveFrom,
    modify: F,
) -> Result<Committed>
where
    F: FnMut(&mut Manifest) -> Result<()>,
{
    let key = layout.manifest_key(schema_id);
    let rules = SaveRules {
        limits: layout.limits(),
        history: !layout.history_retention().is_zero(),
        clock,
        policy,
    };
    save(store, &key, schema_id, &rules, from, modify).await
}

/// How a save reads, retries and stamps, and what it writes besides the manifest.
struct SaveRules<'a> {
    /// The limits of the load before the save (and of the saved size).
    limits: &'a ReadLimits,
    /// Whether the saved bytes are copied to the version's history key.
    history: bool,
    /// Stamps the saved version's `updated_at_ms`.
    clock: &'a dyn Clock,
    /// The attempts and backoff after confirmed conflicts.
    policy: CommitPolicy,
}

async fn save<F>(
    store: &dyn ObjectStore,
    key: &str,
    schema_id: i16,
    rules: &SaveRules<'_>,
    from: SaveFrom,
    mut modify: F,
) -> Result<Committed>
where
    F: FnMut(&mut Manifest) -> Result<()>,
{
    let SaveFrom { known, leave_copy } = from;
    // A write can be conditional only on an etag: a known document without one is loaded.
    let mut known = known.filter(|k| !k.etag.is_empty());
    let SaveRules {
        limits,
        clock,
        policy,
        ..
    } = *rules;
    let max_attempts = policy.max_attempts.max(1);
    // Conditional writes made, and those of them that followed a load.
    let (mut writes, mut attempt) = (0, 0);
    // The version of a known manifest the store refused: if a load then finds that very
    // version, nothing was saved in between and the store does not take its own etag back.
    let mut refused: Option<i64> = None;
    let mut resumable = true;
    loop {
        let started_known = known.is_some();
        let (manifest, mode) = match known.take() {
            Some(k) => (k.manifest, PutMode::Update(k.etag)),
            None => {
                attempt += 1;
                let loaded = load_within(store, key, schema_id, limits).await?;
                if let (Some(l), Some(v)) = (&loaded, refused.take())
                    && l.manifest.version == v
                {
                    resumable = false;
                    tracing::debug!(
                        key,
                        "the store refused an etag it returned; this run's later saves read the manifest first"
                    );
                }
                match loaded {
                    Some(l) => (l.manifest, PutMode::Update(l.etag)),
                    None => (Manifest::empty(schema_id), PutMode::Create),
                }
            }
        };
        let known_version = manifest.version;
        let (manifest, body) = match prepare(key, clock, limits, &mut modify, manifest) {
            Ok(prepared) => prepared,
            // A document the run knew may be stale (a compaction since made it smaller, say):
            // whether the change can be saved is decided on a fresh load.
            Err(_) if started_known => continue,
            Err(e) => return Err(e),
        };
        // A clone of `Bytes` shares the buffer: the copy is of exactly the bytes saved.
        let saved = body.clone();
        writes += 1;
        match store.put_bytes(key, body, mode).await {
            Ok(put) => {
                let copy = rules.history.then(|| HistoryCopy {
                    manifest_key: key.to_string(),
                    version: manifest.version,
                    body: saved,
                });
                let copy = match (copy, leave_copy) {
                    (Some(copy), false) => {
                        copy.write(store).await;
                        None
                    }
                    (copy, _) => copy,
                };
                return Ok(Committed {
                    manifest,
                    etag: put.etag,
                    attempts: writes,
                    resumable,
                    copy,
                });
            }
            Err(StoreError::Conflict) if started_known => {
                tracing::debug!(
                    key,
                    "the manifest changed since this run last read or saved it; reading it"
                );
                refused = Some(known_version);
            }
            Err(StoreError::Conflict) if attempt < max_attempts => {
                tracing::debug!(key, attempt, "manifest conflict, retrying");
                policy.backoff().wait(attempt).await;
            }
            Err(StoreError::Conflict) => break,
            Err(source) => {
                return Err(Error::AmbiguousCommit {
                    key: key.to_string(),
                    source,
                });
            }
        }
    }
    Err(Error::ManifestConflict {
        key: key.to_string(),
        attempts: writes,
    })
}

/// `manifest` changed by `modify` as the next version, and its JSON: refused if a load would
/// refuse it (an entry that does not check, a size over `limits`).
fn prepare<F>(
    key: &str,
    clock: &dyn Clock,
    limits: &ReadLimits,
    modify: &mut F,
    mut manifest: Manifest,
) -> Result<(Manifest, Bytes)>
where
    F: FnMut(&mut Manifest) -> Result<()>,
{
    modify(&mut manifest)?;
    manifest.check_entries(key)?;
    // Numbers read from the lake: saturating, never overflowing (docs/hazards.md S4).
    manifest.version = manifest.version.saturating_add(1);
    manifest.updated_at_ms = clock.now_ms().max(manifest.updated_at_ms.saturating_add(1));
    let body = Bytes::from(manifest.to_json()?);
    let size = u64::try_from(body.len()).unwrap_or(u64::MAX);
    if size > limits.manifest_bytes {
        // Written, it would be refused by every later load.
        return Err(Error::TooLarge {
            what: "manifest",
            key: key.to_string(),
            size,
            limit: limits.manifest_bytes,
            why: "the save would make it larger than jobs read, and nothing was written: raise --max-manifest-size for every job, or let compaction list fewer, larger files (--target-base-size)".into(),
            saving: true,
        });
    }
    Ok((manifest, body))
}

/// History copies that could not be written since the process started.
static COPY_FAILURES: AtomicU64 = AtomicU64::new(0);

/// How many history copies this process failed to write (each was logged as a warning; the
/// saves themselves stood).
pub fn history_copy_failures() -> u64 {
    COPY_FAILURES.load(Ordering::Relaxed)
}

/// Copies the bytes just saved as `version` of the manifest at `manifest_key` to its history
/// key. Called only after the conditional save succeeded. A failure is logged and counted,
/// never returned: the save stands, only time travel to this version is lost.
async fn save_copy(store: &dyn ObjectStore, manifest_key: &str, version: i64, body: Bytes) {
    if version < 1 {
        // A version read from the lake may be anything; a key of 20 digits needs >= 0, and
        // versions start at 1.
        COPY_FAILURES.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            key = manifest_key,
            version,
            "manifest saved with a version below 1: no history copy written"
        );
        return;
    }
    let key = history_key_of(manifest_key, version);
    // Overwrite: only the one save that won version `version` writes this key (a copy left
    // by an earlier, identical attempt is replaced by the same bytes).
    match store.put_bytes(&key, body, PutMode::Overwrite).await {
        Ok(_) => tracing::debug!(key, "manifest history copy written"),
        Err(e) => {
            COPY_FAILURES.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                key,
                error = %e,
                "manifest history copy not written; the save stands, but --as-of cannot read this version"
            );
        }
    }
}

/// The 64 lowercase hex digits of a well-formed `sha256:<hex>` checksum, the only form lakecdc
/// writes and compares.
pub fn sha256_hex(checksum: &str) -> Option<&str> {
    checksum
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::clock::ManualClock;
    use crate::store::fault::{Action, FaultStore, Gate, Op};
    use crate::store::memory::MemoryStore;

    const FORMA: &str = include_str!("../../tests/fixtures/manifest/forma.json");
    const FORMA_REWRITTEN: &str =
        include_str!("../../tests/fixtures/manifest/forma.rewritten.json");

    #[test]
    fn retire_records_each_path_once_and_keeps_its_first_time() {
        let mut m = Manifest::empty(7);
        let paths: BTreeSet<String> = ["a".to_string(), "b".to_string()].into();
        m.retire(&paths, 5);
        m.retire(&paths, 6);
        assert_eq!(m.retired_paths(), paths);
        assert_eq!(m.retired_since(), [("a".into(), 5), ("b".into(), 5)].into());
        m.forget_retired(&["a".to_string()].into());
        assert_eq!(m.retired_paths(), ["b".to_string()].into());
        // An emptied list stays in the document; one never written stays absent.
        m.forget_retired(&paths);
        let json: Value = serde_json::from_slice(&m.to_json().unwrap()).unwrap();
        assert_eq!(json["retired"], serde_json::json!([]));
        let fresh: Value = serde_json::from_slice(&Manifest::empty(7).to_json().unwrap()).unwrap();
        assert!(fresh.get("retired").is_none());
    }

    fn entry(path: &str, tier: Tier) -> FileEntry {
        FileEntry {
            tier,
            path: path.to_string(),
            row_id_min: String::new(),
            row_id_max: String::new(),
            created_min: 0,
            created_max: 0,
            size_bytes: 1,
            row_count: 1,
            checksum: Some(format!("sha256:{}", "0".repeat(64))),
            columns: None,
            extra: Map::new(),
        }
    }

    #[test]
    fn golden_forma_manifest_round_trips_with_unknown_fields() {
        let m = Manifest::from_json("k", FORMA.as_bytes()).unwrap();
        assert_eq!(m.schema_id, 7);
        assert_eq!(m.files.len(), 3);
        assert_eq!(m.files[1].tier, Tier::Delta, "tier is case-insensitive");
        assert_eq!(m.files[2].checksum, None, "unstamped entry");
        assert_eq!(m.extra.get("writer"), Some(&Value::from("forma-cdc")));
        assert_eq!(m.files[0].extra.get("level"), Some(&Value::from(0)));
        let out = String::from_utf8(m.to_json().unwrap()).unwrap();
        assert_eq!(out, FORMA_REWRITTEN.trim_end());
    }

    #[tokio::test]
    async fn stamp_checks() {
        let store = MemoryStore::new();
        let put = |body: &'static str| {
            store.put_bytes("m", Bytes::from_static(body.as_bytes()), PutMode::Overwrite)
        };
        put(r#"{"schema_id": 8, "files": []}"#).await.unwrap();
        let e = load(&store, "m", 7).await.unwrap_err().to_string();
        assert!(e.contains("belongs to schema 8"), "{e}");
        put(r#"{"schema_id": 0, "files": [{"tier":"base","path":"p"}]}"#)
            .await
            .unwrap();
        let e = load(&store, "m", 7).await.unwrap_err().to_string();
        assert!(e.contains("no schema_id stamp"), "{e}");
        put(r#"{"files": []}"#).await.unwrap();
        assert_eq!(
            load(&store, "m", 7)
                .await
                .unwrap()
                .unwrap()
                .manifest
                .schema_id,
            7
        );
        assert!(load(&store, "m", 0).await.is_err());
        put("{not json").await.unwrap();
        let e = load(&store, "m", 7).await.unwrap_err().to_string();
        assert!(e.contains("not a valid manifest"), "{e}");
        assert!(load(&store, "absent", 7).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn only_typed_not_found_means_absent() {
        let faulty = FaultStore::new(Arc::new(MemoryStore::new()));
        faulty.arm(Op::GetBytes, None, 1, Action::Fail);
        assert!(load(&faulty, "manifest/7.json", 7).await.is_err());
    }

    #[tokio::test]
    async fn commit_creates_with_if_none_match_then_updates() {
        let store = MemoryStore::new();
        let clock = ManualClock::new(1_000);
        let c1 = commit(&store, "m", 7, &clock, CommitPolicy::default(), |m| {
            m.files.push(entry("a", Tier::Base));
            Ok(())
        })
        .await
        .unwrap();
        assert_eq!((c1.manifest.version, c1.manifest.updated_at_ms), (1, 1_000));
        // The clock did not move: updated_at_ms still increases.
        let c2 = commit(&store, "m", 7, &clock, CommitPolicy::default(), |m| {
            m.files.push(entry("b", Tier::Delta));
            Ok(())
        })
        .await
        .unwrap();
        assert_eq!((c2.manifest.version, c2.manifest.updated_at_ms), (2, 1_001));
        let back = load(&store, "m", 7).await.unwrap().unwrap();
        assert_eq!(back.manifest, c2.manifest);
        assert_eq!(back.etag, c2.etag);
    }

    /// The calls `store` recorded on the manifest `m7` itself (not its history copies).
    fn manifest_calls(store: &FaultStore) -> Vec<Op> {
        store
            .calls()
            .into_iter()
            .filter(|c| c.key == "m7")
            .map(|c| c.op)
            .collect()
    }

    fn from(known: Option<Loaded>) -> SaveFrom {
        SaveFrom {
            known,
            leave_copy: false,
        }
    }

    /// Adds the delta `path` to schema 7's manifest `m7` ([`within`]) as `from` says.
    async fn save7(store: &FaultStore, from: SaveFrom, path: &'static str) -> Committed {
        save7_within(store, 1 << 20, from, path).await.unwrap()
    }

    async fn save7_within(
        store: &FaultStore,
        manifest_bytes: u64,
        from: SaveFrom,
        path: &'static str,
    ) -> Result<Committed> {
        let (layout, clock) = (within(manifest_bytes), ManualClock::new(1_000));
        let add = move |m: &mut Manifest| {
            m.files.push(entry(path, Tier::Delta));
            Ok(())
        };
        commit_from(store, &layout, 7, &clock, Default::default(), from, add).await
    }

    #[tokio::test]
    async fn a_known_manifest_too_large_to_save_to_is_read_again_before_the_save_is_refused() {
        let store = FaultStore::new(Arc::new(MemoryStore::new()));
        save7(&store, from(None), "a1").await;
        let ours = save7(&store, from(None), "a2").await;
        let two = store.get_bytes("m7").await.unwrap().bytes.len() as u64;
        // A compaction empties the delta tier meanwhile.
        let (layout, clock) = (within(1 << 20), ManualClock::new(1_000));
        let clear = |m: &mut Manifest| {
            m.files.clear();
            Ok(())
        };
        commit_within(&store, &layout, 7, &clock, Default::default(), clear)
            .await
            .unwrap();
        // Three entries would not fit, one does: the known (stale) document is not the one
        // that decides.
        let c = save7_within(&store, two + 20, from(ours.into_known()), "b").await;
        assert_eq!(c.unwrap().manifest.files.len(), 1);
        assert_eq!(paths7(&store).await, ["b"]);
        // Without a stale document to blame, the limit is the error.
        let big = save7_within(&store, 10, from(None), "c").await.unwrap_err();
        assert!(
            matches!(big, Error::TooLarge { saving: false, .. }),
            "{big}"
        );
        // A manifest read within the limit that the save would take past it: the save is
        // refused, and its message says what was not done and how to fix it.
        let one = store.get_bytes("m7").await.unwrap().bytes.len() as u64;
        let big = save7_within(&store, one, from(None), "c")
            .await
            .unwrap_err();
        assert!(matches!(big, Error::TooLarge { saving: true, .. }), "{big}");
        assert_eq!(paths7(&store).await, ["b"]);
        let msg = big.to_string();
        assert!(
            msg.contains(": not saved (") && !msg.contains("refusing to read"),
            "{msg}"
        );
        assert!(msg.contains("--max-manifest-size"), "{msg}");
    }

    /// The paths `m7` lists now.
    async fn paths7(store: &FaultStore) -> Vec<String> {
        let back = load_within(store, "m7", 7, &limits(1 << 20)).await.unwrap();
        let files = back.unwrap().manifest.files;
        files.into_iter().map(|f| f.path).collect()
    }

    #[tokio::test]
    async fn a_save_from_the_run_s_last_save_reads_nothing() {
        let store = FaultStore::new(Arc::new(MemoryStore::new()));
        let c1 = save7(&store, from(None), "a").await;
        assert_eq!(manifest_calls(&store), [Op::GetBytes, Op::PutBytes]);
        let c2 = save7(&store, from(c1.into_known()), "b").await;
        // One conditional write, no read.
        let (get, put) = (Op::GetBytes, Op::PutBytes);
        assert_eq!(manifest_calls(&store), [get, put, put]);
        assert_eq!((c2.attempts, c2.manifest.version), (1, 2));
        let back = load(&store, "m7", 7).await.unwrap().unwrap();
        assert_eq!(back.manifest, c2.manifest);
        assert_eq!(back.etag, c2.into_known().unwrap().etag);
        assert_eq!(paths7(&store).await, ["a", "b"]);
    }

    #[tokio::test]
    async fn a_known_manifest_without_an_etag_is_read_before_the_save() {
        let store = FaultStore::new(Arc::new(MemoryStore::new()));
        let c1 = save7(&store, from(None), "a").await;
        let mut known = c1.into_known().unwrap();
        known.etag.clear();
        let c2 = save7(&store, from(Some(known)), "b").await;
        let (get, put) = (Op::GetBytes, Op::PutBytes);
        assert_eq!(manifest_calls(&store), [get, put, get, put]);
        assert_eq!((c2.attempts, c2.manifest.version), (1, 2));
        assert_eq!(paths7(&store).await, ["a", "b"]);
    }

    #[tokio::test]
    async fn a_known_manifest_saved_since_by_another_is_read_again_and_nothing_is_lost() {
        let store = FaultStore::new(Arc::new(MemoryStore::new()));
        let ours = save7(&store, from(None), "a").await;
        // Another job saves in between (a compaction, gc).
        save7(&store, from(None), "other").await;
        let before = manifest_calls(&store).len();
        let c = save7(&store, from(ours.into_known()), "b").await;
        // The write from the stale manifest is refused; the save goes on from a fresh load.
        let (get, put) = (Op::GetBytes, Op::PutBytes);
        assert_eq!(manifest_calls(&store)[before..], [put, get, put]);
        assert_eq!((c.attempts, c.manifest.version), (2, 3));
        assert!(c.resumable);
        assert_eq!(paths7(&store).await, ["a", "other", "b"]);
    }

    #[tokio::test]
    async fn a_known_etag_refused_on_an_unchanged_manifest_makes_the_save_not_resumable() {
        let store = FaultStore::new(Arc::new(MemoryStore::new()));
        store.arm(Op::PutBytes, Some("m7"), 1, Action::ForeignEtag);
        let c1 = save7(&store, from(None), "a").await;
        let c2 = save7(&store, from(c1.into_known()), "b").await;
        // Refused although nothing was saved in between: the store's answer is not an etag
        // it matches, so no later save starts from one.
        assert!(!c2.resumable);
        assert_eq!(c2.manifest.version, 2);
        assert!(c2.into_known().is_none());
        assert_eq!(paths7(&store).await, ["a", "b"]);
    }

    #[tokio::test]
    async fn a_history_copy_left_to_the_caller_is_written_only_by_it() {
        let store = FaultStore::new(Arc::new(MemoryStore::new()));
        let leave = SaveFrom {
            known: None,
            leave_copy: true,
        };
        let mut c = save7(&store, leave, "a").await;
        let copy_key = history_key_of("m7", 1);
        assert!(!store.calls().iter().any(|c| c.key == copy_key));
        c.copy.take().unwrap().write(&store).await;
        let saved = store.get_bytes("m7").await.unwrap().bytes;
        assert_eq!(store.get_bytes(&copy_key).await.unwrap().bytes, saved);
        // Written by the save itself otherwise.
        let c2 = save7(&store, from(c.into_known()), "b").await;
        assert!(c2.copy.is_none());
        let saved = store.get_bytes("m7").await.unwrap().bytes;
        let copy = store.get_bytes(&history_key_of("m7", 2)).await.unwrap();
        assert_eq!(copy.bytes, saved);
    }

    fn limits(manifest_bytes: u64) -> ReadLimits {
        ReadLimits {
            manifest_bytes,
            ..ReadLimits::default()
        }
    }

    /// A layout whose manifest of schema 7 is `m7`, read within `manifest_bytes`.
    fn within(manifest_bytes: u64) -> Layout {
        Layout::new("", "data", "m{schema_id}")
            .unwrap()
            .with_limits(limits(manifest_bytes))
    }

    async fn put_json(store: &dyn ObjectStore, key: &str, json: &Value) -> u64 {
        let body = serde_json::to_vec_pretty(json).unwrap();
        let size = body.len() as u64;
        store
            .put_bytes(key, Bytes::from(body), PutMode::Overwrite)
            .await
            .unwrap();
        size
    }

    fn ops(store: &FaultStore) -> Vec<(Op, String)> {
        store.calls().into_iter().map(|c| (c.op, c.key)).collect()
    }

    #[test]
    fn the_default_limits_are_documented() {
        let d = ReadLimits::default();
        assert_eq!(d.manifest_bytes, 64 << 20);
        assert_eq!(d.gc_state_bytes, 16 << 20);
        assert_eq!(d.owner_marker_bytes, 64 << 10);
    }

    #[tokio::test]
    async fn a_manifest_over_the_limit_is_refused_without_being_read() {
        let store = FaultStore::new(Arc::new(MemoryStore::new()));
        let mut m = Manifest::empty(7);
        m.files = (0..20)
            .map(|i| entry(&format!("data/7/{i}.parquet"), Tier::Delta))
            .collect();
        let size = put_json(&store, "m7", &serde_json::to_value(&m).unwrap()).await;
        let before = store.calls().len();
        let err = load_within(&store, "m7", 7, &limits(size - 1))
            .await
            .unwrap_err();
        match &err {
            Error::TooLarge {
                what, key, limit, ..
            } => assert_eq!((*what, key.as_str(), *limit), ("manifest", "m7", size - 1)),
            other => panic!("{other:?}"),
        }
        let msg = err.to_string();
        assert!(msg.contains(&format!("{size} bytes")), "{msg}");
        assert!(msg.contains("--max-manifest-size"), "{msg}");
        // One capped read (S3 refuses it by its announced length, before the body).
        assert_eq!(ops(&store)[before..], [(Op::GetBytes, "m7".to_string())]);
        // At the limit it loads.
        let loaded = load_within(&store, "m7", 7, &limits(size)).await.unwrap();
        assert_eq!(loaded.unwrap().manifest, m);
        // A commit reads within the same limit and writes nothing.
        let calls = store.calls().len();
        let clock = ManualClock::new(1);
        let err = commit_within(
            &store,
            &within(size - 1),
            7,
            &clock,
            CommitPolicy::default(),
            |_| Ok(()),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, Error::TooLarge { .. }), "{err}");
        assert_eq!(ops(&store)[calls..], [(Op::GetBytes, "m7".to_string())]);
    }

    #[tokio::test]
    async fn a_manifest_that_grew_after_its_head_is_refused() {
        let store = Arc::new(FaultStore::new(Arc::new(MemoryStore::new())));
        let small = put_json(store.as_ref(), "m", &serde_json::json!({"schema_id": 7})).await;
        let gate = Gate::new();
        store.arm(Op::GetBytes, None, 1, Action::Pause(gate.clone()));
        let s = store.clone();
        let task =
            tokio::spawn(async move { load_within(s.as_ref(), "m", 7, &limits(small + 10)).await });
        gate.wait_reached().await;
        let padded = format!("{{\"schema_id\": 7{}}}", " ".repeat(100));
        store
            .put_bytes("m", Bytes::from(padded), PutMode::Overwrite)
            .await
            .unwrap();
        gate.release();
        let err = task.await.unwrap().unwrap_err();
        assert!(
            matches!(&err, Error::TooLarge { size, .. } if *size > small + 10),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn a_missing_manifest_is_decided_by_the_get_alone() {
        // No HEAD (which cannot tell a missing bucket from a missing key): the GET decides.
        let store = FaultStore::new(Arc::new(MemoryStore::new()));
        assert!(load(&store, "absent", 7).await.unwrap().is_none());
        assert_eq!(ops(&store), [(Op::GetBytes, "absent".to_string())]);
        store.arm(Op::GetBytes, None, 1, Action::Fail);
        let err = load(&store, "absent", 7).await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::Storage {
                    op: "load manifest",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[tokio::test]
    async fn duplicate_paths_and_negative_numbers_are_refused_at_load() {
        let store = MemoryStore::new();
        let file = |path: &str, size: i64, rows: i64| serde_json::json!({"tier": "delta", "path": path, "size_bytes": size, "row_count": rows});
        let cases = [
            (
                vec![
                    file("data/7/a.parquet", 1, 1),
                    file("data/7/b.parquet", 1, 1),
                    file("data/7/a.parquet", 2, 2),
                ],
                "lists \"data/7/a.parquet\" more than once",
            ),
            (
                vec![
                    file("data/7/a.parquet", 1, 1),
                    file("data/7/n.parquet", 1, -1),
                ],
                "entry \"data/7/n.parquet\" has a negative row_count (-1)",
            ),
            (
                vec![file("data/7/s.parquet", i64::MIN, 1)],
                "entry \"data/7/s.parquet\" has a negative size_bytes",
            ),
            (
                vec![file("data/7/m.parquet", 1, i64::MAX)],
                "entry \"data/7/m.parquet\" has an impossible row_count",
            ),
        ];
        for (files, want) in cases {
            put_json(
                &store,
                "manifest/7.json",
                &serde_json::json!({"schema_id": 7, "files": files}),
            )
            .await;
            let err = load(&store, "manifest/7.json", 7).await.unwrap_err();
            let msg = err.to_string();
            assert!(msg.starts_with("manifest manifest/7.json: "), "{msg}");
            assert!(msg.contains(want), "{msg}");
        }
        // The largest valid numbers load; 1,100 of them pass i64::MAX and the sums saturate.
        let big: Vec<_> = (0..1100)
            .map(|i| file(&format!("data/7/{i}.parquet"), MAX_COUNT, MAX_COUNT))
            .collect();
        put_json(
            &store,
            "manifest/7.json",
            &serde_json::json!({"schema_id": 7, "files": big}),
        )
        .await;
        let m = load(&store, "manifest/7.json", 7)
            .await
            .unwrap()
            .unwrap()
            .manifest;
        assert_eq!(Manifest::total_rows(&m.files), i64::MAX);
        assert_eq!(Manifest::total_bytes(&m.files), i64::MAX);
    }

    #[tokio::test]
    async fn a_commit_never_writes_what_a_load_would_refuse() {
        let store = FaultStore::new(Arc::new(MemoryStore::new()));
        let clock = ManualClock::new(1);
        commit(&store, "m7", 7, &clock, CommitPolicy::default(), |m| {
            m.files.push(entry("data/7/a.parquet", Tier::Delta));
            Ok(())
        })
        .await
        .unwrap();
        let writes = store.writes().len();
        let err = commit(&store, "m7", 7, &clock, CommitPolicy::default(), |m| {
            m.files.push(entry("data/7/a.parquet", Tier::Base));
            Ok(())
        })
        .await
        .unwrap_err();
        assert!(err.to_string().contains("more than once"), "{err}");
        // One that would grow past the limit is not written either.
        let size = store.get_bytes("m7").await.unwrap().bytes.len() as u64;
        let err = commit_within(
            &store,
            &within(size),
            7,
            &clock,
            CommitPolicy::default(),
            |m| {
                m.files.push(entry("data/7/b.parquet", Tier::Delta));
                Ok(())
            },
        )
        .await
        .unwrap_err();
        assert!(matches!(err, Error::TooLarge { .. }), "{err}");
        assert!(err.to_string().contains("nothing was written"), "{err}");
        assert_eq!(store.writes().len(), writes);
    }

    #[tokio::test]
    async fn a_commit_on_the_largest_version_and_time_saturates() {
        let store = MemoryStore::new();
        put_json(
            &store,
            "m",
            &serde_json::json!({"schema_id": 7, "version": i64::MAX, "updated_at_ms": i64::MAX, "files": []}),
        )
        .await;
        let c = commit(
            &store,
            "m",
            7,
            &ManualClock::new(1),
            CommitPolicy::default(),
            |_| Ok(()),
        )
        .await
        .unwrap();
        assert_eq!(
            (c.manifest.version, c.manifest.updated_at_ms),
            (i64::MAX, i64::MAX)
        );
    }

    #[test]
    fn the_first_foreign_path_listed_or_retired_is_named() {
        let layout = Layout::new("", "data", "manifest/{schema_id}.json").unwrap();
        let mut m = Manifest::empty(7);
        m.files.push(entry(
            &layout.delta_key(7, uuid::Uuid::now_v7()),
            Tier::Delta,
        ));
        assert_eq!(m.foreign_path(&layout), None);
        let other = layout.delta_key(8, uuid::Uuid::now_v7());
        m.retire([&other], 1);
        assert_eq!(m.foreign_path(&layout).unwrap().path, other);
        m.retired = None;
        m.files.push(entry("data/7/../8/x.parquet", Tier::Base));
        assert_eq!(
            m.foreign_path(&layout).unwrap().path,
            "data/7/../8/x.parquet"
        );
    }

    #[tokio::test]
    async fn a_write_failure_is_ambiguous_not_a_conflict() {
        let faulty = FaultStore::new(Arc::new(MemoryStore::new()));
        faulty.arm(Op::PutBytes, None, 1, Action::FailAfter);
        let clock = ManualClock::new(1);
        let err = commit(&faulty, "m", 7, &clock, CommitPolicy::default(), |_| Ok(()))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::AmbiguousCommit { .. }), "{err}");
        // It did land: the ambiguity was real.
        assert!(load(&faulty, "m", 7).await.unwrap().is_some());
    }
}
