//! `lakecdc verify --source`: proves the lake equals its database (docs/design.md §10). Under
//! the schema lock (no flush interleaves), in one exported snapshot: the source's dirty row ids,
//! and its live rows' `(row_id, ltbase_updated_at)` in `row_id` order, against the lake's
//! current state streamed from the listed files ([`CurrentState`]). One pass classifies each
//! row that is not dirty: **missing** (live in the source, absent or deleted in the lake),
//! **extra** (live in the lake, absent or deleted in the source), **stale** (both live, other
//! versions); with `--deep`, **values** (equal versions, other values: the source's rows are
//! exported as init would write them and each row's values hashed on both sides).
//! `--repair` requeues every divergent row ([`crate::source::requeue`]) so the next flush
//! puts it right. Memory: a few pages and row groups, the dirty ids and the divergent ids.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Array, AsArray, FixedSizeBinaryArray};
use arrow::datatypes::Int64Type;
use arrow::record_batch::{RecordBatch, RecordBatchReader};
use serde::Serialize;
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::engine::export::Inputs;
use crate::engine::{Driver, Engine, EngineConfig};
use crate::error::{Error, Result};
use crate::job::Context;
use crate::lake::current::{Current, CurrentState, RowHasher};
use crate::lake::manifest::FileEntry;
use crate::schema::SchemaDef;
use crate::source::live::{self, ExportedSnapshot, IdRange, SnapshotTicket};
use crate::source::lock::SchemaLock;
use crate::source::requeue::{Requeue, Requeued};
use crate::source::{table_source, versions};

/// The most entities `--deep` reads (and exports) per page: init's default, which keeps a
/// page with its EAV rows and its export within a few hundred MiB.
const DEEP_PAGE_ROWS: usize = 50_000;

/// `verify --source` options.
#[derive(Debug, Clone)]
pub struct SourceOptions {
    /// Also compare the values of rows whose versions agree.
    pub deep: bool,
    /// Requeue every divergent row for the next flush.
    pub repair: bool,
    /// Ids listed per class in the report.
    pub max_ids: usize,
    /// Source rows read per keyset page or heap chunk.
    pub page_rows: usize,
    /// Connections reading the source's heap chunks at once.
    pub readers: usize,
}

impl Default for SourceOptions {
    fn default() -> Self {
        Self {
            deep: false,
            repair: false,
            max_ids: 100,
            page_rows: 250_000,
            readers: 2,
        }
    }
}

/// The rows of one divergence class.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Class {
    /// How many.
    pub count: u64,
    /// The first ids, in `row_id` order (up to `--max-ids`).
    pub ids: Vec<String>,
}

/// What `verify --source` found for one schema.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SourceCheck {
    /// Live rows of the source.
    pub source_rows: u64,
    /// Rows of the lake's current state (tombstones included).
    pub lake_rows: u64,
    /// Of `lake_rows`, the live ones (to set beside `source_rows`).
    pub lake_live: u64,
    /// Of `lake_rows`, the tombstones (rows whose newest copy says deleted).
    pub lake_tombstones: u64,
    /// Dirty rows (not compared: the next flush brings them).
    pub dirty_rows: u64,
    /// Distinct row ids compared (in the source, the lake or both).
    pub rows_compared: u64,
    /// Live in the source and not dirty, absent or deleted in the lake.
    pub missing: Class,
    /// Live in the lake and not dirty, absent or deleted in the source.
    pub extra: Class,
    /// Live in both and not dirty, at different versions.
    pub stale: Class,
    /// Equal versions, different values (`--deep` only).
    pub values: Option<Class>,
    /// Rows requeued by `--repair`.
    pub repaired: Option<Requeued>,
    /// Rows compared per second (distinct row ids over the pass's wall time).
    pub rows_per_s: f64,
    /// The lake's manifest names another source database (the comparison still ran).
    pub other_source: Option<String>,
    /// How the source was read: `heap` (in physical order, sorted by lakecdc) or `index` (in
    /// `row_id` order on the primary key); `index` for `--deep`.
    pub source_order: &'static str,
}

