//! `lakecdc init` against real PostgreSQL and SeaweedFS: the oracle, the init hazards of
//! docs/hazards.md, a concurrent writer, lock contention and the delta-tier refusal.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::FutureExt;
use lakecdc::init::{InitOptions, Outcome, ReadOrder};
use lakecdc::lake::KeyKind;
use lakecdc::store::ObjectStore;

use crate::support::oracle::{self, V};
use crate::support::rig::{LakeKind, Rig, rig};
use crate::support::writer::{Customer, Rng, Writer};

const MANIFEST: &str = "manifest/100.json";

fn opts(rig: &Rig) -> InitOptions {
    InitOptions {
        schemas: vec!["customer".into()],
        work_dir: rig.opts.work_dir.clone(),
        page_rows: 25,
        max_file_rows: 60,
        // Tests of heap order say so (`auto` reads these small tables in row-id order).
        read_order: ReadOrder::RowId,
        ..InitOptions::default()
    }
}

async fn init(rig: &Rig, o: &InitOptions) -> lakecdc::init::InitReport {
    lakecdc::init::run(&rig.ctx, o).await.unwrap()
}

/// Asserts every one of `deltas` is still in the store and recorded as retired (and nothing
/// else is retired).
async fn assert_kept_and_retired(rig: &Rig, deltas: &[String], fault: &str) {
    for d in deltas {
        rig.store
            .head(d)
            .await
            .unwrap_or_else(|e| panic!("{d} {fault}: {e}"));
    }
    assert_eq!(
        oracle::retired_paths(rig.store.as_ref(), MANIFEST).await,
        deltas.iter().cloned().collect()
    );
}