impl SourceCheck {
    /// Rows in any divergence class.
    pub fn divergent(&self) -> u64 {
        self.missing.count
            + self.extra.count
            + self.stale.count
            + self.values.as_ref().map_or(0, |v| v.count)
    }

    /// The report's lines for this check.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "    source: {} live, {} dirty; lake: {} live, {} tombstones; {} compared, {:.0} rows/s\n",
            self.source_rows,
            self.dirty_rows,
            self.lake_live,
            self.lake_tombstones,
            self.rows_compared,
            self.rows_per_s
        );
        let mut class = |name: &str, c: &Class| {
            if c.count > 0 {
                out.push_str(&format!(
                    "    {name} {}: {}{}\n",
                    c.count,
                    c.ids.join(" "),
                    if (c.ids.len() as u64) < c.count {
                        " …"
                    } else {
                        ""
                    }
                ));
            }
        };
        class("missing", &self.missing);
        class("extra", &self.extra);
        class("stale", &self.stale);
        if let Some(v) = &self.values {
            class("values", v);
        }
        if let Some(r) = &self.repaired {
            out.push_str(&format!(
                "    repaired: {} requeued ({} re-exported, {} tombstones); run flush, then verify --source again\n",
                r.count(),
                r.live.len(),
                r.tombstones.len()
            ));
        }
        if let Some(o) = &self.other_source {
            out.push_str(&format!(
                "    note: {}\n",
                crate::report::printable(o, false)
            ));
        }
        out
    }
}

/// One source row: id, version and (deep) the hash of its values as an export writes them.
type SourceRow = (u128, i64, Option<u64>);

/// The version of a table source's row: the table keeps none per row (its touches are deleted
/// once exported, docs/design.md §9.2), so the lake's version is not compared.
const ANY_VERSION: i64 = i64::MIN;

/// What `verify --source` compares the lake with.
pub(super) enum What<'a> {
    /// A schema's entities (with its metadata for `--deep`).
    Schema(Option<&'a SchemaDef>),
    /// A table source's rows.
    Table,
}

/// Compares schema `schema_id`'s listed `files` with the source, under its lock (held by the
/// caller), and returns the report with the divergent rows [`repair`] requeues.
pub(super) async fn check(
    ctx: &Context,
    opts: &SourceOptions,
    engine: &EngineConfig,
    work_dir: &Path,
    schema_id: i16,
    what: What<'_>,
    files: Vec<FileEntry>,
) -> Result<(SourceCheck, Vec<Requeue>)> {
    let (def, table) = match what {
        What::Schema(def) => (def, false),
        What::Table => (None, true),
    };
    let started = Instant::now();
    let mut out = SourceCheck::default();
    // Deep: the hasher is built from the columns a fresh export writes.
    let table_deep = match (opts.deep, table) {
        (true, true) => Some(TableDeep::open(ctx, work_dir, schema_id).await?),
        _ => None,
    };
    let deep = match (opts.deep, def) {
        (false, _) => None,
        (true, _) if table => None,
        (true, Some(def)) => Some(Deep::open(engine, work_dir, def, schema_id).await?),
        (true, None) => {
            return Err(Error::setting(
                "schema-dir",
                "is needed by verify --source --deep (the attribute metadata)",
            ));
        }
    };
    let hasher = deep
        .as_ref()
        .map(|d| d.hasher.clone())
        .or_else(|| table_deep.as_ref().map(|d| d.hasher.clone()));
    // The lake's side needs nothing from the source: it starts first.
    // Up to 16 chunks (1M rows, 48 MiB) ahead: a source read in heap order arrives only once
    // complete, and the lake is read meanwhile.
    let (lake_tx, lake_rx) = mpsc::channel::<Result<Vec<Current>>>(16);
    let lake = {
        let mut state = CurrentState::new(ctx.lake.store.clone(), files, hasher);
        tokio::spawn(async move {
            let started = Instant::now();
            loop {
                let chunk = state.next_chunk(64 * 1024).await;
                let end = matches!(&chunk, Ok(c) if c.is_empty()) || chunk.is_err();
                if lake_tx.send(chunk).await.is_err() || end {
                    let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                    tracing::debug!(files = state.files_read, ms, "lake read");
                    return;
                }
            }
        })
    };
    let (src_tx, mut src_rx) = mpsc::channel::<Result<Vec<SourceRow>>>(4);
    let (dirty, source, snapshot) = match deep {
        // A table source: one snapshot on a plain connection, the rows in `row_id` order.
        None if table => {
            let (dirty_tx, dirty_rx) = tokio::sync::oneshot::channel();
            let source = spawn_table(ctx, opts, schema_id, table_deep, dirty_tx, src_tx);
            match dirty_rx.await {
                Ok(dirty) => (dirty, source, None),
                Err(_) => {
                    return Err(match src_rx.recv().await {
                        Some(Err(e)) => e,
                        _ => Error::Invariant("the source reader ended early".into()),
                    });
                }
            }
        }
        // One transaction reads the dirty ids, then the pages.
        None => {
            let (dirty_tx, dirty_rx) = tokio::sync::oneshot::channel();
            let conn = ctx.connector.connect_tapped().await?;
            let source = spawn_shallow(ctx, opts, work_dir, schema_id, conn, dirty_tx, src_tx);
            match dirty_rx.await {
                Ok(dirty) => (dirty, source, None),
                // The reader failed before the dirty ids: its error says why.
                Err(_) => {
                    return Err(match src_rx.recv().await {
                        Some(Err(e)) => e,
                        _ => Error::Invariant("the source reader ended early".into()),
                    });
                }
            }
        }
        // Deep: the pages are init's (with their EAV rows), read in an exported snapshot
        // that the dirty ids are read in too.
        Some(deep) => {
            let snapshot = ExportedSnapshot::export(&ctx.connector).await?;
            let mut conn = ctx.connector.connect_tapped().await?;
            let dirty =
                versions::dirty_ids(&mut conn, snapshot.ticket(), &ctx.tables, schema_id).await?;
            let source = spawn_deep(ctx, opts, schema_id, deep, conn, snapshot.ticket(), src_tx);
            (dirty, source, Some(snapshot))
        }
    };
    out.dirty_rows = dirty.len() as u64;
    let mut cmp = Compare::new(opts, dirty);
    let mut src = Feed::new(src_rx);
    let mut lake_rows = Feed::new(lake_rx);
    let (mut s_head, mut l_head) = (src.next().await?, lake_rows.next().await?);
    loop {
        use std::cmp::Ordering;
        // Which stream(s) the row came from.
        let (from_source, from_lake) = match (s_head, l_head) {
            (None, None) => break,
            (Some(s), None) => {
                cmp.source_only(s);
                (true, false)
            }
            (None, Some(l)) => {
                cmp.lake_only(l);
                (false, true)
            }
            (Some(s), Some(l)) => match s.0.cmp(&l.row_id) {
                Ordering::Equal => {
                    cmp.both(s, l);
                    (true, true)
                }
                Ordering::Less => {
                    cmp.source_only(s);
                    (true, false)
                }
                Ordering::Greater => {
                    cmp.lake_only(l);
                    (false, true)
                }
            },
        };
        if from_source {
            s_head = src.next().await?;
        }
        if from_lake {
            l_head = lake_rows.next().await?;
        }
    }
    let heap = source.await.map_err(Error::task("read the source"))??;
    out.source_order = if heap { "heap" } else { "index" };
    lake.await.map_err(Error::task("read the lake"))?;
    if let Some(snapshot) = snapshot {
        snapshot.release().await?;
    }
    out.source_rows = cmp.source_rows;
    out.lake_rows = cmp.lake_rows;
    out.lake_tombstones = cmp.lake_tombstones;
    out.lake_live = cmp.lake_rows - cmp.lake_tombstones;
    out.rows_compared = cmp.compared;
    out.missing = cmp.classes[0].clone();
    out.extra = cmp.classes[1].clone();
    out.stale = cmp.classes[2].clone();
    out.values = opts.deep.then(|| cmp.classes[3].clone());
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    out.rows_per_s = out.rows_compared as f64 / secs;
    Ok((out, cmp.divergent))
}