async fn base_paths(rig: &Rig) -> Vec<String> {
    rig.listed().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn init_exports_exactly_the_live_rows_and_flush_continues_from_there() {
    // Both read orders: keyset pages in row-id order, and heap ranges into row-id buckets.
    for order in [ReadOrder::RowId, ReadOrder::Heap] {
        let mut rig = rig(LakeKind::S3).await;
        let mut r = Rng::new(41);
        rig.seed(100, &mut r).await;
        for _ in 0..120 {
            rig.writer.random_op(&mut r).await;
        }
        // Two readers (the default), each staging several files.
        let progress = Arc::new(std::sync::Mutex::new(Vec::new()));
        let o = InitOptions {
            max_file_rows: 30,
            read_order: order,
            progress: Some(Arc::new({
                let progress = progress.clone();
                move |_, done, total| progress.lock().unwrap().push((done, total))
            })),
            ..opts(&rig)
        };
        assert_eq!(o.readers, 2);
        let report = init(&rig, &o).await;
        let s = &report.schemas[0];
        assert_eq!(s.outcome, Outcome::Exported, "{s:?}");
        assert_eq!(s.heap_order, order == ReadOrder::Heap, "{s:?}");
        // A heap-order read spilled the live rows to scratch disk, and says how much.
        assert_eq!(s.scratch_bytes > 0, order == ReadOrder::Heap, "{s:?}");
        let live = rig.writer.rows.values().filter(|m| !m.soft_deleted).count();
        assert_eq!(s.rows as usize, live);
        assert_eq!(s.live_rows as usize, live);
        // Progress counts every row once; while reading, its total (the planner's estimate) stays
        // above the rows done, and a last call says reading is over.
        let progress = progress.lock().unwrap().clone();
        let (last, reading) = progress.split_last().unwrap();
        assert!(reading.windows(2).all(|w| w[0].0 < w[1].0), "{progress:?}");
        assert!(
            reading.iter().all(|(done, total)| total > done),
            "{progress:?}"
        );
        assert_eq!(*last, (live as u64, live as u64));
        assert!(
            s.files.len() >= 4,
            "small files force several per reader: {s:?}"
        );
        let compared = oracle::assert_live_rows(&rig.writer, rig.store.as_ref(), MANIFEST).await;
        assert_eq!(compared, live);
        let layout = rig.ctx.lake.layout.clone();
        for p in base_paths(&rig).await {
            assert!(
                matches!(
                    layout.classify(&p),
                    KeyKind::InitBase {
                        schema_id: 100,
                        file: Some(_),
                        ..
                    }
                ),
                "{p}"
            );
        }
        // Each file is sorted by row_id, its recorded range is its rows' true range, and no two
        // files' ranges overlap (a file holds one reader's consecutive pages).
        let m = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
            .await
            .unwrap();
        let mut seen = BTreeSet::new();
        let mut ranges = Vec::new();
        for f in m["files"].as_array().unwrap() {
            let path = f["path"].as_str().unwrap();
            let rows = oracle::read_parquet(rig.store.get_bytes(path).await.unwrap().bytes);
            assert!(
                rows.windows(2).all(|w| w[0].0 < w[1].0),
                "{path} not sorted"
            );
            assert_eq!(f["row_id_min"].as_str().unwrap(), rows[0].0.to_string());
            assert_eq!(
                f["row_id_max"].as_str().unwrap(),
                rows[rows.len() - 1].0.to_string()
            );
            ranges.push((rows[0].0, rows[rows.len() - 1].0));
            for (id, _) in rows {
                assert!(seen.insert(id), "{id} is in two base files");
            }
        }
        assert_eq!(seen.len(), live);
        ranges.sort();
        for w in ranges.windows(2) {
            assert!(w[0].1 < w[1].0, "base files overlap in row-id range: {w:?}");
        }
        // After further writes, flush on top keeps the oracle.
        for _ in 0..60 {
            rig.writer.random_op(&mut r).await;
        }
        rig.flush().await;
        let (_, dirty) = rig.assert_oracle().await;
        assert_eq!(dirty, 0);
    }
}

#[tokio::test]
async fn a_rerun_replaces_the_base_tier_with_new_keys() {
    // docs/hazards.md #176 and #416
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(176);
    rig.seed(70, &mut r).await;
    init(&rig, &opts(&rig)).await;
    let first = base_paths(&rig).await;
    let state = oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
    init(&rig, &opts(&rig)).await;
    let second = base_paths(&rig).await;
    assert!(!first.is_empty() && !second.is_empty());
    let a: BTreeSet<_> = first.iter().collect();
    assert!(
        second.iter().all(|k| !a.contains(k)),
        "a rerun reused a key"
    );
    for k in &first {
        rig.store.head(k).await.unwrap(); // never overwritten, left for gc
    }
    // ... recorded as retired, so gc gives their readers the whole grace.
    assert_eq!(
        oracle::retired_paths(rig.store.as_ref(), MANIFEST).await,
        first.iter().cloned().collect()
    );
    assert_eq!(
        oracle::lake_state(rig.store.as_ref(), MANIFEST).await,
        state,
        "no duplicates, same state"
    );
}

#[tokio::test]
async fn a_base_and_a_delta_of_the_same_version_are_identical() {
    // docs/hazards.md #210
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(210);
    let ids = rig.seed(5, &mut r).await;
    // Updated rows too, so that a version differs from the creation time.
    for id in &ids[..3] {
        rig.writer.update(*id, Customer::random(&mut r)).await;
    }
    init(&rig, &opts(&rig)).await;
    rig.flush().await; // the same, still-dirty versions as deltas
    let m = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
        .await
        .unwrap();
    let mut base = Vec::new();
    let mut delta = Vec::new();
    for f in m["files"].as_array().unwrap() {
        let rows = oracle::read_parquet(
            rig.store
                .get_bytes(f["path"].as_str().unwrap())
                .await
                .unwrap()
                .bytes,
        );
        if f["tier"] == "base" {
            base.extend(rows)
        } else {
            delta.extend(rows)
        }
    }
    base.sort_by_key(|(id, _)| *id);
    delta.sort_by_key(|(id, _)| *id);
    assert_eq!(base.len(), ids.len());
    assert_eq!(base, delta, "base and delta copies differ");
    let updated = base
        .iter()
        .filter(|(_, row)| row.columns["ltbase_created_at"] != V::Int(row.changed_at))
        .count();
    assert_eq!(updated, 3, "versions after creation are compared too");
}

#[tokio::test]
async fn rows_deleted_below_the_cursor_never_drop_live_rows_above_it() {
    for order in [ReadOrder::RowId, ReadOrder::Heap] {
        // docs/hazards.md #462
        let mut rig = rig(LakeKind::S3).await;
        let mut r = Rng::new(462);
        let mut ids = rig.seed(120, &mut r).await;
        ids.sort();
        let victims: Vec<_> = ids[..10].to_vec();
        let writer = rig.second_writer().await;
        let (w2, v2) = (writer.clone(), victims.clone());
        let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let f2 = fired.clone();
        // One reader: the victims are then exactly the rows below its cursor after page 1.
        let mut o = InitOptions {
            readers: 1,
            read_order: order,
            ..opts(&rig)
        };
        o.after_page = Some(Arc::new(move |_| {
            let (w, v, f) = (w2.clone(), v2.clone(), f2.clone());
            async move {
                if !f.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    let mut w = w.lock().await;
                    for id in v {
                        w.hard_delete(id).await;
                    }
                }
            }
            .boxed()
        }));
        let report = init(&rig, &o).await;
        assert!(fired.load(std::sync::atomic::Ordering::SeqCst));
        let lake = oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
        for id in &ids[10..] {
            assert!(
                lake.contains_key(id),
                "live row {id} above the cursor was dropped"
            );
        }
        assert_eq!(
            report.schemas[0].rows, 120,
            "the deleted rows had been read in page 1"
        );
        // The deletes reach the lake with the next flush.
        rig.take_model(&writer).await;
        rig.flush().await;
        let (compared, dirty) = rig.assert_oracle().await;
        assert_eq!((compared, dirty), (110, 0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_init_keeps_the_published_base_and_leaves_no_new_object() {
    use lakecdc::store::fault::{Action, Op};
    for case in [
        "second upload",
        "a reader session ends after a page",
        "manifest read at publish",
        "the lock's session ends",
        "a reader panics",
        "a stop request",
    ] {
        let mut rig = rig(LakeKind::S3).await;
        let mut r = Rng::new(77);
        rig.seed(100, &mut r).await;
        let first = init(&rig, &opts(&rig)).await;
        assert_eq!(first.schemas[0].outcome, Outcome::Exported, "{case}");
        let manifest = oracle::manifest_json(rig.store.as_ref(), MANIFEST).await;
        assert!(manifest.is_some(), "{case}: nothing published to keep");
        let before = rig.keys("data/100/").await;
        for _ in 0..40 {
            rig.writer.random_op(&mut r).await;
        }
        // Pages of 10 rows, files of 20: each reader uploads some before the fault.
        let mut o = InitOptions {
            page_rows: 10,
            max_file_rows: 20,
            ..opts(&rig)
        };
        let admin = rig.db.client().await;
        let uploads = |rig: &Rig| {
            rig.store
                .calls()
                .iter()
                .filter(|c| c.op == Op::PutFile && c.key.starts_with("data/100/"))
                .count()
        };
        let uploads_before = uploads(&rig);
        let pages = Arc::new(std::sync::atomic::AtomicU32::new(0));
        if case == "second upload" {
            rig.store
                .arm(Op::PutFile, Some("data/100/"), 2, Action::Fail);
        } else if case == "manifest read at publish" {
            // The first read is the delta-tier check; the second is the publish, which then
            // certainly did not save: every uploaded base goes.
            rig.store
                .arm(Op::GetBytes, Some("manifest/"), 2, Action::Fail);
        } else if case == "the lock's session ends" {
            // An idle-session timeout, a proxy or an operator ends the session holding the
            // schema lock mid-export: gc could then take the lock, so init must not publish.
            let (url, pages) = (rig.db.url.clone(), pages.clone());
            o.after_page = Some(Arc::new(move |_| {
                let (url, first) = (
                    url.clone(),
                    pages.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0,
                );
                async move {
                    if first {
                        let c = crate::support::harness::pg_client(&url).await;
                        let ended = c
                            .query_one(
                                "SELECT count(pg_terminate_backend(pid)) FROM pg_locks \
                                 WHERE locktype = 'advisory' AND objid = 100 AND granted \
                                 AND database = (SELECT oid FROM pg_database \
                                                 WHERE datname = current_database())",
                                &[],
                            )
                            .await
                            .unwrap()
                            .get::<_, i64>(0);
                        assert_eq!(ended, 1);
                    }
                }
                .boxed()
            }));
        } else if case == "a stop request" {
            // SIGTERM mid-export, with files already written: init publishes all or nothing,
            // so it gives up at once.
            let (stop, pages) = (rig.ctx.shutdown.clone(), pages.clone());
            o.after_page = Some(Arc::new(move |_| {
                if pages.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 8 {
                    stop.request();
                }
                async {}.boxed()
            }));
        } else if case == "a reader panics" {
            // One reader task dies without an error while the other reads and uploads on: its
            // range is unfinished, so nothing may be published (the other reader's files
            // alone would drop rows).
            let pages = pages.clone();
            o.after_page = Some(Arc::new(move |_| {
                let first = pages.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
                async move {
                    if first {
                        panic!("reader dies")
                    }
                }
                .boxed()
            }));
        } else {
            assert_eq!(case, "a reader session ends after a page");
            let url = rig.db.url.clone();
            let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
            o.after_page = Some(Arc::new(move |_| {
                let (url, fired) = (url.clone(), fired.clone());
                async move {
                    if !fired.swap(true, std::sync::atomic::Ordering::SeqCst) {
                        // The readers' sessions end mid-range. (DDL on the tables would wait
                        // for the end of the export: every reader holds its snapshot's
                        // transaction, and so its table locks, until its range is read.)
                        let c = crate::support::harness::pg_client(&url).await;
                        c.batch_execute(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                             WHERE datname = current_database() AND pid <> pg_backend_pid() \
                             AND state = 'idle in transaction' AND query LIKE 'COPY%'",
                        )
                        .await
                        .unwrap();
                    }
                }
                .boxed()
            }));
        }
        let report = init(&rig, &o).await;
        let s = &report.schemas[0];
        let expected = if case == "a stop request" {
            Outcome::Stopped
        } else {
            Outcome::Failed
        };
        assert_eq!(s.outcome, expected, "{case}: {s:?}");
        assert_eq!(report.exit_code(), 1, "{case}");
        assert_eq!(
            (s.files.len(), s.rows),
            (0, 0),
            "{case}: reports deleted files"
        );
        let reason = s.reason.as_deref().unwrap_or_default();
        if case == "a reader panics" {
            assert!(
                reason.contains("stopped before the end of their row-id range"),
                "{reason}"
            );
        }
        if case == "the lock's session ends" {
            assert!(reason.contains("lock of schema 100 was lost"), "{reason}");
        }
        if case != "a reader session ends after a page" {
            assert!(
                uploads(&rig) > uploads_before,
                "{case}: nothing was uploaded"
            );
        }
        // A stopped run reports every schema it did not export.
        if case == "a stop request" {
            let both = InitOptions {
                schemas: vec!["customer".into(), "order".into()],
                ..opts(&rig)
            };
            let report = init(&rig, &both).await;
            let outcomes: Vec<_> = report.schemas.iter().map(|s| s.outcome).collect();
            assert_eq!(outcomes, [Outcome::Stopped, Outcome::Stopped], "{case}");
            rig.ctx.shutdown = lakecdc::shutdown::Shutdown::new();
        }
        admin
            .batch_execute("ALTER TABLE IF EXISTS eav_away RENAME TO eav_data")
            .await
            .unwrap();
        assert_eq!(
            oracle::manifest_json(rig.store.as_ref(), MANIFEST).await,
            manifest,
            "{case}: a failed init changed the manifest"
        );
        assert_eq!(
            rig.keys("data/100/").await,
            before,
            "{case}: a failed init left objects behind"
        );
        // The previous base still serves its rows; a clean rerun publishes the new state.
        let report = init(&rig, &opts(&rig)).await;
        assert_eq!(report.schemas[0].outcome, Outcome::Exported, "{case}");
        let live = rig.writer.rows.values().filter(|m| !m.soft_deleted).count();
        assert_eq!(
            oracle::assert_live_rows(&rig.writer, rig.store.as_ref(), MANIFEST).await,
            live,
            "{case}"
        );
    }
}

/// Files named like a heap-order read's spill files anywhere under `dir`.
fn spill_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(spill_files(&p));
        } else if e.file_name().to_string_lossy().starts_with("heap-") {
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_heap_order_init_publishes_nothing_and_leaves_no_object_or_spill_file() {
    use lakecdc::store::fault::{Action, Op};
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
    for case in [
        "second upload",
        "a reader session ends after a range",
        "a reader panics",
        "a stop request",
    ] {
        let mut rig = rig(LakeKind::S3).await;
        let mut r = Rng::new(78);
        rig.seed(100, &mut r).await;
        let first = init(&rig, &opts(&rig)).await;
        assert_eq!(first.schemas[0].outcome, Outcome::Exported, "{case}");
        let manifest = oracle::manifest_json(rig.store.as_ref(), MANIFEST).await;
        let before = rig.keys("data/100/").await;
        for _ in 0..40 {
            rig.writer.random_op(&mut r).await;
        }
        // Statistics split the tables into ranges of a page or two, so a reader reads several.
        rig.writer.client.batch_execute("ANALYZE").await.unwrap();
        let heap = InitOptions {
            page_rows: 10,
            max_file_rows: 20,
            read_order: ReadOrder::Heap,
            ..opts(&rig)
        };
        let mut o = heap.clone();
        let calls = Arc::new(AtomicU32::new(0));
        match case {
            "second upload" => rig
                .store
                .arm(Op::PutFile, Some("data/100/"), 2, Action::Fail),
            "a reader session ends after a range" => {
                let (url, calls) = (rig.db.url.clone(), calls.clone());
                o.after_page = Some(Arc::new(move |_| {
                    let (url, first) = (url.clone(), calls.fetch_add(1, SeqCst) == 0);
                    async move {
                        if first {
                            let c = crate::support::harness::pg_client(&url).await;
                            let ended = c
                                .query_one(
                                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                                     WHERE datname = current_database() AND pid <> pg_backend_pid() \
                                     AND state = 'idle in transaction' AND query LIKE 'COPY%'",
                                    &[],
                                )
                                .await
                                .unwrap()
                                .get::<_, i64>(0);
                            assert!(ended >= 1, "no reader was idle after its range");
                        }
                    }
                    .boxed()
                }));
            }
            "a reader panics" => {
                let calls = calls.clone();
                o.after_page = Some(Arc::new(move |_| {
                    let first = calls.fetch_add(1, SeqCst) == 0;
                    async move {
                        if first {
                            panic!("reader dies")
                        }
                    }
                    .boxed()
                }));
            }
            _ => {
                assert_eq!(case, "a stop request");
                let (stop, calls) = (rig.ctx.shutdown.clone(), calls.clone());
                o.after_page = Some(Arc::new(move |_| {
                    if calls.fetch_add(1, SeqCst) == 1 {
                        stop.request();
                    }
                    async {}.boxed()
                }));
            }
        }
        let report = init(&rig, &o).await;
        let s = &report.schemas[0];
        let expected = if case == "a stop request" {
            Outcome::Stopped
        } else {
            Outcome::Failed
        };
        assert_eq!(s.outcome, expected, "{case}: {s:?}");
        assert!(s.heap_order, "{case}");
        assert_eq!((s.files.len(), s.rows), (0, 0), "{case}");
        if case == "a reader panics" {
            let reason = s.reason.as_deref().unwrap_or_default();
            assert!(reason.contains("heap range reader"), "{reason}");
        }
        if case == "second upload" {
            assert!(
                s.reason
                    .as_deref()
                    .unwrap_or_default()
                    .contains("data/100/")
            );
        }
        rig.ctx.shutdown = lakecdc::shutdown::Shutdown::new();
        assert_eq!(
            oracle::manifest_json(rig.store.as_ref(), MANIFEST).await,
            manifest,
            "{case}: a failed init changed the manifest"
        );
        assert_eq!(rig.keys("data/100/").await, before, "{case}: objects left");
        assert_eq!(
            spill_files(&rig.opts.work_dir),
            Vec::<std::path::PathBuf>::new(),
            "{case}"
        );
        // A clean rerun publishes the new state.
        let report = init(&rig, &heap).await;
        assert_eq!(report.schemas[0].outcome, Outcome::Exported, "{case}");
        let live = rig.writer.rows.values().filter(|m| !m.soft_deleted).count();
        assert_eq!(
            oracle::assert_live_rows(&rig.writer, rig.store.as_ref(), MANIFEST).await,
            live,
            "{case}"
        );
        assert!(
            report.schemas[0].files.len() >= 4,
            "{case}: {:?}",
            report.schemas[0]
        );
    }
}

#[tokio::test]
async fn a_schema_without_live_rows_publishes_a_zero_row_base() {
    for order in [ReadOrder::RowId, ReadOrder::Heap] {
        // docs/hazards.md #519
        let mut rig = rig(LakeKind::S3).await;
        let mut r = Rng::new(519);
        let ids = rig.seed(3, &mut r).await;
        for id in ids {
            rig.writer.hard_delete(id).await;
        }
        let o = InitOptions {
            read_order: order,
            ..opts(&rig)
        };
        let report = init(&rig, &o).await;
        assert_eq!(report.schemas[0].outcome, Outcome::Exported);
        assert_eq!(report.schemas[0].heap_order, order == ReadOrder::Heap);
        let m = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
            .await
            .unwrap();
        let files = m["files"].as_array().unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(
            (files[0]["tier"].as_str(), files[0]["row_count"].as_i64()),
            (Some("base"), Some(0))
        );
        assert!(matches!(
            rig.ctx
                .lake
                .layout
                .classify(files[0]["path"].as_str().unwrap()),
            KeyKind::MergedBase { .. }
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_concurrent_writer_during_init_is_caught_up_by_flush() {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(99);
    rig.seed(100, &mut r).await;
    let writer = rig.second_writer().await;
    let w2 = writer.clone();
    let mut o = opts(&rig);
    o.after_page = Some(Arc::new(move |_| {
        let w = w2.clone();
        async move {
            let mut w = w.lock().await;
            let mut r = Rng::new(w.rows.len() as u64);
            for _ in 0..8 {
                w.random_op(&mut r).await;
            }
        }
        .boxed()
    }));
    init(&rig, &o).await;
    rig.take_model(&writer).await;
    rig.flush().await;
    let (_, dirty) = rig.assert_oracle().await;
    assert_eq!(dirty, 0);
    let live = rig.writer.rows.values().filter(|m| !m.soft_deleted).count();
    assert_eq!(
        oracle::lake_state(rig.store.as_ref(), MANIFEST).await.len(),
        live
    );
}

#[tokio::test]
async fn a_locked_schema_is_reported_while_the_other_is_exported() {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(3);
    rig.seed(10, &mut r).await;
    let held = lakecdc::source::SchemaLock::try_acquire(&rig.ctx.connector, 100)
        .await
        .unwrap()
        .unwrap();
    let report = init(
        &rig,
        &InitOptions {
            schemas: vec![],
            ..opts(&rig)
        },
    )
    .await;
    let outcomes: Vec<(i16, Outcome)> = report
        .schemas
        .iter()
        .map(|s| (s.schema_id, s.outcome))
        .collect();
    assert_eq!(outcomes, [(100, Outcome::Locked), (101, Outcome::Exported)]);
    assert_eq!(report.exit_code(), 3);
    held.release().await.unwrap();
    assert!(
        oracle::manifest_json(rig.store.as_ref(), MANIFEST)
            .await
            .is_none()
    );
    assert!(
        oracle::manifest_json(rig.store.as_ref(), "manifest/101.json")
            .await
            .is_some()
    );
}

#[tokio::test]
async fn a_delta_tier_is_refused_unless_replaced() {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(371);
    rig.seed(50, &mut r).await;
    rig.flush().await;
    let deltas = rig.listed().await;
    let report = init(&rig, &opts(&rig)).await;
    assert_eq!(report.schemas[0].outcome, Outcome::Refused);
    assert!(
        report.schemas[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("--replace-delta")
    );
    assert_eq!(report.exit_code(), 1);
    assert_eq!(rig.listed().await, deltas, "nothing published");
    let report = init(
        &rig,
        &InitOptions {
            replace_delta: true,
            ..opts(&rig)
        },
    )
    .await;
    let s = &report.schemas[0];
    assert_eq!(
        (s.outcome, s.replaced_deltas),
        (Outcome::Exported, deltas.len())
    );
    let m = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
        .await
        .unwrap();
    assert!(
        m["files"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["tier"] == "base")
    );
    // The replaced deltas are retired, not deleted: a reader of the previous manifest may
    // still be reading them. gc deletes them once past its grace.
    assert_kept_and_retired(&rig, &deltas, "deleted at once").await;
    assert_eq!(rig.assert_oracle().await, (50, 0));
    let (clock, gctx, gopts) = rig.gc_on_a_manual_clock();
    let report = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    let set = |v: &[String]| v.iter().cloned().collect::<BTreeSet<_>>();
    assert_eq!(
        set(&report.schemas[0].within_grace),
        set(&deltas),
        "kept within the grace"
    );
    clock.advance(16 * 60_000);
    let report = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    assert_eq!(
        set(&report.schemas[0].deleted),
        set(&deltas),
        "deleted past the grace"
    );
    for d in &deltas {
        assert!(rig.store.head(d).await.unwrap_err().is_not_found(), "{d}");
    }
    assert_eq!(rig.assert_oracle().await, (50, 0));
}

#[tokio::test]
async fn an_ambiguous_publish_deletes_no_delta_and_retires_them_with_the_save() {
    // The manifest save of `init --replace-delta` reaches the store but reports a failure:
    // init cannot know it committed, so it must delete no delta (they may still be listed);
    // the save itself records them as retired, so gc removes them if it did commit.
    use lakecdc::store::fault::{Action, Op};
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(252);
    rig.seed(50, &mut r).await;
    rig.flush().await;
    let deltas = rig.listed().await;
    assert!(!deltas.is_empty());
    rig.store
        .arm(Op::PutBytes, Some("manifest/"), 1, Action::FailAfter);
    let o = InitOptions {
        replace_delta: true,
        ..opts(&rig)
    };
    let report = init(&rig, &o).await;
    let s = &report.schemas[0];
    assert_eq!(
        (s.outcome, s.replaced_deltas),
        (Outcome::Failed, 0),
        "{s:?}"
    );
    assert_kept_and_retired(&rig, &deltas, "deleted after an ambiguous save").await;
    // The save did land: the lake is whole from the new bases alone.
    assert_eq!(rig.assert_oracle().await, (50, 0));
}

#[tokio::test]
async fn replace_delta_replaces_only_the_deltas_it_inventoried() {
    // A delta committed while init runs (only possible for a flush whose lock was lost) is
    // newer than init's reads: `--replace-delta` must neither drop it from the manifest nor
    // delete it.
    use lakecdc::lake::manifest;
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(413);
    rig.seed(50, &mut r).await;
    rig.flush().await;
    let deltas = rig.listed().await;
    let late = rig.ctx.lake.layout.delta_key(100, uuid::Uuid::now_v7());
    let (store, late2, source) = (rig.store.clone(), late.clone(), deltas[0].clone());
    let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let o = InitOptions {
        replace_delta: true,
        after_page: Some(Arc::new(move |_| {
            let (store, late, source, fired) =
                (store.clone(), late2.clone(), source.clone(), fired.clone());
            async move {
                if fired.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                store.copy(&source, &late).await.unwrap();
                let clock = lakecdc::clock::SystemClock;
                manifest::commit(
                    store.as_ref(),
                    MANIFEST,
                    100,
                    &clock,
                    Default::default(),
                    |m| {
                        let mut entry = m.files.iter().find(|f| f.path == source).unwrap().clone();
                        entry.path = late.clone();
                        m.files.push(entry);
                        Ok(())
                    },
                )
                .await
                .unwrap();
            }
            .boxed()
        })),
        ..opts(&rig)
    };
    let report = init(&rig, &o).await;
    let s = &report.schemas[0];
    assert_eq!(
        (s.outcome, s.replaced_deltas),
        (Outcome::Exported, deltas.len()),
        "{s:?}"
    );
    let m = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
        .await
        .unwrap();
    let listed_deltas: Vec<&str> = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["tier"] == "delta")
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        listed_deltas,
        [late.as_str()],
        "only the late delta stays listed"
    );
    rig.store.head(&late).await.unwrap();
    // Only the replaced deltas are retired (a retired late delta would go to gc); they stay
    // in the store until gc's grace has passed.
    assert_eq!(
        oracle::retired_paths(rig.store.as_ref(), MANIFEST).await,
        deltas.iter().cloned().collect()
    );
}

#[tokio::test]
async fn a_heap_order_init_reads_no_change_log() {
    // docs/design.md §4.2: init reads the entity and EAV tables only; the heap-order read's
    // catalog query also sizes change_log for a flush pass, and must not need the table.
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(7);
    rig.seed(30, &mut r).await;
    let c = &rig.writer.client;
    c.batch_execute("ANALYZE; ALTER TABLE change_log RENAME TO change_log_away")
        .await
        .unwrap();
    let heap = InitOptions {
        read_order: ReadOrder::Heap,
        ..opts(&rig)
    };
    let report = init(&rig, &heap).await;
    c.batch_execute("ALTER TABLE change_log_away RENAME TO change_log")
        .await
        .unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, Outcome::Exported, "{s:?}");
    assert!(s.heap_order, "{s:?}");
    assert_eq!(s.live_rows, 30, "{s:?}");
}

#[tokio::test]
async fn dry_run_counts_and_estimates_without_writing() {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(1);
    rig.seed(30, &mut r).await;
    let report = init(
        &rig,
        &InitOptions {
            dry_run: true,
            ..opts(&rig)
        },
    )
    .await;
    let s = &report.schemas[0];
    // Two readers, each range its own file (docs/hazards.md L103).
    assert_eq!((s.live_rows, s.estimated_files), (30, 2));
    assert!(s.bytes > 0);
    assert!(!s.heap_order, "no statistics: row-id order");
    // The plan says a heap-order read, and its buckets, as the run would.
    let report = init(
        &rig,
        &InitOptions {
            dry_run: true,
            read_order: ReadOrder::Heap,
            max_file_rows: 10,
            ..opts(&rig)
        },
    )
    .await;
    let s = &report.schemas[0];
    assert!(s.heap_order);
    assert_eq!((s.live_rows, s.estimated_files), (30, 3));
    assert!(s.scratch_bytes > 0, "{s:?}");
    let text = report.to_text();
    assert!(
        text.contains("read in heap order into row-id buckets; about "),
        "{text}"
    );
    assert!(rig.store.writes().is_empty());
    // The plan's files are the run's, and --max-file-rows holds even below a page's rows.
    for max_file_rows in [60, 7] {
        let o = InitOptions {
            max_file_rows,
            replace_delta: true,
            ..opts(&rig)
        };
        let plan = init(
            &rig,
            &InitOptions {
                dry_run: true,
                ..o.clone()
            },
        )
        .await;
        let run = init(&rig, &o).await;
        let files = &run.schemas[0].files;
        assert_eq!(
            plan.schemas[0].estimated_files,
            files.len() as u64,
            "{run:?}"
        );
        assert_eq!(files.iter().map(|f| f.rows).sum::<u64>(), 30);
        assert!(files.iter().all(|f| f.rows <= max_file_rows), "{files:?}");
    }
}

#[tokio::test]
async fn a_heap_order_read_asked_for_without_room_for_its_spill_is_refused_before_reading() {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(2);
    rig.seed(30, &mut r).await;
    let no_room: lakecdc::job::FreeSpace = |_| Ok(1);
    let report = lakecdc::init::run(
        &rig.ctx,
        &InitOptions {
            read_order: ReadOrder::Heap,
            free_space: Some(no_room),
            ..opts(&rig)
        },
    )
    .await;
    let text = match report {
        Ok(r) => format!("{:?}", r.schemas[0]),
        Err(e) => e.to_string(),
    };
    assert!(
        text.contains("heap-order read") && text.contains("--read-order row-id"),
        "{text}"
    );
    assert!(rig.store.writes().is_empty(), "nothing was written");
}

#[tokio::test]
async fn rows_joined_in_rust_give_the_same_base_as_the_pivot_query() {
    // docs/hazards.md #210: a base written from rows joined by `assemble` (what `export` does) is
    // the file the export query writes from the same pages — columns, types, values, order.
    use lakecdc::engine::Driver;
    use lakecdc::engine::assemble;
    use lakecdc::engine::export::Inputs;
    use lakecdc::engine::{Engine, EngineConfig};
    use lakecdc::schema::ValueType;
    use lakecdc::source::live;

    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(2100);
    rig.seed(60, &mut r).await;
    for _ in 0..200 {
        rig.writer.random_op(&mut r).await;
    }
    let mut full =
        lakecdc::schema::dir::load(&crate::support::harness::examples_dir(), "customer").unwrap();
    // Lists of every item type, with values: items at indices 10, 2 and -1 (numeric, not text,
    // order) next to an empty-list marker, an explicit empty list, an absent one, and a uuid
    // item that does not parse.
    let item_types = [
        ValueType::Integer,
        ValueType::Bigint,
        ValueType::Bool,
        ValueType::Uuid,
        ValueType::Numeric,
        ValueType::Date,
        ValueType::Text,
    ];
    let with_lists: Vec<uuid::Uuid> = rig
        .writer
        .rows
        .iter()
        .filter(|(_, m)| !m.soft_deleted)
        .map(|(id, _)| *id)
        .take(6)
        .collect();
    for (n, items) in item_types.into_iter().enumerate() {
        let id = 90 + n as i16;
        full.attributes.push(lakecdc::schema::Attribute {
            name: format!("list{id}"),
            id,
            value_type: ValueType::List,
            items_type: Some(items),
            binding: None,
            column: format!("list{id}"),
        });
        for (k, row) in with_lists.iter().enumerate() {
            let rows: Vec<(String, Option<String>, Option<f64>)> = match k {
                0 => vec![(String::new(), None, None)],
                1 => vec![],
                _ => ["10", "2", "-1", ""]
                    .iter()
                    .enumerate()
                    .map(|(j, i)| {
                        if i.is_empty() {
                            // The empty-list marker next to items: the items win.
                            return (String::new(), None, None);
                        }
                        let v = (k * 10 + j) as f64;
                        let text = if items == ValueType::Uuid && j == 1 {
                            "not a uuid".to_string()
                        } else if items == ValueType::Uuid {
                            uuid::Uuid::from_u128((k * 10 + j) as u128).to_string()
                        } else {
                            format!("item {k}.{j}")
                        };
                        let num = if items == ValueType::Bool {
                            (j % 2) as f64
                        } else {
                            v * 1.5
                        };
                        (i.to_string(), Some(text), Some(num))
                    })
                    .collect(),
            };
            for (idx, text, num) in rows {
                rig.writer
                    .client
                    .execute(
                        "INSERT INTO eav_data (schema_id, row_id, attr_id, array_indices, value_text, value_numeric) VALUES (100, $1, $2, $3, $4, $5)",
                        &[row, &id, &idx, &text, &num],
                    )
                    .await
                    .unwrap();
            }
        }
    }
    full.attributes.sort_by(|a, b| a.name.cmp(&b.name));
    let mut scalar = full.clone();
    scalar
        .attributes
        .retain(|a| a.value_type != ValueType::List);
    let eav_types: BTreeSet<String> = scalar
        .attributes
        .iter()
        .filter(|a| a.binding.is_none())
        .map(|a| format!("{:?}", a.value_type))
        .collect();
    assert!(
        eav_types.len() >= 4,
        "EAV scalars of many types: {eav_types:?}"
    );

    // Pages of two readers, seven rows each, handed over in an order that is not row order.
    // They are read twice: through the connection's COPY tap (TLS), and as tokio-postgres's
    // messages (no tap); both must give the same batches.
    let tables = rig.ctx.tables.clone();
    let mut tapped = rig.ctx.connector.connect_tapped().await.unwrap();
    let tap = tapped.tap.clone();
    let mut plain = crate::support::harness::untapped(&rig.ctx.connector).await;
    let mut pages = Vec::new();
    let mut untapped = Vec::new();
    for range in live::live_ranges(&plain.client, &tables, 100, 2)
        .await
        .unwrap()
    {
        for (conn, pages) in [(&mut tapped, &mut pages), (&mut plain, &mut untapped)] {
            let snapshot = live::ExportedSnapshot::export(&rig.ctx.connector)
                .await
                .unwrap();
            live::read_range(
                conn,
                snapshot.ticket(),
                &tables,
                &full,
                100,
                range,
                7,
                |p| {
                    pages.push(p);
                    async { true }
                },
            )
            .await
            .unwrap();
            snapshot.release().await.unwrap();
        }
    }
    assert!(pages.len() >= 6, "{} pages", pages.len());
    assert!(
        tap.diverted() as usize > pages.iter().map(|p| p.entities.num_rows()).sum::<usize>(),
        "the TLS connection's COPY data went through its tap ({} messages)",
        tap.diverted()
    );
    assert_eq!(pages.len(), untapped.len());
    // The EAV read has no ORDER BY (the join in Rust does not need one): its rows may come in
    // another order on another connection (a synchronized scan, another plan), so they are
    // compared as a multiset.
    let eav_rows = |b: &arrow::record_batch::RecordBatch| {
        let options = arrow::util::display::FormatOptions::default();
        let cols: Vec<_> = b
            .columns()
            .iter()
            .map(|c| arrow::util::display::ArrayFormatter::try_new(c.as_ref(), &options).unwrap())
            .collect();
        let mut rows: Vec<String> = (0..b.num_rows())
            .map(|i| {
                cols.iter()
                    .map(|c| c.value(i).to_string())
                    .collect::<Vec<_>>()
                    .join("|")
            })
            .collect();
        rows.sort();
        (b.schema(), rows)
    };
    for (a, b) in pages.iter().zip(&untapped) {
        assert_eq!(a.entities, b.entities);
        assert_eq!(eav_rows(&a.eav), eav_rows(&b.eav));
        assert!(a.entities.num_rows() > 0);
    }
    pages.reverse();
    let entities: Vec<_> = pages.iter().map(|p| p.entities.clone()).collect();
    let eav: Vec<_> = pages.iter().map(|p| p.eav.clone()).collect();

    let engine = Engine::open(&EngineConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (by_query, by_rust) = (dir.path().join("q.parquet"), dir.path().join("r.parquet"));
    let inputs = Inputs {
        change_log: &[],
        entities: &entities,
        eav: &eav,
    };
    let live = rig.writer.rows.values().filter(|m| !m.soft_deleted).count();
    for def in [&scalar, &full] {
        // Each export writes a new file (mode 0600, never over an existing one).
        for p in [&by_query, &by_rust] {
            let _ = std::fs::remove_file(p);
        }
        assert!(
            assemble::assemble(def, &entities, &eav).unwrap().is_some(),
            "export joins these pages in Rust"
        );
        let n = engine
            .export_pivoted(def, 100, Driver::Entities, inputs, &by_query)
            .unwrap();
        let m = engine
            .export(def, 100, Driver::Entities, inputs, &by_rust)
            .unwrap();
        assert_eq!((n as usize, m as usize), (live, live));
        oracle::assert_same_file(&by_query, &by_rust);
    }
    for column in ["tags", "list90", "list93", "list96"] {
        let lists = oracle::list_shapes(&by_query, column);
        assert_eq!(
            lists, [true; 3],
            "{column}: NULL, [] and several items: {lists:?}"
        );
    }

    // Two rows of one scalar attribute, list indices that are not plain integers or that
    // repeat, or overlapping pages: only the query's pivot is right, so the join declines.
    for rename in [|i: &str| format!("0{i}"), |_: &str| "0".to_string()] {
        let odd: Vec<_> = eav.iter().map(|e| oracle::map_indices(e, rename)).collect();
        assert!(
            assemble::assemble(&full, &entities, &odd)
                .unwrap()
                .is_none()
        );
    }
    let mut twice = eav.clone();
    let with_eav = twice
        .iter()
        .position(|e| e.num_rows() > 0)
        .expect("a page with EAV rows");
    let eav_rows = twice[with_eav].clone();
    twice[with_eav] =
        arrow::compute::concat_batches(&eav_rows.schema(), [&eav_rows, &eav_rows]).unwrap();
    // (With scalars only: doubled list items would decline on their own.)
    assert!(
        assemble::assemble(&scalar, &entities, &twice)
            .unwrap()
            .is_none()
    );
    let (mut overlapping, mut overlapping_eav) = (entities.clone(), eav.clone());
    overlapping.push(entities[0].clone());
    overlapping_eav.push(eav[0].clone());
    assert!(
        assemble::assemble(&full, &overlapping, &overlapping_eav)
            .unwrap()
            .is_none()
    );
}

/// The rows a writer's model holds live, with their versions.
fn live_versions(w: &Writer) -> std::collections::BTreeMap<uuid::Uuid, i64> {
    w.rows
        .iter()
        .filter(|(_, m)| !m.soft_deleted)
        .map(|(id, m)| (*id, m.version))
        .collect()
}

/// Runs init (`order`) with three readers and pages of 10 rows; after the first page (or heap
/// range) any reader hands over, `during` runs once on a second writer session. Returns the live rows and versions
/// just before `during` ran, the shared writer, and the report.
async fn init_with_writes_during_export(
    rig: &Rig,
    order: ReadOrder,
    during: impl Fn(Arc<tokio::sync::Mutex<Writer>>) -> futures::future::BoxFuture<'static, ()>
    + Send
    + Sync
    + 'static,
) -> (
    std::collections::BTreeMap<uuid::Uuid, i64>,
    Arc<tokio::sync::Mutex<Writer>>,
    lakecdc::init::InitReport,
) {
    let writer = rig.second_writer().await;
    let before = live_versions(&rig.writer);
    let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Every reader waits at its next page for the writes to end: readers share their ranges,
    // and the others would otherwise read all that is left while the first one writes.
    let done = Arc::new(tokio::sync::OnceCell::new());
    let (w2, f2, during) = (writer.clone(), fired.clone(), Arc::new(during));
    let mut o = InitOptions {
        readers: 3,
        page_rows: 10,
        max_file_rows: 40,
        read_order: order,
        ..opts(rig)
    };
    let reads_after = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let after = reads_after.clone();
    o.after_page = Some(Arc::new(move |_| {
        let (w, f, during) = (w2.clone(), f2.clone(), during.clone());
        let (done, after) = (done.clone(), after.clone());
        async move {
            if f.swap(true, std::sync::atomic::Ordering::SeqCst) && done.initialized() {
                after.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            done.get_or_init(|| during(w)).await;
        }
        .boxed()
    }));
    let report = init(rig, &o).await;
    assert!(
        reads_after.load(std::sync::atomic::Ordering::SeqCst) > 0,
        "pages were read after the writes"
    );
    assert!(
        fired.load(std::sync::atomic::Ordering::SeqCst),
        "the writes ran during the export"
    );
    assert_eq!(report.schemas[0].outcome, Outcome::Exported);
    (before, writer, report)
}

/// The lake's live rows and their versions (`changed_at`).
async fn lake_versions(rig: &Rig) -> std::collections::BTreeMap<uuid::Uuid, i64> {
    oracle::lake_state(rig.store.as_ref(), MANIFEST)
        .await
        .into_iter()
        .filter(|(_, r)| r.deleted_at == 0)
        .map(|(id, r)| (id, r.changed_at))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn init_over_random_ids_exports_its_snapshot_while_rows_are_deleted_and_inserted() {
    for order in [ReadOrder::RowId, ReadOrder::Heap] {
        // docs/hazards.md #462 (made moot by the single snapshot) and #210
        let mut rig = rig(LakeKind::S3).await;
        let mut r = Rng::new(2001);
        // Random (UUIDv4-like) ids, inserted in random order.
        let ids = rig.seed(240, &mut r).await;
        assert!(
            ids.windows(2).filter(|w| w[0] > w[1]).count() > 60,
            "the ids are not in insertion order"
        );
        // Statistics give a heap-order read ranges of a page or two: the readers take turns.
        rig.writer.client.batch_execute("ANALYZE").await.unwrap();
        let (before, writer, report) = init_with_writes_during_export(&rig, order, |w| {
            async move {
                let mut w = w.lock().await;
                let mut r = Rng::new(77);
                let live: Vec<_> = live_versions(&w).into_keys().collect();
                // Deletes all over the id space (most of them in pages not read yet), hard and
                // soft, and inserts and updates.
                for (i, id) in live.iter().enumerate() {
                    if i % 8 == 0 {
                        w.hard_delete(*id).await;
                    } else if i % 11 == 3 {
                        w.soft_delete(*id).await;
                    } else if i % 13 == 5 {
                        w.update(*id, Customer::random(&mut r)).await;
                    }
                }
                for _ in 0..25 {
                    w.create(r.uuid(), Customer::random(&mut r)).await;
                }
            }
            .boxed()
        })
        .await;
        assert_eq!(report.schemas[0].heap_order, order == ReadOrder::Heap);
        // The lake holds exactly the state of the snapshot: no row deleted during the export is
        // missing, no row inserted during it is there, every version is the snapshot's.
        assert_eq!(lake_versions(&rig).await, before);
        assert_eq!(report.schemas[0].rows, before.len() as u64);
        // Then flush brings the writes made during the export.
        rig.take_model(&writer).await;
        assert_ne!(
            live_versions(&rig.writer),
            before,
            "the writes changed the source"
        );
        rig.flush().await;
        let (compared, dirty) = rig.assert_oracle().await;
        assert_eq!(dirty, 0);
        assert_eq!(compared, live_versions(&rig.writer).len());
        assert_eq!(lake_versions(&rig).await, live_versions(&rig.writer));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_init_reader_reads_the_same_exported_snapshot() {
    for order in [ReadOrder::RowId, ReadOrder::Heap] {
        let mut rig = rig(LakeKind::Local).await;
        let mut r = Rng::new(2002);
        rig.seed(180, &mut r).await;
        // Statistics give a heap-order read ranges of a page or two: the readers take turns.
        rig.writer.client.batch_execute("ANALYZE").await.unwrap();
        // After the first page any reader hands over, every live row gets a new version and some
        // go: the other readers have not started most of their ranges yet. Read in snapshots of
        // their own, they would export the new versions there.
        let (before, _writer, report) = init_with_writes_during_export(&rig, order, |w| {
            async move {
                let mut w = w.lock().await;
                let mut r = Rng::new(78);
                let live: Vec<_> = live_versions(&w).into_keys().collect();
                for (i, id) in live.iter().enumerate() {
                    if i % 10 == 0 {
                        w.hard_delete(*id).await;
                    } else {
                        w.update(*id, Customer::random(&mut r)).await;
                    }
                }
            }
            .boxed()
        })
        .await;
        assert!(
            report.schemas[0].files.len() >= 3,
            "the readers wrote several files: {:?}",
            report.schemas[0].files
        );
        assert_eq!(report.schemas[0].heap_order, order == ReadOrder::Heap);
        assert_eq!(lake_versions(&rig).await, before);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_idle_in_transaction_limit_does_not_end_a_waiting_reader() {
    // A reader holds its snapshot's transaction for its whole range and waits, idle, while the
    // files before its pages are written (here: a slow page hook).
    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(2003);
    rig.seed(60, &mut r).await;
    let db = rig.db.url.rsplit_once('/').unwrap().1.to_string();
    rig.writer
        .client
        .batch_execute(&format!(
            "ALTER DATABASE {db} SET idle_in_transaction_session_timeout = '300ms'"
        ))
        .await
        .unwrap();
    let mut o = InitOptions {
        page_rows: 10,
        ..opts(&rig)
    };
    o.after_page = Some(Arc::new(|_| {
        tokio::time::sleep(std::time::Duration::from_millis(700)).boxed()
    }));
    let report = init(&rig, &o).await;
    rig.writer
        .client
        .batch_execute(&format!(
            "ALTER DATABASE {db} RESET idle_in_transaction_session_timeout"
        ))
        .await
        .unwrap();
    assert_eq!(report.schemas[0].outcome, Outcome::Exported, "{report:?}");
    assert_eq!(lake_versions(&rig).await, live_versions(&rig.writer));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_compaction_folding_the_inventoried_deltas_during_init_stops_its_publish() {
    // docs/hazards.md L71: a compaction (no lock) loads {base, d1, d2}, a flush then lists d3
    // with a tombstone of R, init --replace-delta inventories {d1, d2, d3} and reads, and the
    // compaction saves {base, C, d3}, C holding R's older live copy. Had init replaced its
    // inventory and kept C, R would be live again for good.
    use lakecdc::compact::CompactOptions;
    use tokio::sync::Notify;
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(71);
    let ids = rig.seed(60, &mut r).await;
    rig.flush().await;
    let first = InitOptions {
        replace_delta: true,
        ..opts(&rig)
    };
    assert_eq!(
        init(&rig, &first).await.schemas[0].outcome,
        Outcome::Exported
    );
    let victim = ids[7];
    rig.writer.update(victim, Customer::random(&mut r)).await;
    rig.flush().await;
    rig.writer.update(ids[8], Customer::random(&mut r)).await;
    rig.flush().await;

    let (entered, go, done) = (
        Arc::new(Notify::new()),
        Arc::new(Notify::new()),
        Arc::new(Notify::new()),
    );
    let hook: lakecdc::compact::Hook = {
        let (entered, go) = (entered.clone(), go.clone());
        Arc::new(move |_| {
            let (entered, go) = (entered.clone(), go.clone());
            async move {
                entered.notify_one();
                go.notified().await;
            }
            .boxed()
        })
    };
    let consolidate = CompactOptions {
        dirty_ratio: 1.0,
        max_deltas: 1,
        ..crate::compact::opts(&rig)
    };
    let ctx = rig.job_context();
    let compaction = {
        let done = done.clone();
        tokio::spawn(async move {
            let report = lakecdc::compact::run_with_hook(&ctx, &consolidate, Some(hook))
                .await
                .unwrap();
            done.notify_one();
            report
        })
    };
    entered.notified().await;
    rig.writer.hard_delete(victim).await;
    rig.flush().await;

    let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut o = InitOptions {
        replace_delta: true,
        ..opts(&rig)
    };
    o.after_page = Some(Arc::new(move |_| {
        let (go, done, fired) = (go.clone(), done.clone(), fired.clone());
        async move {
            if !fired.swap(true, std::sync::atomic::Ordering::SeqCst) {
                go.notify_one();
                done.notified().await;
            }
        }
        .boxed()
    }));
    let refused = init(&rig, &o).await;
    let c = compaction.await.unwrap();
    let plan = c.schemas[0].plan.as_ref().unwrap();
    assert_eq!(
        (c.schemas[0].outcome, plan.decision),
        (
            lakecdc::compact::Outcome::Done,
            lakecdc::compact::Decision::Consolidate
        ),
        "{c:?}"
    );
    let s = &refused.schemas[0];
    assert_eq!(s.outcome, Outcome::Failed, "{s:?}");
    let reason = s.reason.as_deref().unwrap();
    assert!(
        reason.contains("a compaction merged the deltas this init inventoried")
            && reason.contains("pause compaction of this schema while init runs"),
        "{reason}"
    );
    // Nothing of the refused init is listed or left; the tombstone still hides R.
    let lake = oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
    assert!(!lake.contains_key(&victim));
    assert_eq!(rig.assert_oracle().await, (59, 0));
    let mut known: BTreeSet<String> = rig.listed().await.into_iter().collect();
    known.extend(oracle::retired_paths(rig.store.as_ref(), MANIFEST).await);
    let left: Vec<String> = rig
        .keys("data/100/")
        .await
        .into_iter()
        .filter(|k| !known.contains(k) && !k.ends_with("_owner.json"))
        .collect();
    assert!(left.is_empty(), "left by the refused init: {left:?}");
    // The next run inventories the consolidated delta and replaces it.
    let again = init(&rig, &o).await;
    assert_eq!(again.schemas[0].outcome, Outcome::Exported, "{again:?}");
    let m = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
        .await
        .unwrap();
    let tiers: BTreeSet<&str> = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["tier"].as_str().unwrap())
        .collect();
    assert_eq!(tiers, BTreeSet::from(["base"]), "{m:#}");
    assert_eq!(rig.assert_oracle().await, (59, 0));
}