/// `--repair`: requeues the `divergent` rows [`check`] found, so the next flush puts them
/// right — only while `lock` is still held, as the comparison was made under it
/// (docs/hazards.md L68).
pub(super) async fn repair(
    ctx: &Context,
    lock: &SchemaLock,
    divergent: &[Requeue],
    out: &mut SourceCheck,
) -> Result<()> {
    if divergent.is_empty() {
        return Ok(());
    }
    lock.ensure_held().await?;
    let mut client = ctx.connector.connect().await?;
    out.repaired = Some(
        crate::source::repair::requeue_source(
            &mut client,
            &ctx.tables,
            lock.schema_id(),
            divergent,
            ctx.clock.now_ms(),
            false,
        )
        .await?,
    );
    Ok(())
}

/// A stream of rows arriving in chunks; an empty chunk or a closed channel ends it.
struct Feed<T> {
    rx: mpsc::Receiver<Result<Vec<T>>>,
    buf: std::vec::IntoIter<T>,
    done: bool,
}

impl<T> Feed<T> {
    fn new(rx: mpsc::Receiver<Result<Vec<T>>>) -> Self {
        Self {
            rx,
            buf: Vec::new().into_iter(),
            done: false,
        }
    }

    async fn next(&mut self) -> Result<Option<T>> {
        loop {
            if let Some(r) = self.buf.next() {
                return Ok(Some(r));
            }
            if self.done {
                return Ok(None);
            }
            match self.rx.recv().await {
                Some(chunk) => {
                    let chunk = chunk?;
                    self.done = chunk.is_empty();
                    self.buf = chunk.into_iter();
                }
                None => self.done = true,
            }
        }
    }
}

/// Reads the source's dirty ids (into `dirty`) and live rows' versions (into `tx`, in `row_id`
/// order): chunks read in heap order are sorted into runs on a blocking thread and merged once
/// the read is complete ([`super::runs`]).
fn spawn_shallow(
    ctx: &Context,
    opts: &SourceOptions,
    work_dir: &Path,
    schema_id: i16,
    mut conn: crate::source::connect::TappedClient,
    dirty: tokio::sync::oneshot::Sender<Vec<(u128, i64)>>,
    tx: mpsc::Sender<Result<Vec<SourceRow>>>,
) -> tokio::task::JoinHandle<Result<bool>> {
    let (tables, connector) = (ctx.tables.clone(), ctx.connector.clone());
    let (page_rows, readers) = (opts.page_rows.max(1), opts.readers.max(1));
    let dir = work_dir.to_path_buf();
    tokio::spawn(async move {
        let started = Instant::now();
        let (sort_tx, mut sort_rx) = mpsc::channel::<Vec<(u128, i64)>>(1);
        let merged = tx.clone();
        let sorter = tokio::task::spawn_blocking(move || -> Result<()> {
            let mut runs = super::runs::Runs::new(&dir);
            let mut any = false;
            while let Some(rows) = sort_rx.blocking_recv() {
                runs.push(rows)?;
                any = true;
            }
            if any {
                runs.merge(|chunk| {
                    let rows = chunk.into_iter().map(|(id, v)| (id, v, None)).collect();
                    merged.blocking_send(Ok(rows)).is_ok()
                })?;
            }
            Ok(())
        });
        let read = versions::live_versions(
            &connector,
            &mut conn,
            &tables,
            schema_id,
            page_rows,
            readers,
            |ids| {
                let _ = dirty.send(ids);
            },
            |chunk| {
                let (tx, sort_tx) = (tx.clone(), sort_tx.clone());
                async move {
                    if chunk.sorted {
                        let rows = chunk
                            .rows
                            .into_iter()
                            .map(|(id, v)| (id, v, None))
                            .collect();
                        tx.send(Ok(rows)).await.is_ok()
                    } else {
                        sort_tx.send(chunk.rows).await.is_ok()
                    }
                }
            },
        )
        .await;
        drop(sort_tx);
        let ms = || u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::debug!(ms = ms(), "source read");
        let sorted = sorter
            .await
            .map_err(Error::task("sort the source's versions"));
        tracing::debug!(ms = ms(), "source sorted and merged");
        match (read, sorted.and_then(|r| r)) {
            (Ok(heap), Ok(())) => Ok(heap),
            (Err(e), _) | (_, Err(e)) => {
                let _ = tx.send(Err(e)).await;
                Ok(false)
            }
        }
    })
}

/// Reads a table source's pending ids (into `dirty`) and its rows' ids (into `tx`, in
/// `row_id` order, with [`ANY_VERSION`]) in one snapshot; with `deep`, its rows as init
/// exports them, each with its values' hash.
fn spawn_table(
    ctx: &Context,
    opts: &SourceOptions,
    schema_id: i16,
    deep: Option<TableDeep>,
    dirty: tokio::sync::oneshot::Sender<Vec<(u128, i64)>>,
    tx: mpsc::Sender<Result<Vec<SourceRow>>>,
) -> tokio::task::JoinHandle<Result<bool>> {
    let (tables, connector) = (ctx.tables.clone(), ctx.connector.clone());
    let page_rows = opts.page_rows.max(1);
    tokio::spawn(async move {
        let read = async {
            // Deep: the connection and the source it was prepared with.
            if let Some(deep) = deep {
                return deep.read(page_rows, dirty, &tx).await;
            }
            let client = connector.connect().await?;
            let src = table_source::load(&client, &tables, schema_id).await?;
            let (read, ids) = table_source::IdRead::open(&client, &src).await?;
            let _ = dirty.send(unversioned(ids));
            loop {
                let page = read.page(page_rows).await?;
                let end = page.is_empty();
                let rows = page.into_iter().map(|id| (id, ANY_VERSION, None)).collect();
                if tx.send(Ok(rows)).await.is_err() || end {
                    break;
                }
            }
            read.close().await
        };
        if let Err(e) = read.await {
            let _ = tx.send(Err(e)).await;
        }
        Ok(false)
    })
}

/// Reads the source's live rows with their exported values' hashes into `tx`.
fn spawn_deep(
    ctx: &Context,
    opts: &SourceOptions,
    schema_id: i16,
    deep: Deep,
    mut conn: crate::source::connect::TappedClient,
    ticket: SnapshotTicket,
    tx: mpsc::Sender<Result<Vec<SourceRow>>>,
) -> tokio::task::JoinHandle<Result<bool>> {
    let tables = ctx.tables.clone();
    // Pages of whole entities with their EAV rows, as init reads them: init's page size.
    let page_rows = opts.page_rows.clamp(1, DEEP_PAGE_ROWS);
    tokio::spawn(async move {
        if let Err(e) = deep
            .read(&mut conn, ticket, &tables, schema_id, page_rows, &tx)
            .await
        {
            let _ = tx.send(Err(e)).await;
        }
        Ok(false)
    })
}

/// A table source's pending ids, whose versions the touch log does not hold: never below the
/// lake's.
fn unversioned(ids: Vec<u128>) -> Vec<(u128, i64)> {
    ids.into_iter().map(|id| (id, i64::MAX)).collect()
}

/// The classifier: one pass over both streams, with the dirty ids.
struct Compare {
    /// `(row_id, the dirty slot's version)`, sorted.
    dirty: Vec<(u128, i64)>,
    next_dirty: usize,
    max_ids: usize,
    deep: bool,
    repair: bool,
    /// missing, extra, stale, values.
    classes: [Class; 4],
    divergent: Vec<Requeue>,
    source_rows: u64,
    lake_rows: u64,
    lake_tombstones: u64,
    compared: u64,
}

impl Compare {
    fn new(opts: &SourceOptions, dirty: Vec<(u128, i64)>) -> Self {
        Self {
            dirty,
            next_dirty: 0,
            max_ids: opts.max_ids,
            deep: opts.deep,
            repair: opts.repair,
            classes: Default::default(),
            divergent: Vec::new(),
            source_rows: 0,
            lake_rows: 0,
            lake_tombstones: 0,
            compared: 0,
        }
    }

    /// The version of `id`'s dirty slot, when it is dirty; ids are asked in increasing order.
    fn dirty(&mut self, id: u128) -> Option<i64> {
        while self.dirty.get(self.next_dirty).is_some_and(|d| d.0 < id) {
            self.next_dirty += 1;
        }
        self.dirty
            .get(self.next_dirty)
            .filter(|d| d.0 == id)
            .map(|d| d.1)
    }

    fn found(&mut self, class: usize, id: u128, floor: i64) {
        let c = &mut self.classes[class];
        c.count += 1;
        if c.ids.len() < self.max_ids {
            c.ids.push(Uuid::from_u128(id).to_string());
        }
        if self.repair {
            self.divergent.push(Requeue {
                row_id: Uuid::from_u128(id),
                floor,
            });
        }
    }

    /// Counts a row of the lake's current state.
    fn lake_row(&mut self, l: &Current) {
        self.lake_rows += 1;
        self.lake_tombstones += u64::from(l.tombstone);
    }

    fn both(&mut self, s: SourceRow, l: Current) {
        self.source_rows += 1;
        self.lake_row(&l);
        self.compared += 1;
        if let Some(dirty) = self.dirty(s.0) {
            // Left to the next flush — unless its version is below the lake's copy, which
            // would win over it (a database restored to an earlier state, docs/hazards.md
            // L96): requeued above the lake's copy, it wins.
            if dirty < l.changed_at {
                let class = if l.tombstone { 0 } else { 2 };
                self.found(class, s.0, l.changed_at);
            }
            return;
        }
        if l.tombstone {
            self.found(0, s.0, l.changed_at);
        } else if s.1 != ANY_VERSION && s.1 != l.changed_at {
            self.found(2, s.0, l.changed_at.max(s.1));
        } else if self.deep && s.2 != l.hash {
            self.found(3, s.0, l.changed_at);
        }
    }

    fn source_only(&mut self, s: SourceRow) {
        self.source_rows += 1;
        self.compared += 1;
        if self.dirty(s.0).is_none() {
            self.found(0, s.0, 0);
        }
    }

    fn lake_only(&mut self, l: Current) {
        self.lake_row(&l);
        self.compared += 1;
        // A dirty slot (a tombstone: the row is not in the source) below the lake's live
        // copy would lose to it, as in `both`.
        let loses = |v: i64| v < l.changed_at;
        if !l.tombstone && self.dirty(l.row_id).is_none_or(loses) {
            self.found(1, l.row_id, l.changed_at);
        }
    }
}

/// `--deep`'s source side: pages of live entities exported as init writes them, read back and
/// hashed.
struct Deep {
    engine: Engine,
    def: SchemaDef,
    schema_id: i16,
    dir: std::path::PathBuf,
    hasher: Arc<RowHasher>,
}

impl Deep {
    async fn open(
        engine: &EngineConfig,
        work_dir: &Path,
        def: &SchemaDef,
        schema_id: i16,
    ) -> Result<Self> {
        let (cfg, def, dir) = (engine.clone(), def.clone(), work_dir.to_path_buf());
        tokio::task::spawn_blocking(move || {
            let engine = Engine::open(&cfg)?;
            let empty = live::empty_live_page(&def)?;
            let path = dir.join(format!("verify-{}.parquet", Uuid::new_v4()));
            let batches = export_page(&engine, &def, schema_id, &empty, &path)?;
            let schema = batches
                .first()
                .map(RecordBatch::schema)
                .ok_or_else(|| Error::Invariant("an export wrote no schema".into()))?;
            let hasher = Arc::new(RowHasher::new(&schema)?);
            Ok(Self {
                engine,
                def,
                schema_id,
                dir,
                hasher,
            })
        })
        .await
        .map_err(Error::task("prepare the deep comparison"))?
    }

    async fn read(
        self,
        conn: &mut crate::source::connect::TappedClient,
        ticket: SnapshotTicket,
        tables: &crate::config::Tables,
        schema_id: i16,
        page_rows: usize,
        tx: &mpsc::Sender<Result<Vec<SourceRow>>>,
    ) -> Result<()> {
        let all = IdRange {
            lo: Uuid::nil(),
            hi: None,
        };
        let limit = i64::try_from(page_rows).unwrap_or(i64::MAX);
        let def = self.def.clone();
        // DuckDB's connection is used by one page at a time, on a blocking thread.
        let me = Arc::new(std::sync::Mutex::new(self));
        live::read_range(conn, ticket, tables, &def, schema_id, all, limit, |page| {
            let (me, tx) = (me.clone(), tx.clone());
            async move {
                let hashed = tokio::task::spawn_blocking(move || match me.lock() {
                    Ok(deep) => deep.hash_page(&page),
                    Err(_) => Err(Error::Invariant("a deep comparison panicked".into())),
                })
                .await
                .map_err(Error::task("hash a source page"))
                .and_then(|r| r);
                let ok = hashed.is_ok();
                tx.send(hashed).await.is_ok() && ok
            }
        })
        .await
    }

    /// One page exported and read back: each row's id, version and values' hash.
    fn hash_page(&self, page: &live::LivePage) -> Result<Vec<SourceRow>> {
        let path = self.dir.join(format!("verify-{}.parquet", Uuid::new_v4()));
        let batches = export_page(&self.engine, &self.def, self.schema_id, page, &path)?;
        let mut out = Vec::with_capacity(page.rows);
        for b in &batches {
            let bad = |c: &str| Error::Invariant(format!("exported column {c} has another type"));
            let ids = b
                .column_by_name("row_id")
                .and_then(|c| c.as_any().downcast_ref::<FixedSizeBinaryArray>())
                .ok_or_else(|| bad("row_id"))?;
            let versions = b
                .column_by_name("ltbase_updated_at")
                .and_then(|c| c.as_primitive_opt::<Int64Type>())
                .ok_or_else(|| bad("ltbase_updated_at"))?;
            let hashes = self.hasher.hash(b)?;
            for (i, h) in hashes.into_iter().enumerate() {
                let id: [u8; 16] = ids.value(i).try_into().map_err(|_| bad("row_id"))?;
                let v = if versions.is_valid(i) {
                    versions.value(i)
                } else {
                    0
                };
                out.push((u128::from_be_bytes(id), v, Some(h)));
            }
        }
        Ok(out)
    }
}

/// `--deep`'s side of a table source: its rows read as init reads them (one snapshot, `row_id`
/// order), each page written as init writes a file and read back, then hashed, so both sides
/// hash values of the same types.
struct TableDeep {
    dir: std::path::PathBuf,
    hasher: Arc<RowHasher>,
    /// The connection the rows are read on, and the source as loaded on it.
    client: tokio_postgres::Client,
    src: table_source::TableSource,
}

impl TableDeep {
    /// The hasher of the columns a fresh export of source `id` writes.
    async fn open(ctx: &Context, work_dir: &Path, id: i16) -> Result<Self> {
        let client = ctx.connector.connect().await?;
        let src = table_source::load(&client, &ctx.tables, id).await?;
        let empty = table_source::empty_rows(&src)?;
        let dir = work_dir.to_path_buf();
        let (hasher, dir) = tokio::task::spawn_blocking(move || {
            let batches = round_trip(&dir, &empty)?;
            let schema = batches
                .first()
                .map(RecordBatch::schema)
                .ok_or_else(|| Error::Invariant("a written page read back no schema".into()))?;
            let hasher = RowHasher::leaving_out(
                &schema,
                &[
                    "ltbase_created_at",
                    "ltbase_updated_at",
                    "ltbase_deleted_at",
                ],
            )?;
            Ok::<_, Error>((Arc::new(hasher), dir))
        })
        .await
        .map_err(Error::task("prepare the deep comparison"))??;
        Ok(Self {
            dir,
            hasher,
            client,
            src,
        })
    }

    /// Reads the pending ids (into `dirty`) and every row, hashed, (into `tx`) in one snapshot.
    async fn read(
        self,
        page_rows: usize,
        dirty: tokio::sync::oneshot::Sender<Vec<(u128, i64)>>,
        tx: &mpsc::Sender<Result<Vec<SourceRow>>>,
    ) -> Result<()> {
        let Self {
            dir,
            hasher,
            client,
            src,
        } = self;
        let (client, src, dir) = (Arc::new(client), Arc::new(src), Arc::new(dir));
        let read = table_source::SnapshotRead::open(
            client.clone(),
            src.clone(),
            table_source::ReadKind::Init,
        )
        .await?;
        // The same transaction, hence the same snapshot, as the rows.
        let _ = dirty.send(unversioned(table_source::pending_ids(&client, &src).await?));
        loop {
            let page = read.page(page_rows.min(DEEP_PAGE_ROWS)).await?.rows;
            if page.num_rows() == 0 {
                let _ = tx.send(Ok(Vec::new())).await;
                break;
            }
            let (dir, hasher) = (dir.clone(), hasher.clone());
            let hashed = tokio::task::spawn_blocking(move || hash_table_page(&dir, &hasher, &page))
                .await
                .map_err(Error::task("hash a source page"))??;
            if tx.send(Ok(hashed)).await.is_err() {
                break;
            }
        }
        read.close().await
    }
}

/// One table source page written as a lake file (in `dir`) and read back: each row's id and
/// values' hash.
fn hash_table_page(dir: &Path, hasher: &RowHasher, page: &RecordBatch) -> Result<Vec<SourceRow>> {
    let mut out = Vec::with_capacity(page.num_rows());
    for b in round_trip(dir, page)? {
        let ids = b
            .column_by_name("row_id")
            .and_then(|c| c.as_any().downcast_ref::<FixedSizeBinaryArray>())
            .ok_or_else(|| Error::Invariant("a written page's row_id has another type".into()))?;
        for (i, h) in hasher.hash(&b)?.into_iter().enumerate() {
            let id: [u8; 16] = ids.value(i).try_into().map_err(|_| {
                Error::Invariant("a written page's row_id has another width".into())
            })?;
            out.push((u128::from_be_bytes(id), ANY_VERSION, Some(h)));
        }
    }
    Ok(out)
}

/// Writes `batch` as a table source's lake file (in `dir`, removed afterwards) and reads it
/// back.
fn round_trip(dir: &Path, batch: &RecordBatch) -> Result<Vec<RecordBatch>> {
    let path = dir.join(format!("verify-{}.parquet", Uuid::new_v4()));
    let read = crate::engine::write_lake_file(&path, std::slice::from_ref(batch))
        .and_then(|_| read_back(&path));
    let _ = std::fs::remove_file(&path);
    read
}

/// Exports `page` as init would (to `path`, removed afterwards) and reads the file back.
fn export_page(
    engine: &Engine,
    def: &SchemaDef,
    schema_id: i16,
    page: &live::LivePage,
    path: &Path,
) -> Result<Vec<RecordBatch>> {
    let entities = [page.entities.clone()];
    let eav = [page.eav.clone()];
    let inputs = Inputs {
        change_log: &[],
        entities: &entities,
        eav: &eav,
    };
    let read = engine
        .export(def, schema_id, Driver::Entities, inputs, path)
        .and_then(|_| read_back(path));
    let _ = std::fs::remove_file(path);
    read
}

/// Every batch of the Parquet file at `path` (one empty batch with its schema when it holds
/// no row).
fn read_back(path: &Path) -> Result<Vec<RecordBatch>> {
    let io = |source| Error::Io {
        op: "read back an exported page",
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .and_then(|b| b.with_batch_size(8192).build())
        .map_err(|e| Error::Parquet {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
    let schema = reader.schema();
    let mut batches: Vec<RecordBatch> = reader
        .collect::<std::result::Result<_, _>>()
        .map_err(Error::arrow("read back an exported page"))?;
    if batches.is_empty() {
        batches.push(RecordBatch::new_empty(schema));
    }
    Ok(batches)
}
