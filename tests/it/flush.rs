//! `lakecdc flush` against real PostgreSQL and SeaweedFS (and the local lake): the oracle under
//! a random workload, every hazard of docs/hazards.md that applies to flush, the fault matrix, and
//! concurrency.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::time::Duration;

use futures::FutureExt;
use lakecdc::clock::SystemClock;
use lakecdc::flush::{FlushHooks, FlushOptions, FlushReport, Outcome, ReadOrder};
use lakecdc::lake::KeyKind;
use lakecdc::store::ObjectStore;
use lakecdc::store::fault::{Action, Op};
use lakecdc::store::local::LocalStore;
use uuid::Uuid;

use crate::support::harness;
use crate::support::oracle;
use crate::support::rig::{LakeKind, Rig, rig};
use crate::support::writer::{Customer, Rng, Writer};

const CUSTOMER: i16 = 100;
const MANIFEST: &str = "manifest/100.json";

fn only(report: &FlushReport) -> &lakecdc::flush::SchemaReport {
    assert_eq!(report.schemas.len(), 1, "{report:?}");
    &report.schemas[0]
}

async fn random_workload_holds_the_oracle(kind: LakeKind, seed: u64, rounds: usize, ops: usize) {
    random_workload_holds_the_oracle_read(kind, seed, rounds, ops, ReadOrder::Auto).await;
}

async fn random_workload_holds_the_oracle_read(
    kind: LakeKind,
    seed: u64,
    rounds: usize,
    ops: usize,
    order: ReadOrder,
) {
    let mut rig = rig(kind).await;
    rig.opts.read_order = order;
    let mut r = Rng::new(seed);
    let mut total_compared = 0;
    for round in 0..rounds {
        let mut seen = BTreeMap::new();
        for _ in 0..ops {
            *seen.entry(rig.writer.random_op(&mut r).await).or_insert(0) += 1;
        }
        let report = rig.flush().await;
        let s = only(&report);
        assert_eq!(s.outcome, Outcome::Flushed, "round {round}: {s:?}");
        assert_eq!(s.rows_left_dirty, 0, "{s:?}");
        // A heap pass reads every dirty slot (the backlog is below a pass's bound); auto
        // reads these small tables by windows.
        let heap = order == ReadOrder::Heap;
        assert_eq!(s.table_scans, u32::from(heap), "{s:?}");
        assert_eq!(
            s.rows_by_scan,
            if heap { s.rows_exported } else { 0 },
            "{s:?}"
        );
        let (compared, dirty) = rig.assert_oracle().await;
        assert_eq!(
            dirty, 0,
            "seed {seed} round {round}: nothing may stay dirty without concurrent writes"
        );
        let live = rig.writer.rows.values().filter(|m| !m.soft_deleted).count();
        assert_eq!(compared, live, "seed {seed} round {round} ({seen:?})");
        total_compared += compared;
    }
    assert!(total_compared > 0);
    // Every delta key classifies as a delta, and nothing is left in _tmp/.
    let layout = &rig.ctx.lake.layout;
    for key in rig.listed().await {
        assert!(
            matches!(
                layout.classify(&key),
                KeyKind::Delta {
                    schema_id: CUSTOMER,
                    ..
                }
            ),
            "{key}"
        );
    }
    assert!(rig.keys("data/100/_tmp/").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oracle_holds_under_a_random_workload_on_s3() {
    for seed in [1, 2] {
        random_workload_holds_the_oracle(LakeKind::S3, seed, 4, 80).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oracle_holds_when_backlogs_are_read_in_heap_passes() {
    // docs/design.md §4.1, "Heap passes": creates, updates, soft and hard deletes, read by one
    // scan of both tables per run.
    for seed in [4, 5] {
        random_workload_holds_the_oracle_read(LakeKind::S3, seed, 4, 80, ReadOrder::Heap).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oracle_holds_under_a_random_workload_on_a_local_lake() {
    random_workload_holds_the_oracle(LakeKind::Local, 3, 3, 80).await;
}

/// The one request an idle run makes: a byte of the first schema's manifest, proving the lake
/// is there (docs/hazards.md L104).
fn only_the_probe(rig: &Rig, since: usize) {
    let calls = &rig.store.calls()[since..];
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        (calls[0].op, calls[0].key.as_str()),
        (Op::GetRange, "manifest/100.json")
    );
}

#[tokio::test]
async fn an_idle_run_makes_one_read_of_the_lake() {
    let rig = rig(LakeKind::S3).await;
    let report = rig.flush().await;
    assert!(report.schemas.is_empty(), "{report:?}");
    only_the_probe(&rig, 0);
    // Dirty rows below the threshold: still that one read.
    let mut rig = rig;
    let mut r = Rng::new(9);
    rig.seed(3, &mut r).await;
    rig.opts.force = false;
    let calls = rig.store.calls().len();
    let report = rig.flush().await;
    let s = only(&report);
    assert_eq!(s.outcome, Outcome::BelowThreshold);
    assert!(
        s.reason.as_deref().unwrap().contains("--min-records 20000"),
        "{s:?}"
    );
    only_the_probe(&rig, calls);
}

#[tokio::test]
async fn the_dirty_index_holds_the_dirty_slots_alone_after_a_flush() {
    // docs/hazards.md L70: the mark's new version of a slot gets no entry in the index
    // init-db creates, so the index is the size of the backlog, not of change_log.
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(72);
    let ids = rig.seed(20, &mut r).await;
    assert_eq!(only(&rig.flush().await).rows_marked, 20);
    for id in &ids[..3] {
        rig.writer.update(*id, Customer::random(&mut r)).await;
    }
    let client = &rig.writer.client;
    client.batch_execute("VACUUM change_log").await.unwrap();
    let count = |sql: &'static str| async move {
        client.query_one(sql, &[]).await.unwrap().get::<_, f32>(0) as i64
    };
    assert_eq!(
        count("SELECT reltuples FROM pg_class WHERE relname = 'change_log'").await,
        23
    );
    assert_eq!(
        count("SELECT reltuples FROM pg_class WHERE relname = 'change_log_dirty_idx'").await,
        3
    );
    // The selection can still use it (a table this small would be scanned otherwise).
    client
        .batch_execute("SET enable_seqscan = off")
        .await
        .unwrap();
    let plan: Vec<String> = client
        .query(
            "EXPLAIN SELECT row_id FROM change_log WHERE schema_id = 100 AND flushed_at = 0 \
             ORDER BY changed_at",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    client.batch_execute("RESET enable_seqscan").await.unwrap();
    assert!(plan.join("\n").contains("change_log_dirty_idx"), "{plan:?}");
    assert_eq!(only(&rig.flush().await).rows_marked, 3);
    assert_eq!(rig.assert_oracle().await, (20, 0));
}

#[tokio::test]
async fn hard_delete_exports_a_tombstone() {
    // docs/hazards.md #173
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(173);
    let ids = rig.seed(3, &mut r).await;
    rig.flush().await;
    let stamp = rig.writer.hard_delete(ids[1]).await;
    let report = rig.flush().await;
    let file = &only(&report).files[0];
    let bytes = rig.store.get_bytes(&file.path).await.unwrap().bytes;
    let rows = oracle::read_parquet(bytes);
    assert_eq!(rows.len(), 1);
    let (id, row) = &rows[0];
    assert_eq!(*id, ids[1]);
    assert_eq!((row.changed_at, row.deleted_at), (stamp, stamp));
    assert_eq!(row.columns["ltbase_created_at"], oracle::V::Null);
    assert_eq!(row.columns["name"], oracle::V::Null);
    let lake = oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
    assert!(!lake.contains_key(&ids[1]) && lake.contains_key(&ids[0]));
    assert_eq!(rig.assert_oracle().await, (2, 0));
}

#[tokio::test]
async fn dry_run_writes_nothing_anywhere() {
    // docs/hazards.md #180
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(180);
    rig.seed(90, &mut r).await;
    let before = rig.change_log().await;
    rig.opts.dry_run = true;
    let report = rig.flush().await;
    let s = only(&report);
    assert!(report.dry_run);
    assert_eq!(s.outcome, Outcome::Flushed);
    let planned: Vec<u64> = s.files.iter().map(|f| f.rows).collect();
    assert_eq!(planned, [40, 40, 10], "the plan lists every would-be file");
    assert!(rig.store.writes().is_empty(), "{:?}", rig.store.writes());
    // Its requests read the manifest (the source check, which also proves it is one the run
    // could commit to) and the data prefix's owner marker, as the run does before its export.
    let calls: Vec<(Op, String)> = rig
        .store
        .calls()
        .into_iter()
        .map(|c| (c.op, c.key))
        .collect();
    assert_eq!(
        calls,
        [
            (Op::GetBytes, "manifest/100.json".to_string()),
            (Op::GetBytes, "data/100/_owner.json".to_string()),
        ]
    );
    assert_eq!(rig.change_log().await, before);
    // The real run executes the same plan, and claims the data prefix for its manifest.
    rig.opts.dry_run = false;
    let report = rig.flush().await;
    let done: Vec<u64> = only(&report).files.iter().map(|f| f.rows).collect();
    assert_eq!(done, planned);
    let marker = rig.store.get_bytes("data/100/_owner.json").await.unwrap();
    let marker: serde_json::Value = serde_json::from_slice(&marker.bytes).unwrap();
    assert_eq!(marker["manifest"], "manifest/100.json");
    // A manifest the run could not commit to fails the dry run too.
    rig.seed(5, &mut r).await;
    rig.store
        .put_bytes(
            "manifest/100.json",
            bytes::Bytes::from_static(b"{not json"),
            lakecdc::store::PutMode::Overwrite,
        )
        .await
        .unwrap();
    rig.opts.dry_run = true;
    let report = rig.flush().await;
    let s = only(&report);
    assert_eq!(s.outcome, Outcome::Failed, "{s:?}");
    assert!(
        s.reason.as_deref().unwrap().contains("manifest/100.json"),
        "{s:?}"
    );
}

#[tokio::test]
async fn writes_inside_the_flush_window_stay_dirty_and_converge() {
    // docs/hazards.md #182: before export, and after export before mark.
    for window in ["before_export", "before_mark"] {
        let mut rig = rig(LakeKind::S3).await;
        let mut r = Rng::new(182);
        let ids = rig.seed(10, &mut r).await;
        let (a, b) = (ids[0], ids[1]);
        let newcomer = r.uuid();
        let writer = rig.second_writer().await;
        let hooks = rewrite_once(window, writer.clone(), (a, b, newcomer));
        let (before_a, before_b) = (rig.writer.rows[&a].clone(), rig.writer.rows[&b].clone());
        let report = rig.flush_with(&hooks).await;
        assert_eq!(only(&report).outcome, Outcome::Flushed);
        rig.take_model(&writer).await;
        let dirty = oracle::dirty(&rig.writer).await;
        assert_eq!(dirty, BTreeSet::from([a, b, newcomer]), "{window}");
        // The batch's payload comes from the snapshot its selection was made in (docs/hazards.md #45):
        // `a` with its values before the update, at its old version, and `b` as
        // the live row it was before the delete, not a row of NULLs.
        let first = &only(&report).files[0].path;
        let rows: BTreeMap<Uuid, oracle::LakeRow> =
            oracle::read_parquet(rig.store.get_bytes(first).await.unwrap().bytes)
                .into_iter()
                .collect();
        assert_as_before(&rows, [(a, &before_a), (b, &before_b)], window);
        assert_eq!(rig.assert_oracle().await, (8, 3), "{window}");
        let report = rig.flush().await;
        assert_eq!(only(&report).rows_left_dirty, 0);
        let (compared, dirty) = rig.assert_oracle().await;
        assert_eq!(dirty, 0, "{window}: a second flush converges");
        assert_eq!(compared, 10, "{window}: 8 untouched + a + newcomer");
        let lake = oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
        assert!(!lake.contains_key(&b) && lake.contains_key(&newcomer));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_heap_pass_exports_its_snapshot_and_the_windows_catch_up_in_the_same_run() {
    // docs/design.md §4.1, "Heap passes"; docs/hazards.md #45 and #182. The pass selects its
    // slots in an exported snapshot; the writes below land after the selection and before the
    // heap readers scan the tables (before_export), or after the first file is committed
    // (before_mark). The pass must export the versions of its snapshot — its readers share it —
    // leave the rewritten slots dirty at the mark, and the windows after the pass export them
    // in the same run.
    for window in ["before_export", "before_mark"] {
        let mut rig = rig(LakeKind::S3).await;
        rig.opts.read_order = ReadOrder::Heap;
        let mut r = Rng::new(4500);
        let ids = rig.seed(30, &mut r).await;
        let (a, b) = (ids[0], ids[1]);
        let newcomer = r.uuid();
        let writer = rig.second_writer().await;
        let hooks = rewrite_once(window, writer.clone(), (a, b, newcomer));
        // A dry run plans the pass's batches the run then exports, and writes nothing.
        let plan = lakecdc::flush::run(
            &rig.ctx,
            &FlushOptions {
                batch_size: 10,
                dry_run: true,
                ..rig.opts.clone()
            },
        )
        .await
        .unwrap();
        let planned: Vec<u64> = only(&plan).files.iter().map(|f| f.rows).collect();
        assert_eq!(planned, [10, 10, 10], "{window}");
        assert!(rig.listed().await.is_empty(), "{window}");
        let (before_a, before_b) = (rig.writer.rows[&a].clone(), rig.writer.rows[&b].clone());
        let report = flush_in_batches(&rig, 10, &hooks).await;
        let s = only(&report);
        assert_eq!(s.outcome, Outcome::Flushed, "{window}: {s:?}");
        // Three files from the pass (its 30 slots), then one from the windows: a, b's
        // tombstone and the newcomer.
        let rows: Vec<u64> = s.files.iter().map(|f| f.rows).collect();
        assert_eq!(rows, [10, 10, 10, 3], "{window}: {s:?}");
        assert_eq!(
            (
                s.table_scans,
                s.rows_by_scan,
                s.rows_left_dirty,
                s.rows_marked
            ),
            (1, 30, 2, 31),
            "{window}: {s:?}"
        );
        rig.take_model(&writer).await;
        // The pass's file of `a` and `b` holds them as the snapshot saw them.
        let mut pass_rows: BTreeMap<Uuid, oracle::LakeRow> = BTreeMap::new();
        for f in &s.files[..3] {
            pass_rows.extend(oracle::read_parquet(
                rig.store.get_bytes(&f.path).await.unwrap().bytes,
            ));
        }
        assert_eq!(pass_rows.len(), 30, "{window}");
        assert!(!pass_rows.contains_key(&newcomer), "{window}");
        assert_as_before(&pass_rows, [(a, &before_a), (b, &before_b)], window);
        // The run converged: nothing dirty, the lake equals the database.
        let (compared, dirty) = rig.assert_oracle().await;
        assert_eq!((compared, dirty), (30, 0), "{window}");
        let lake = oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
        assert!(!lake.contains_key(&b) && lake.contains_key(&newcomer));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_split_selection_takes_every_dirty_slot_once_in_row_id_order() {
    // docs/design.md §4.1, "Heap passes": a pass that takes every dirty slot selects them on
    // both readers at once, each over its share of change_log's heap pages. Together the
    // shares must hold every dirty slot of the snapshot exactly once (none on a page between
    // two shares missed, none read twice), merged in row-id order; a limit bounds each share.
    use lakecdc::source::heap_read::{self, TableShape};
    use lakecdc::source::live;
    let rig = rig(LakeKind::S3).await;
    let c = &rig.writer.client;
    c.batch_execute(
        "INSERT INTO change_log (schema_id, row_id, flushed_at, changed_at) \
         SELECT 100, gen_random_uuid(), CASE WHEN g % 3 = 0 THEN 5 ELSE 0 END, g \
         FROM generate_series(1, 3000) g; ANALYZE change_log",
    )
    .await
    .unwrap();
    let ranges = TableShape::read(c, &rig.ctx.tables)
        .await
        .unwrap()
        .slot_ranges(2);
    // Both shares hold dirty slots: the split is tested, not one share holding all.
    for r in &ranges {
        let sql = format!("SELECT count(*) FROM change_log WHERE flushed_at = 0 AND {r}");
        let n: i64 = c.query_one(&sql, &[]).await.unwrap().get(0);
        assert!(n > 600, "{r}: {n}");
    }
    let expected = dirty_ids(&rig, "row_id").await;
    assert_eq!(expected.len(), 2000);
    for limit in [1_000_000, 600] {
        let mut readers = heap_read::open_readers(&rig.ctx.connector, 2)
            .await
            .unwrap();
        let snapshot = live::ExportedSnapshot::export(&rig.ctx.connector)
            .await
            .unwrap();
        let tickets = vec![snapshot.ticket(), snapshot.ticket()];
        let released = snapshot.release();
        let tables = &rig.ctx.tables;
        let split = heap_read::dirty_slots_split(
            &mut readers,
            tickets,
            tables,
            CUSTOMER,
            limit,
            &ranges,
            2000,
        );
        let (slots, released) = tokio::join!(split, released);
        released.unwrap();
        let ids: Vec<Uuid> = slots.unwrap().iter().map(|s| s.slot.row_id).collect();
        match limit {
            1_000_000 => assert_eq!(ids, expected),
            _ => {
                // Each share stops at the limit (the pass keeps the first `limit`): each a
                // dirty slot, in row-id order, none twice.
                assert_eq!(ids.len(), 1_200);
                assert!(ids.windows(2).all(|w| w[0] < w[1]));
                let all: BTreeSet<Uuid> = expected.iter().copied().collect();
                assert!(ids.iter().all(|id| all.contains(id)));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_windows_after_a_heap_pass_start_past_its_last_slot() {
    // docs/design.md §4.1, "Heap passes"; docs/hazards.md L117. A pass that took every dirty
    // slot is followed by windows that start past its last slot by (changed_at, row_id): they
    // never walk the pass's own slots, whose marks leave them as dead entries of the
    // dirty-slot index. A slot written during the pass above that point is exported in the same
    // run; one written below it (here: by a writer whose clock is behind the pass's newest
    // version) is left dirty for the next run, which exports it.
    let mut rig = rig(LakeKind::S3).await;
    rig.opts.read_order = ReadOrder::Heap;
    let mut r = Rng::new(4502);
    let ids = rig.seed(30, &mut r).await;
    // The pass's newest version: a minute ahead of every writer's clock.
    let ahead = rig.writer.restamp_ahead(ids[0], 60_000).await;
    let (behind, above) = (r.uuid(), r.uuid());
    let writer = rig.second_writer().await;
    let w = writer.clone();
    let hooks = FlushHooks {
        before_export: Some(Rig::hook(move || {
            let w = w.clone();
            async move {
                let mut w = w.lock().await;
                if w.rows.contains_key(&behind) {
                    return; // only once
                }
                let mut r = Rng::new(8);
                let low = w.create(behind, Customer::random(&mut r)).await;
                assert!(low < ahead, "{low} < {ahead}");
                w.create(above, Customer::random(&mut r)).await;
                w.restamp_ahead(above, 120_000).await;
            }
            .boxed()
        })),
        ..Default::default()
    };
    let report = flush_in_batches(&rig, 10, &hooks).await;
    let s = only(&report);
    let rows: Vec<u64> = s.files.iter().map(|f| f.rows).collect();
    // The pass's 30 slots, then a window of the one slot above the pass's last.
    assert_eq!(rows, [10, 10, 10, 1], "{s:?}");
    assert_eq!(
        (
            s.table_scans,
            s.rows_by_scan,
            s.rows_marked,
            s.rows_left_dirty
        ),
        (1, 30, 31, 0),
        "{s:?}"
    );
    let window = oracle::read_parquet(rig.store.get_bytes(&s.files[3].path).await.unwrap().bytes);
    let window: Vec<Uuid> = window.into_iter().map(|(id, _)| id).collect();
    assert_eq!(window, [above]);
    rig.take_model(&writer).await;
    assert_eq!(oracle::dirty(&rig.writer).await, BTreeSet::from([behind]));
    // The next run exports the slot left below the pass.
    let report = rig.flush().await;
    let s = only(&report);
    assert_eq!((s.rows_exported, s.rows_left_dirty), (1, 0), "{s:?}");
    let (compared, dirty) = rig.assert_oracle().await;
    assert_eq!((compared, dirty), (32, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_heap_pass_bounded_by_the_batch_budget_takes_the_oldest_slots() {
    // docs/design.md §4.1, "Heap passes": a pass that cannot take every dirty slot
    // (`--max-batches`) takes the oldest ones, as a window would, and exports them sorted.
    let mut rig = rig(LakeKind::S3).await;
    rig.opts.read_order = ReadOrder::Heap;
    let mut r = Rng::new(4501);
    rig.seed(30, &mut r).await;
    for _ in 0..20 {
        rig.writer.random_op(&mut r).await;
    }
    // The heap in row-id order, so that a selection in heap order is not the oldest slots.
    rig.writer
        .client
        .batch_execute("CLUSTER change_log USING change_log_pkey; ANALYZE change_log")
        .await
        .unwrap();
    let order = dirty_in_selection_order(&rig).await;
    assert!(order.len() > 20, "{}", order.len());
    let opts = FlushOptions {
        batch_size: 10,
        max_batches: Some(2),
        ..rig.opts.clone()
    };
    let report = lakecdc::flush::run(&rig.ctx, &opts).await.unwrap();
    let s = only(&report);
    assert_eq!(
        (s.table_scans, s.rows_by_scan, s.batches),
        (1, 20, 2),
        "{s:?}"
    );
    let mut exported = ids_of_sorted_files(&rig, &s.files).await;
    exported.sort();
    let mut oldest = order[..20].to_vec();
    oldest.sort();
    assert_eq!(exported, oldest);
    assert_eq!(dirty_in_selection_order(&rig).await, order[20..]);
}

#[tokio::test]
async fn missing_metadata_stops_the_run_before_any_side_effect() {
    // docs/hazards.md #193
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(193);
    rig.seed(5, &mut r).await;
    // Schema 101 (order) is dirty too, but its metadata is missing.
    rig.writer
        .client
        .execute("INSERT INTO change_log (schema_id, row_id, changed_at) VALUES (101, gen_random_uuid(), 5)", &[])
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    for f in ["customer.json", "customer_attributes.json", "order.json"] {
        std::fs::copy(harness::examples_dir().join(f), dir.path().join(f)).unwrap();
    }
    rig.ctx.schema_dir = Some(dir.path().to_path_buf());
    let before = rig.change_log().await;
    let err = lakecdc::flush::run(&rig.ctx, &rig.opts).await.unwrap_err();
    assert!(
        matches!(&err, lakecdc::error::Error::Metadata { path, .. } if path.ends_with("order_attributes.json")),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("order_attributes.json") && msg.contains("order"),
        "{msg}"
    );
    assert_eq!(err.exit_code(), 2);
    assert!(rig.store.calls().is_empty(), "{:?}", rig.store.calls());
    assert_eq!(rig.change_log().await, before);
    // An empty metadata file is refused the same way.
    std::fs::write(dir.path().join("order_attributes.json"), "{}").unwrap();
    let err = lakecdc::flush::run(&rig.ctx, &rig.opts).await.unwrap_err();
    assert!(
        matches!(&err, lakecdc::error::Error::Metadata { path, .. } if path.ends_with("order_attributes.json")),
        "{err:?}"
    );
    assert!(err.to_string().contains("no attributes"), "{err}");
    assert!(rig.store.calls().is_empty());
}

#[tokio::test]
async fn a_failed_manifest_write_lists_nothing_and_marks_nothing() {
    // docs/hazards.md #197/#252
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(252);
    rig.seed(12, &mut r).await;
    rig.store
        .arm(Op::PutBytes, Some("manifest/"), 1, Action::Fail);
    let report = rig.flush().await;
    let s = only(&report);
    assert_eq!(s.outcome, Outcome::Failed);
    assert!(s.reason.as_deref().unwrap().contains("manifest"), "{s:?}");
    assert_eq!(s.rows_marked, 0);
    assert_eq!(oracle::dirty(&rig.writer).await.len(), 12);
    assert!(rig.listed().await.is_empty());
    assert!(report.failed());
    // A save that certainly did not happen (the manifest could not be read, so nothing was
    // written) leaves no delta behind either: nothing would ever list it, and gc never
    // deletes an unlisted delta.
    let deltas = |keys: Vec<String>| -> Vec<String> {
        keys.into_iter()
            .filter(|k| matches!(rig.ctx.lake.layout.classify(k), KeyKind::Delta { .. }))
            .collect()
    };
    let before = deltas(rig.keys("data/100/").await);
    let calls_before = rig.store.calls().len();
    // The second read: the first is the source check before the export (docs/design.md §4.9).
    rig.store
        .arm(Op::GetBytes, Some("manifest/"), 2, Action::Fail);
    let report = rig.flush().await;
    assert_eq!(only(&report).outcome, Outcome::Failed);
    assert_eq!(oracle::dirty(&rig.writer).await.len(), 12);
    assert_eq!(
        deltas(rig.keys("data/100/").await),
        before,
        "the uploaded delta is deleted"
    );
    assert!(
        rig.store.calls()[calls_before..]
            .iter()
            .any(|c| c.op == Op::PutFile
                && matches!(rig.ctx.lake.layout.classify(&c.key), KeyKind::Delta { .. })),
        "the delta was uploaded before the save failed"
    );
    // An ambiguous write (it landed, the answer was lost): still nothing marked, and a retry
    // converges with a duplicate delta of identical versions.
    rig.store
        .arm(Op::PutBytes, Some("manifest/"), 1, Action::FailAfter);
    let report = rig.flush().await;
    assert_eq!(only(&report).outcome, Outcome::Failed);
    assert_eq!(oracle::dirty(&rig.writer).await.len(), 12);
    assert_eq!(rig.listed().await.len(), 1);
    // Every row is dirty, but the landed file holds each one's current version.
    assert_eq!(
        oracle::assert_live_rows(&rig.writer, rig.store.as_ref(), MANIFEST).await,
        12
    );
    let report = rig.flush().await;
    assert_eq!(only(&report).outcome, Outcome::Flushed);
    let (compared, dirty) = rig.assert_oracle().await;
    assert_eq!((compared, dirty), (12, 0));
    assert_eq!(rig.listed().await.len(), 2);
}

#[tokio::test]
async fn a_failed_upload_leaves_no_delta_and_nothing_goes_through_a_temporary_key() {
    // docs/hazards.md #226: a delta goes straight to its final key (docs/design.md §4.1), so a
    // failed upload must leave nothing there, whether or not the object landed.
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(226);
    rig.seed(8, &mut r).await;
    // FailAfter: the object landed, then the call failed — it must still go.
    for (label, action) in [("fail", Action::Fail), ("fail after", Action::FailAfter)] {
        rig.store.arm(Op::PutFile, None, 1, action);
        let report = rig.flush().await;
        let s = only(&report);
        assert_eq!(s.outcome, Outcome::Failed, "{label}");
        assert!(
            s.reason.as_deref().unwrap().contains("upload delta"),
            "{s:?}"
        );
        assert!(rig.keys("data/100/").await.is_empty(), "{label}: left");
        assert!(rig.store.calls().iter().all(|c| c.op != Op::Copy));
        assert_eq!(oracle::dirty(&rig.writer).await.len(), 8);
        assert!(rig.listed().await.is_empty());
    }
    let calls = rig.store.calls().len();
    let report = rig.flush().await;
    let s = only(&report);
    assert_eq!((s.outcome, s.rows_marked), (Outcome::Flushed, 8));
    // One upload, to the listed delta's own key: no copy, no temporary key, no delete. (The
    // other write under the prefix is the owner marker the first save claims it with.)
    let listed = rig.listed().await;
    assert_eq!(listed.len(), 1);
    let layout = &rig.ctx.lake.layout;
    let data: Vec<_> = rig.store.calls()[calls..]
        .iter()
        .filter(|c| c.key.starts_with("data/"))
        .filter(|c| !matches!(layout.classify(&c.key), KeyKind::Owner { .. }))
        .map(|c| (c.op, c.key.clone()))
        .collect();
    assert_eq!(data, vec![(Op::PutFile, listed[0].clone())]);
    let objects: Vec<_> = rig
        .keys("data/100/")
        .await
        .into_iter()
        .filter(|k| !matches!(layout.classify(k), KeyKind::Owner { .. }))
        .collect();
    assert_eq!(objects, listed);
    let (compared, dirty) = rig.assert_oracle().await;
    assert_eq!((compared, dirty), (8, 0));
}

#[tokio::test]
async fn clock_ahead_versions_flush_in_one_pass_and_a_recreate_in_the_window_stays_dirty() {
    // docs/hazards.md #274
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(274);
    let ids = rig.seed(4, &mut r).await;
    rig.flush().await;
    let ahead: Vec<i64> = {
        let mut v = Vec::new();
        for id in &ids {
            v.push(rig.writer.restamp_ahead(*id, 20_000).await);
        }
        v
    };
    let updated = rig.writer.update(ids[0], Customer::random(&mut r)).await;
    assert_eq!(updated, ahead[0] + 1, "update lands at ahead+1");
    let deleted = rig.writer.hard_delete(ids[1]).await;
    assert_eq!(deleted, ahead[1] + 1, "delete lands at ahead+1");
    let report = rig.flush().await;
    assert_eq!(only(&report).rows_left_dirty, 0);
    let (compared, dirty) = rig.assert_oracle().await;
    assert_eq!(
        (compared, dirty),
        (3, 0),
        "one flush leaves zero dirty rows"
    );

    // Delete ids[2] (ahead), then recreate it while a flush is paused before its mark.
    let stamp = rig.writer.hard_delete(ids[2]).await;
    assert_eq!(stamp, ahead[2] + 1);
    let writer = Arc::new(tokio::sync::Mutex::new(
        Writer::new(rig.db.client().await, CUSTOMER).await,
    ));
    let w2 = writer.clone();
    let target = ids[2];
    let recreated = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let rec2 = recreated.clone();
    let hooks = FlushHooks {
        before_mark: Some(Rig::hook(move || {
            let (w, rec) = (w2.clone(), rec2.clone());
            async move {
                let mut r = Rng::new(5);
                let v = w
                    .lock()
                    .await
                    .create(target, Customer::random(&mut r))
                    .await;
                rec.store(v, std::sync::atomic::Ordering::SeqCst);
            }
            .boxed()
        })),
        ..Default::default()
    };
    rig.flush_with(&hooks).await;
    let v = recreated.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        v,
        ahead[2] + 2,
        "the recreate lands above its own tombstone"
    );
    assert_eq!(oracle::dirty(&rig.writer).await, BTreeSet::from([target]));
    let model = writer.lock().await.rows[&target].clone();
    rig.writer.rows.insert(target, model);
    rig.writer.deleted.retain(|d| *d != target);
    rig.flush().await;
    let (compared, dirty) = rig.assert_oracle().await;
    assert_eq!((compared, dirty), (3, 0));
}

#[tokio::test]
async fn a_slot_moved_before_the_mark_is_never_marked_in_another_rows_place() {
    // The mark reaches slots by the ctid read with the selection. A table rewrite between the
    // selection and the mark moves tuples, so an exported ctid may then hold the dirty slot of
    // a row this batch did NOT export; marking it would lose that row's change. Only a slot
    // whose row id and version match the exported ones may be marked.
    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(4242);
    let ids = rig.seed(30, &mut r).await;
    rig.flush().await;
    for id in &ids {
        rig.writer.update(*id, Customer::random(&mut r)).await;
    }
    // Only the 30 dirty slots remain, packed into the first tuple positions in write order.
    for sql in [
        "DELETE FROM change_log WHERE flushed_at <> 0",
        "VACUUM FULL change_log",
    ] {
        rig.writer.client.batch_execute(sql).await.unwrap();
    }
    let client = Arc::new(rig.db.client().await);
    let hooks = FlushHooks {
        before_mark: Some(Rig::hook(move || {
            let c = client.clone();
            async move {
                // Rewrites the table in row-id order: the same positions, other rows.
                c.batch_execute("CLUSTER change_log USING change_log_pkey")
                    .await
                    .unwrap();
            }
            .boxed()
        })),
        ..Default::default()
    };
    let opts = FlushOptions {
        batch_size: 10,
        max_batches: Some(1),
        ..rig.opts.clone()
    };
    let report = lakecdc::flush::run_with_hooks(&rig.ctx, &opts, &hooks)
        .await
        .unwrap();
    let s = only(&report);
    assert_eq!(s.rows_exported, 10);
    let mut exported = BTreeSet::new();
    for f in &s.files {
        let bytes = rig.store.get_bytes(&f.path).await.unwrap().bytes;
        exported.extend(oracle::read_parquet(bytes).into_iter().map(|(id, _)| id));
    }
    assert_eq!(exported.len(), 10);
    let dirty = oracle::dirty(&rig.writer).await;
    let not_exported: BTreeSet<_> = ids
        .iter()
        .copied()
        .filter(|id| !exported.contains(id))
        .collect();
    assert!(
        dirty.is_superset(&not_exported),
        "a row the batch did not export was marked: {:?}",
        not_exported.difference(&dirty).collect::<Vec<_>>()
    );
    let marked = exported.iter().filter(|id| !dirty.contains(id)).count();
    assert_eq!(
        s.rows_marked as usize, marked,
        "the report counts the slots marked"
    );
    assert_eq!(s.rows_marked + s.rows_left_dirty, 10);
    assert!(
        marked < 10,
        "the rewrite moved no exported slot: the test proves nothing"
    );
    // Every row marked flushed is in the lake at its current version.
    assert_eq!(rig.assert_oracle().await, (marked, 30 - marked));
    rig.flush().await;
    let (compared, dirty) = rig.assert_oracle().await;
    assert_eq!((compared, dirty), (30, 0));
}

#[tokio::test]
async fn back_to_back_flushes_never_collide_on_flushed_at() {
    // docs/hazards.md #46
    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(46);
    let ids = rig.seed(1, &mut r).await;
    for _ in 0..15 {
        rig.writer.update(ids[0], Customer::random(&mut r)).await;
        let report = rig.flush().await;
        assert_eq!(only(&report).rows_marked, 1);
    }
    let slots: Vec<i64> = rig
        .change_log()
        .await
        .iter()
        .filter(|s| s.0 == ids[0])
        .map(|s| s.1)
        .collect();
    assert_eq!(slots.len(), 15, "one flushed slot per flush");
    let distinct: BTreeSet<i64> = slots.iter().copied().collect();
    assert_eq!(distinct.len(), 15);
    assert!(!distinct.contains(&0));
    assert_eq!(rig.assert_oracle().await, (1, 0));
}

#[tokio::test]
async fn a_manifest_changed_between_load_and_save_is_reread() {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(77);
    rig.seed(5, &mut r).await;
    let gate = lakecdc::store::fault::Gate::new();
    rig.store.arm(
        Op::PutBytes,
        Some("manifest/"),
        1,
        Action::Pause(gate.clone()),
    );
    let ctx = rig.ctx.clone();
    let opts = rig.opts.clone();
    let task = tokio::spawn(async move { lakecdc::flush::run(&ctx, &opts).await });
    gate.wait_reached().await;
    another_writer_saves(rig.store.as_ref()).await;
    gate.release();
    let report = task.await.unwrap().unwrap();
    assert_eq!(only(&report).outcome, Outcome::Flushed);
    let m = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
        .await
        .unwrap();
    assert_eq!(m["touched_by"], "another writer");
    assert_eq!(m["files"].as_array().unwrap().len(), 1);
    assert_eq!(m["version"], 2);
    assert_eq!(rig.assert_oracle().await, (5, 0));
}

/// Another writer (say, compact) saves the manifest: it marks it `touched_by`.
async fn another_writer_saves(store: &dyn ObjectStore) {
    let touch = |m: &mut lakecdc::lake::Manifest| {
        m.extra.insert("touched_by".into(), "another writer".into());
        Ok(())
    };
    let policy = Default::default();
    let saved =
        lakecdc::lake::manifest::commit(store, MANIFEST, CUSTOMER, &SystemClock, policy, touch);
    saved.await.unwrap();
}

/// An S3 rig holding 100 new entities, flushed 20 to a batch: five saves of the manifest.
async fn five_batch_rig(seed: u64) -> (Rig, Rng) {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(seed);
    rig.seed(100, &mut r).await;
    rig.opts.batch_size = 20;
    (rig, r)
}

/// The manifest is at `version` and lists `files` files.
async fn assert_manifest(rig: &Rig, version: i64, files: usize) -> serde_json::Value {
    let m = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
        .await
        .unwrap();
    assert_eq!(m["version"], version);
    assert_eq!(m["files"].as_array().unwrap().len(), files);
    m
}

/// The operations the run made on the manifest itself (not its history copies).
fn manifest_ops(rig: &Rig, from: usize) -> Vec<Op> {
    rig.store.calls()[from..]
        .iter()
        .filter(|c| c.key == MANIFEST)
        .map(|c| c.op)
        .collect()
}

#[tokio::test]
async fn each_batch_saves_the_manifest_without_reading_it_again() {
    let (mut rig, mut r) = five_batch_rig(78).await;
    let (get, put) = (Op::GetBytes, Op::PutBytes);
    let from = rig.store.calls().len();
    let report = rig.flush().await;
    assert_eq!(only(&report).batches, 5);
    // A new lake: the source check finds no manifest, the first save reads again (and
    // creates it); every later save starts from the one before it (docs/design.md §3.2.3).
    let ops = manifest_ops(&rig, from);
    assert_eq!(ops, [get, get, put, put, put, put, put], "{ops:?}");
    // Once the manifest exists, a run reads it once, for its checks, and saves from that.
    rig.seed(40, &mut r).await;
    let from = rig.store.calls().len();
    let report = rig.flush().await;
    assert_eq!(only(&report).batches, 2);
    let ops = manifest_ops(&rig, from);
    assert_eq!(ops, [get, put, put], "{ops:?}");
    assert_manifest(&rig, 7, 7).await;
    // Every version's history copy landed (written while the run went on), each the bytes
    // saved: the last one is the manifest itself.
    let layout = &rig.ctx.lake.layout;
    for v in 1..=7 {
        let copy = rig.store.get_bytes(&layout.history_key(CUSTOMER, v)).await;
        let copy: serde_json::Value = serde_json::from_slice(&copy.unwrap().bytes).unwrap();
        assert_eq!(copy["version"], v);
        assert_eq!(copy["files"].as_array().unwrap().len(), v as usize);
    }
    let last = rig.store.get_bytes(&layout.history_key(CUSTOMER, 7)).await;
    assert_eq!(
        last.unwrap().bytes,
        rig.store.get_bytes(MANIFEST).await.unwrap().bytes
    );
    assert_eq!(rig.assert_oracle().await, (140, 0));
}

#[tokio::test]
async fn a_store_that_refuses_its_own_etags_is_read_before_every_later_save() {
    let (rig, _) = five_batch_rig(80).await;
    // Every write to the manifest (and its history) answers an etag the store will not match.
    for nth in 1..=20 {
        rig.store
            .arm(Op::PutBytes, Some(MANIFEST), nth, Action::ForeignEtag);
    }
    let from = rig.store.calls().len();
    let report = rig.flush().await;
    assert_eq!(only(&report).batches, 5);
    // The second save, from the first's answer, is refused although nothing came between;
    // from then on every save reads first (docs/design.md §3.2.3 step 5).
    let ops = manifest_ops(&rig, from);
    let (get, put) = (Op::GetBytes, Op::PutBytes);
    let expected = [get, get, put, put, get, put, get, put, get, put, get, put];
    assert_eq!(ops, expected, "{ops:?}");
    assert_manifest(&rig, 5, 5).await;
    assert_eq!(rig.assert_oracle().await, (100, 0));
}

#[tokio::test]
async fn a_manifest_saved_by_another_between_batches_is_read_again_and_kept() {
    let (rig, _) = five_batch_rig(79).await;
    let store = rig.store.clone();
    let marks = Arc::new(AtomicUsize::new(0));
    let hooks = FlushHooks {
        before_mark: Some(Rig::hook(move || {
            let (store, marks) = (store.clone(), marks.clone());
            async move {
                // After the second batch's save.
                if marks.fetch_add(1, AtomicOrdering::SeqCst) == 1 {
                    another_writer_saves(store.as_ref()).await;
                }
            }
            .boxed()
        })),
        ..Default::default()
    };
    let from = rig.store.calls().len();
    let report = rig.flush_with(&hooks).await;
    assert_eq!(only(&report).batches, 5);
    // The other writer's load and save sit between the second and third batch's saves; the
    // third batch's write from the run's own last save is refused, and it reads again.
    let ops = manifest_ops(&rig, from);
    let (get, put) = (Op::GetBytes, Op::PutBytes);
    assert_eq!(
        ops,
        [get, get, put, put, get, put, put, get, put, put, put],
        "{ops:?}"
    );
    let m = assert_manifest(&rig, 6, 5).await;
    assert_eq!(m["touched_by"], "another writer");
    assert_eq!(rig.assert_oracle().await, (100, 0));
}

#[tokio::test]
async fn fault_matrix_converges_after_one_clean_retry() {
    // (step, store fault: operation and key pattern, None = a PostgreSQL fault; what the
    // failure must name). A failed batch selection itself is in flush_select.rs.
    type StoreFault<'a> = Option<(Op, Option<&'a str>)>;
    let cases: Vec<(&str, StoreFault, &str)> = vec![
        ("upload", Some((Op::PutFile, None)), "upload delta"),
        (
            "manifest load",
            Some((Op::GetBytes, Some("manifest/"))),
            "load manifest",
        ),
        (
            "manifest save",
            Some((Op::PutBytes, Some("manifest/"))),
            "may or may not have been committed",
        ),
        (
            "owner check",
            Some((Op::GetBytes, Some("/_owner.json"))),
            "read owner marker",
        ),
        ("dirty schema discovery", None, "list dirty schemas"),
        ("snapshot read", None, "postgres: read eav_data"),
        ("mark", None, "postgres: prepare mark"),
    ];
    for (step, fault, names) in cases {
        let mut rig = rig(LakeKind::S3).await;
        let mut r = Rng::new(1000);
        rig.seed(50, &mut r).await;
        rig.flush().await; // a manifest exists, so its load is exercised
        for _ in 0..60 {
            rig.writer.random_op(&mut r).await;
        }
        let dirty_before = oracle::dirty(&rig.writer).await;
        let listed_before = rig.listed().await;
        let admin = rig.db.client().await;
        let mut hooks = FlushHooks::default();
        // Renames done by a hook: each hook asserts its first rename worked.
        let renamed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let rename_in_hook = |sql: &'static str| {
            let (db_url, renamed) = (rig.db.url.clone(), renamed.clone());
            Rig::hook(move || {
                let (url, renamed) = (db_url.clone(), renamed.clone());
                async move {
                    let c = harness::pg_client(&url).await;
                    // Later batches find the table gone already.
                    if c.batch_execute(sql).await.is_ok() {
                        renamed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                }
                .boxed()
            })
        };
        match (step, fault) {
            (_, Some((op, pat))) => rig.store.arm(op, pat, 1, Action::Fail),
            ("dirty schema discovery", None) => {
                admin
                    .batch_execute("ALTER TABLE change_log RENAME TO change_log_away")
                    .await
                    .unwrap();
            }
            ("snapshot read", None) => {
                hooks.before_export =
                    Some(rename_in_hook("ALTER TABLE eav_data RENAME TO eav_away"));
            }
            _ => {
                hooks.before_mark = Some(rename_in_hook(
                    "ALTER TABLE change_log RENAME TO change_log_away",
                ));
            }
        }
        let calls = rig.store.calls().len();
        let first = lakecdc::flush::run_with_hooks(&rig.ctx, &rig.opts, &hooks).await;
        match (step, &first) {
            ("dirty schema discovery", Err(lakecdc::error::Error::Postgres { op, .. })) => {
                assert_eq!(op, names, "{step}");
                assert_eq!(rig.store.calls().len(), calls, "{step}: touched the store");
            }
            (_, Ok(rep)) => {
                let s = only(rep);
                assert_eq!(s.outcome, Outcome::Failed, "{step}: {s:?}");
                let reason = s.reason.as_deref().unwrap();
                assert!(reason.contains(names), "{step}: {reason}");
            }
            (_, Err(e)) => panic!("{step}: the run failed as a whole: {e}"),
        }
        if matches!(step, "snapshot read" | "mark") {
            assert_eq!(
                renamed.load(std::sync::atomic::Ordering::SeqCst),
                1,
                "{step}: the hook's fault"
            );
        }
        if let Some((op, _)) = fault {
            // The armed fault fired on the operation it names.
            assert!(
                rig.store.calls()[calls..].iter().any(|c| c.op == op),
                "{step}"
            );
        }
        let _ = admin
            .batch_execute("ALTER TABLE IF EXISTS change_log_away RENAME TO change_log")
            .await;
        let _ = admin
            .batch_execute("ALTER TABLE IF EXISTS eav_away RENAME TO eav_data")
            .await;
        // Right after the failure: nothing is marked unless its file is listed, and every
        // listed file is there with its checksum.
        let dirty_after = oracle::dirty(&rig.writer).await;
        assert!(dirty_after.is_subset(&dirty_before), "{step}");
        let listed_after = rig.listed().await;
        assert!(listed_after.starts_with(&listed_before), "{step}");
        if dirty_after.len() < dirty_before.len() {
            assert!(listed_after.len() > listed_before.len(), "{step}");
        }
        let (compared, dirty) = rig.assert_oracle().await;
        assert_eq!(dirty, dirty_after.len(), "{step}");
        assert!(compared > 0, "{step}");
        let retry = rig.flush().await;
        assert!(!retry.failed(), "{step}: {retry:?}");
        let (compared, dirty) = rig.assert_oracle().await;
        assert_eq!(dirty, 0, "{step}");
        assert_eq!(
            compared,
            rig.writer.rows.values().filter(|m| !m.soft_deleted).count(),
            "{step}"
        );
        for key in rig.listed().await {
            rig.store
                .head(&key)
                .await
                .unwrap_or_else(|e| panic!("{step}: listed {key} missing: {e}"));
        }
    }
}

#[tokio::test]
async fn a_failed_prefix_claim_leaves_no_delta_behind() {
    // The first flush of a lake claims its data prefix right before its first manifest save;
    // the claim fails: the promoted delta is deleted (nothing lists it), the rows stay dirty,
    // and the retry claims and converges.
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(4630);
    rig.seed(30, &mut r).await;
    rig.store
        .arm(Op::PutBytes, Some("/_owner.json"), 1, Action::Fail);
    let report = rig.flush().await;
    assert_eq!(only(&report).outcome, Outcome::Failed, "{report:?}");
    assert_eq!(rig.keys("data/100/").await, Vec::<String>::new());
    assert!(
        rig.store
            .get_bytes(MANIFEST)
            .await
            .unwrap_err()
            .is_not_found(),
        "a manifest was saved"
    );
    assert_eq!(oracle::dirty(&rig.writer).await.len(), 30);
    let retry = rig.flush().await;
    assert_eq!(only(&retry).rows_marked, 30, "{retry:?}");
    assert!(rig.store.head("data/100/_owner.json").await.is_ok());
    assert_eq!(rig.assert_oracle().await, (30, 0));
}

#[test]
fn a_second_flush_process_is_locked_out_while_the_first_holds_the_schema() {
    // Two `lakecdc flush` processes on one schema: the schema lock lets one of them work and
    // makes the other skip the schema. The test makes the two overlap for certain: it holds
    // entity_main locked, so the first process, once it holds the schema lock, waits in its
    // batch read. The second one starts then, reports the schema `locked` and exits while the
    // first still runs and still holds the lock. Released, the first flushes every row once.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (mut rig, bucket, holder, watcher) = rt.block_on(async {
        let mut rig = rig(LakeKind::S3).await;
        let mut r = Rng::new(2);
        rig.seed(300, &mut r).await;
        let bucket = harness::s3_bucket().await;
        let holder = rig.db.client().await;
        holder
            .batch_execute("BEGIN; LOCK TABLE entity_main IN ACCESS EXCLUSIVE MODE")
            .await
            .unwrap();
        let watcher = rig.db.client().await;
        (rig, bucket, holder, watcher)
    });
    let _ = &mut rig;
    let lake = format!("s3://{}", bucket.bucket());
    let spawn = || {
        harness::bin()
            .args([
                "flush",
                "--force",
                "--json",
                "--batch-size",
                "25",
                "--parallelism",
                "2",
            ])
            .args(["--pg-url", &rig.db.url, "--lake", &lake, "--s3-path-style"])
            .args(["--s3-endpoint", &harness::s3_endpoint(), "--work-dir"])
            .arg(rig.work.path())
            .arg("--schema-dir")
            .arg(harness::examples_dir())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    // (sessions waiting on a lock, advisory locks granted) in the test database.
    let sessions = || {
        rt.block_on(async {
            let row = watcher
                .query_one(
                    "SELECT (SELECT count(*) FROM pg_stat_activity
                             WHERE datname = current_database() AND wait_event_type = 'Lock'),
                            (SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
                             WHERE d.datname = current_database() AND l.locktype = 'advisory'
                               AND l.granted)",
                    &[],
                )
                .await
                .unwrap();
            (row.get::<_, i64>(0), row.get::<_, i64>(1))
        })
    };
    let mut first = spawn();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while sessions() != (1, 1) {
        assert!(
            std::time::Instant::now() < deadline,
            "the first process never waited holding the schema lock: {:?}",
            sessions()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let second = spawn();
    let out = wait_within(second, Duration::from_secs(30));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &report["schemas"][0];
    assert_eq!(report["schemas"].as_array().unwrap().len(), 1, "{report}");
    assert_eq!(
        (s["schema_id"].as_i64(), s["outcome"].as_str()),
        (Some(100), Some("locked")),
        "{s}"
    );
    assert_eq!(s["rows_marked"], 0, "{s}");
    // The overlap: the second process came and went while the first held the lock.
    assert!(
        first.try_wait().unwrap().is_none(),
        "the first process ended early"
    );
    assert_eq!(
        sessions(),
        (1, 1),
        "the first process no longer waits holding the lock"
    );
    rt.block_on(async {
        assert_eq!(oracle::dirty(&rig.writer).await.len(), 300);
        holder.batch_execute("ROLLBACK").await.unwrap();
    });
    let out = wait_within(first, Duration::from_secs(120));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &report["schemas"][0];
    assert_eq!(
        (s["outcome"].as_str(), s["rows_marked"].as_u64()),
        (Some("flushed"), Some(300)),
        "{s}"
    );
    rt.block_on(async {
        let store: Arc<dyn ObjectStore> = bucket.clone();
        let m = oracle::manifest_json(store.as_ref(), MANIFEST)
            .await
            .unwrap();
        let mut seen = BTreeSet::new();
        for f in m["files"].as_array().unwrap() {
            let bytes = store
                .get_bytes(f["path"].as_str().unwrap())
                .await
                .unwrap()
                .bytes;
            for (id, row) in oracle::read_parquet(bytes) {
                assert!(
                    seen.insert((id, row.changed_at)),
                    "{id} v{} published twice",
                    row.changed_at
                );
            }
        }
        assert_eq!(seen.len(), 300);
        let (compared, dirty) = oracle::assert_matches(&rig.writer, store.as_ref(), MANIFEST).await;
        assert_eq!((compared, dirty), (300, 0));
    });
}

/// The output of `child` once it exits, failing the test (and killing it) after `limit`.
fn wait_within(mut child: std::process::Child, limit: Duration) -> std::process::Output {
    let deadline = std::time::Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the process did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[tokio::test]
async fn a_locked_schema_is_skipped_without_touching_anything() {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(31);
    rig.seed(5, &mut r).await;
    let held = lakecdc::source::SchemaLock::try_acquire(&rig.ctx.connector, CUSTOMER)
        .await
        .unwrap()
        .unwrap();
    let report = rig.flush().await;
    let s = only(&report);
    assert_eq!(s.outcome, Outcome::Locked);
    assert!(
        !report.failed(),
        "a locked schema is not a failure: another flusher does the work"
    );
    only_the_probe(&rig, 0);
    assert_eq!(oracle::dirty(&rig.writer).await.len(), 5);
    held.release().await.unwrap();
    assert_eq!(only(&rig.flush().await).rows_marked, 5);
}

#[tokio::test]
async fn a_stop_request_ends_the_run_at_a_batch_boundary() {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(15);
    rig.seed(100, &mut r).await;
    rig.opts.batch_size = 30;
    let shutdown = rig.ctx.shutdown.clone();
    let hooks = FlushHooks {
        before_mark: Some(Rig::hook(move || {
            shutdown.request();
            async {}.boxed()
        })),
        ..Default::default()
    };
    let report = rig.flush_with(&hooks).await;
    let s = only(&report);
    // The stop comes while the first batch is published. The batches in progress complete:
    // that one, and the second when it was read already and is being written meanwhile
    // (docs/design.md §4.1, "The drain"); nothing after them starts.
    assert!(
        matches!((s.batches, s.rows_marked), (1, 30) | (2, 60)),
        "the batches in progress complete: {s:?}"
    );
    assert!(s.reason.as_deref().unwrap().contains("stopped"), "{s:?}");
    let done = 30 * s.batches as usize;
    assert_eq!(oracle::dirty(&rig.writer).await.len(), 100 - done);
    assert_eq!(rig.listed().await.len(), s.batches as usize);
    assert_eq!(rig.assert_oracle().await, (done, 100 - done));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stop_request_does_not_wait_for_a_slow_read() {
    // The second batch's read hangs (a hook holds it for a minute); the stop request comes
    // while the drain waits for it: the run ends at once with the first batch published and
    // marked, everything else dirty.
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(16);
    rig.seed(100, &mut r).await;
    rig.opts.batch_size = 30;
    rig.opts.max_batches = Some(2);
    let marked = Arc::new(tokio::sync::Notify::new());
    let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (on_mark, shutdown) = (marked.clone(), rig.ctx.shutdown.clone());
    let hooks = FlushHooks {
        before_export: Some(Rig::hook(move || {
            let second = reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 1;
            let (marked, shutdown) = (marked.clone(), shutdown.clone());
            async move {
                if second {
                    let _ = tokio::time::timeout(Duration::from_secs(60), marked.notified()).await;
                    // Well after the drain has gone back to waiting for this read.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    shutdown.request();
                    tokio::time::sleep(Duration::from_secs(60)).await;
                }
            }
            .boxed()
        })),
        before_mark: Some(Rig::hook(move || {
            on_mark.notify_one();
            async {}.boxed()
        })),
        ..Default::default()
    };
    let report = tokio::time::timeout(Duration::from_secs(30), rig.flush_with(&hooks))
        .await
        .expect("the stop request ended the run without waiting for the read");
    let s = only(&report);
    assert_eq!(
        (s.outcome, s.batches, s.rows_marked),
        (Outcome::Flushed, 1, 30),
        "{s:?}"
    );
    assert!(
        s.reason
            .as_deref()
            .unwrap()
            .contains("stopped by signal while the next batch was being read"),
        "{s:?}"
    );
    assert_eq!(oracle::dirty(&rig.writer).await.len(), 70);
    assert_eq!(rig.listed().await.len(), 1);
    assert_eq!(rig.assert_oracle().await, (30, 70));
    // A stop before the first batch exports nothing and says so.
    rig.ctx.shutdown = lakecdc::shutdown::Shutdown::new();
    rig.ctx.shutdown.request();
    let report = rig.flush().await;
    let s = only(&report);
    assert_eq!((s.outcome, s.batches), (Outcome::Stopped, 0), "{s:?}");
    assert!(
        s.reason
            .as_deref()
            .unwrap()
            .contains("before the first batch"),
        "{s:?}"
    );
    assert_eq!(oracle::dirty(&rig.writer).await.len(), 70);
    assert_eq!(rig.listed().await.len(), 1);
}

#[tokio::test]
async fn a_work_dir_another_user_owns_is_refused_before_anything_is_read() {
    // docs/hazards.md S20: a private directory made where another user may rename entries
    // could be replaced by theirs between lakecdc's write of a file and its upload.
    use std::os::unix::fs::PermissionsExt;
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(20);
    rig.seed(5, &mut r).await;
    let before = rig.change_log().await;
    let t = tempfile::tempdir().unwrap();
    // Owned by another user (only root can make one here).
    if rustix::process::geteuid().is_root() {
        let theirs = t.path().join("theirs");
        std::fs::create_dir_all(theirs.join("work")).unwrap();
        std::os::unix::fs::chown(&theirs, Some(4242), Some(4242)).unwrap();
        rig.opts.work_dir = theirs.join("work");
        let err = lakecdc::flush::run(&rig.ctx, &rig.opts).await.unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("work-dir")
                && msg.contains(&theirs.display().to_string())
                && msg.contains("owned by another user"),
            "{msg}"
        );
        assert_eq!(err.exit_code(), 2);
        assert!(rig.store.calls().is_empty(), "{:?}", rig.store.calls());
        assert_eq!(rig.change_log().await, before);
        assert_eq!(std::fs::read_dir(theirs.join("work")).unwrap().count(), 0);
    }
    // Writable by all without the sticky bit (a Kubernetes emptyDir): a warning, and the run.
    let shared = t.path().join("shared");
    std::fs::create_dir_all(shared.join("work")).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    rig.opts.work_dir = shared.join("work");
    let report = rig.flush().await;
    assert_eq!(only(&report).rows_exported, 5);
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o700)).unwrap();
}

#[tokio::test]
async fn a_named_schema_without_dirty_rows_has_nothing_to_do() {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(8);
    rig.seed(3, &mut r).await;
    rig.opts.schemas = vec!["order".into()];
    let report = rig.flush().await;
    let s = only(&report);
    assert_eq!((s.schema_id, s.outcome), (101, Outcome::NothingToDo));
    only_the_probe(&rig, 0);
    rig.opts.schemas = vec!["nosuch".into()];
    let err = lakecdc::flush::run(&rig.ctx, &rig.opts).await.unwrap_err();
    assert!(matches!(&err, lakecdc::error::Error::Config(_)), "{err:?}");
    assert_eq!(err.exit_code(), 2);
    assert!(err.to_string().contains("\"nosuch\""), "{err}");
}

#[test]
fn the_binary_exits_1_naming_a_missing_bucket_and_keeps_rows_dirty() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut rig = rt.block_on(rig(LakeKind::S3));
    rt.block_on(async {
        let mut r = Rng::new(4);
        rig.seed(4, &mut r).await;
    });
    let out = harness::bin()
        .args([
            "flush",
            "--force",
            "--pg-url",
            &rig.db.url,
            "--lake",
            "s3://lakecdc-missing-bucket/x",
        ])
        .args([
            "--s3-path-style",
            "--s3-endpoint",
            &harness::s3_endpoint(),
            "--schema-dir",
        ])
        .arg(harness::examples_dir())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("failed") && stdout.contains("lakecdc-missing-bucket does not exist"),
        "{stdout}"
    );
    rt.block_on(async {
        assert_eq!(oracle::dirty(&rig.writer).await.len(), 4);
    });
}

/// Starts `lakecdc flush --force --json` on the rig's database and the local lake `lake`.
fn spawn_flush(rig: &Rig, lake: &std::path::Path, extra: &[&str]) -> std::process::Child {
    harness::bin()
        .args([
            "flush",
            "--force",
            "--json",
            "--pg-url",
            &rig.db.url,
            "--lake",
        ])
        .arg(lake)
        .arg("--schema-dir")
        .arg(harness::examples_dir())
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn sigterm_stops_the_binary_at_a_safe_boundary() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut rig = rt.block_on(rig(LakeKind::Local));
    rt.block_on(async {
        let mut r = Rng::new(143);
        rig.seed(400, &mut r).await;
    });
    let lake = rig.work.path().join("lake");
    let mut child = spawn_flush(&rig, &lake, &["--batch-size", "5"]);
    // The signal comes once the flush has committed its first batch (80 are to come).
    let manifest = lake.join(MANIFEST);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !manifest.exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the flush ended before its first batch"
        );
        assert!(std::time::Instant::now() < deadline, "no batch committed");
        std::thread::sleep(Duration::from_millis(5));
    }
    let pid = child.id().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &report["schemas"][0];
    let marked = s["rows_marked"].as_u64().unwrap();
    assert!(marked < 400, "the run was not interrupted: {s}");
    // It had started: at least the batch seen committed is exported and marked, and it
    // stopped at a batch boundary, not before the first batch.
    assert_eq!(s["outcome"], "flushed", "{s}");
    assert!(s["batches"].as_u64().unwrap() >= 1, "{s}");
    assert!(marked >= 5 && marked.is_multiple_of(5), "{s}");
    assert_eq!(s["rows_exported"].as_u64(), Some(marked), "{s}");
    let reason = s["reason"].as_str().unwrap();
    assert!(
        reason.contains("stopped by signal") && !reason.contains("before the first batch"),
        "{s}"
    );
    rt.block_on(async {
        let store = LocalStore::open(&lake).unwrap();
        let (compared, dirty) = oracle::assert_matches(&rig.writer, &store, MANIFEST).await;
        assert_eq!(compared + dirty, 400);
        assert_eq!(dirty as u64, 400 - marked);
    });
}

/// A session holding `change_log` locked (so a flush waits on it), and another watching the
/// sessions that wait on locks (the holder's transaction sees one snapshot of
/// pg_stat_activity).
struct LockedChangeLog {
    holder: tokio_postgres::Client,
    watcher: tokio_postgres::Client,
}

impl LockedChangeLog {
    async fn take(rig: &Rig) -> Self {
        let holder = rig.db.client().await;
        holder
            .batch_execute("BEGIN; LOCK TABLE change_log IN ACCESS EXCLUSIVE MODE")
            .await
            .unwrap();
        Self {
            holder,
            watcher: rig.db.client().await,
        }
    }

    /// Waits (at most 20 s) until `n` sessions of the database wait on a lock.
    async fn until_waiting(&self, n: i64, what: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let waiting: i64 = self
                .watcher
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if waiting == n {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn release(self) {
        self.holder.batch_execute("ROLLBACK").await.unwrap();
    }
}

/// A local-lake rig seeded with `rows` rows, `change_log` locked by the test, and the flush
/// binary started and waiting on that lock (so its signal handlers are in place).
struct BlockedFlush {
    rt: tokio::runtime::Runtime,
    rig: Rig,
    lock: LockedChangeLog,
    lake: std::path::PathBuf,
    child: std::process::Child,
}

impl BlockedFlush {
    fn start(seed: u64, rows: usize) -> Self {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let mut rig = rt.block_on(rig(LakeKind::Local));
        let lock = rt.block_on(async {
            rig.seed(rows, &mut Rng::new(seed)).await;
            LockedChangeLog::take(&rig).await
        });
        let lake = rig.work.path().join("lake");
        let child = spawn_flush(&rig, &lake, &[]);
        rt.block_on(lock.until_waiting(1, "the flush never waited on the lock"));
        Self {
            rt,
            rig,
            lock,
            lake,
            child,
        }
    }
}

#[test]
fn a_second_signal_exits_at_once_leaving_the_rows_dirty() {
    // The flush waits on a lock the test holds on change_log: the first SIGTERM asks it to
    // stop at its next boundary (it keeps waiting), the second exits at once with 143.
    let BlockedFlush {
        rt,
        rig,
        lock,
        lake,
        mut child,
    } = BlockedFlush::start(1430, 20);
    let pid = child.id().to_string();
    let term = || {
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
    };
    term();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the first signal only asks for a stop at the next boundary"
    );
    term();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("a second SIGTERM did not end the run");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(143));
    rt.block_on(async {
        lock.release().await;
        assert_eq!(oracle::dirty(&rig.writer).await.len(), 20);
    });
    assert!(!lake.join("manifest").exists(), "the killed run published");
}

#[test]
fn a_killed_run_leaves_no_query_waiting_on_the_server() {
    // The flush waits on a lock the test holds; it is killed (SIGKILL: no cleanup of its own).
    // The server notices the lost client (client_connection_check_interval) and ends the
    // waiting query, instead of running it for nobody once the lock is released.
    let BlockedFlush {
        rt,
        rig,
        lock,
        mut child,
        ..
    } = BlockedFlush::start(1431, 5);
    child.kill().unwrap();
    child.wait().unwrap();
    rt.block_on(lock.until_waiting(0, "the killed run's query still waits on the server"));
    rt.block_on(async {
        lock.release().await;
        assert_eq!(oracle::dirty(&rig.writer).await.len(), 5);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_joined_in_rust_give_the_same_delta_as_the_pivot_query() {
    // docs/hazards.md #210: a delta written from slots joined by `assemble_slots` (what `export`
    // does) is the file the export query writes from the same snapshot — tombstones of hard deletes, soft deletes,
    // scalar and list attributes, columns, types, values and row order.
    use lakecdc::engine::Driver;
    use lakecdc::engine::assemble;
    use lakecdc::engine::export::Inputs;
    use lakecdc::engine::{Engine, EngineConfig};
    use lakecdc::schema::ValueType;
    use lakecdc::source::connect::TappedClient;
    use lakecdc::source::snapshot;

    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(2200);
    rig.seed(40, &mut r).await;
    rig.flush().await;
    for _ in 0..300 {
        rig.writer.random_op(&mut r).await;
    }
    let full = lakecdc::schema::dir::load(&harness::examples_dir(), "customer").unwrap();
    let mut scalar = full.clone();
    scalar
        .attributes
        .retain(|a| a.value_type != ValueType::List);

    // The batch is read twice: through the connection's tap (TLS), and as tokio-postgres's
    // rows; both must give the same batches.
    async fn first_batch(
        rig: &Rig,
        conn: &mut TappedClient,
        def: &lakecdc::schema::SchemaDef,
    ) -> snapshot::Snapshot {
        snapshot::tune_for_lookups(&conn.client).await.unwrap();
        let stmts = snapshot::BatchStatements::prepare(&conn.client, &rig.ctx.tables, def)
            .await
            .unwrap();
        // The slots in selection (change) order, as a window holds them before it is cut.
        let slots = snapshot::select(&conn.client, &stmts, CUSTOMER, 10_000, None)
            .await
            .unwrap();
        assert!(!slots.is_empty(), "dirty slots");
        snapshot::read_chunk(conn, &stmts, CUSTOMER, &slots, |_| async {})
            .await
            .unwrap()
    }
    let mut conn = rig.ctx.connector.connect_tapped().await.unwrap();
    let snap = first_batch(&rig, &mut conn, &full).await;
    let diverted = conn.tap.diverted() as usize;
    assert_eq!(
        diverted,
        snap.entities.num_rows() + snap.eav.num_rows(),
        "every row went through the tap"
    );
    assert!(snap.eav.num_rows() > 0);
    let untapped = first_batch(
        &rig,
        &mut harness::untapped(&rig.ctx.connector).await,
        &full,
    )
    .await;
    assert_eq!(
        (&snap.entities, &snap.eav, &snap.change_log),
        (&untapped.entities, &untapped.eav, &untapped.change_log)
    );
    let selected = &snap.versions;
    // The batch holds every kind of slot, in change order rather than row order.
    let hard_deleted = selected
        .iter()
        .filter(|s| !rig.writer.rows.contains_key(&s.row_id))
        .count();
    let soft_deleted = selected
        .iter()
        .filter(|s| {
            rig.writer
                .rows
                .get(&s.row_id)
                .is_some_and(|m| m.soft_deleted)
        })
        .count();
    assert!(
        hard_deleted > 0 && soft_deleted > 0,
        "{hard_deleted} {soft_deleted}"
    );
    assert!(selected.windows(2).any(|w| w[0].row_id > w[1].row_id));
    assert!(snap.eav.num_rows() > 0);

    let engine = Engine::open(&EngineConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (by_query, by_rust) = (dir.path().join("q.parquet"), dir.path().join("r.parquet"));
    let inputs = Inputs {
        change_log: std::slice::from_ref(&snap.change_log),
        entities: std::slice::from_ref(&snap.entities),
        eav: std::slice::from_ref(&snap.eav),
    };
    for def in [&scalar, &full] {
        // Each export writes a new file (mode 0600, never over an existing one).
        for p in [&by_query, &by_rust] {
            let _ = std::fs::remove_file(p);
        }
        assert!(
            assemble::assemble_slots(def, &snap.change_log, &snap.entities, &snap.eav)
                .unwrap()
                .is_some(),
            "export joins these slots in Rust"
        );
        let n = engine
            .export_pivoted(def, CUSTOMER, Driver::ChangeLog, inputs, &by_query)
            .unwrap();
        let m = engine
            .export(def, CUSTOMER, Driver::ChangeLog, inputs, &by_rust)
            .unwrap();
        assert_eq!((n as usize, m as usize), (selected.len(), selected.len()));
        oracle::assert_same_file(&by_query, &by_rust);
    }
    let tombstones = oracle::read_parquet(std::fs::read(&by_query).unwrap().into())
        .iter()
        .filter(|(_, row)| row.deleted_at > 0)
        .count();
    assert!(tombstones >= hard_deleted + soft_deleted, "{tombstones}");
    let lists = oracle::list_shapes(&by_query, "tags");
    assert_eq!(lists, [true; 3], "NULL, [] and several items: {lists:?}");

    // Two EAV rows of one scalar attribute, two slots of one row, or list indices that are
    // not plain integers or that repeat: only the query is right, so the join declines.
    let decline_for = |def: &lakecdc::schema::SchemaDef,
                       cl: &arrow::record_batch::RecordBatch,
                       eav: &arrow::record_batch::RecordBatch| {
        assemble::assemble_slots(def, cl, &snap.entities, eav)
            .unwrap()
            .is_none()
    };
    let decline = |cl: &arrow::record_batch::RecordBatch,
                   eav: &arrow::record_batch::RecordBatch| {
        decline_for(&full, cl, eav)
    };
    let twice = |b: &arrow::record_batch::RecordBatch| {
        arrow::compute::concat_batches(&b.schema(), [b, b]).unwrap()
    };
    // (With scalars only: doubled list items would decline on their own.)
    assert!(decline_for(&scalar, &snap.change_log, &twice(&snap.eav)));
    assert!(decline(&twice(&snap.change_log), &snap.eav));
    let twice_entities = twice(&snap.entities);
    assert!(
        assemble::assemble_slots(&scalar, &snap.change_log, &twice_entities, &snap.eav)
            .unwrap()
            .is_none()
    );
    assert!(decline(
        &snap.change_log,
        &oracle::map_indices(&snap.eav, |i| format!("+{i}"))
    ));
    assert!(decline(
        &snap.change_log,
        &oracle::map_indices(&snap.eav, |_| "3".to_string())
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dense_batch_is_read_by_its_row_id_range_and_exports_only_its_own_rows() {
    // docs/design.md §4.1: a batch whose row-id range holds at most RANGE_DENSITY entities per
    // slot is read by that range (one index descent) instead of by its ids (one descent per
    // id). The range brings rows that are not the batch's; the delta must hold exactly the
    // batch's rows, the same file as from the batch's own rows.
    use arrow::array::{Array, BooleanArray, FixedSizeBinaryArray};
    use arrow::record_batch::RecordBatch;
    use lakecdc::engine::Driver;
    use lakecdc::engine::export::Inputs;
    use lakecdc::engine::{Engine, EngineConfig};
    use lakecdc::source::snapshot::{self, RANGE_DENSITY, Selected};

    assert_eq!(
        RANGE_DENSITY, 2,
        "the chunks below are cut for a density of 2"
    );
    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(2300);
    rig.seed(60, &mut r).await;
    let def = lakecdc::schema::dir::load(&harness::examples_dir(), "customer").unwrap();
    let mut conn = rig.ctx.connector.connect_tapped().await.unwrap();
    snapshot::tune_for_lookups(&conn.client).await.unwrap();
    let stmts = snapshot::BatchStatements::prepare(&conn.client, &rig.ctx.tables, &def)
        .await
        .unwrap();
    let mut slots = snapshot::select(&conn.client, &stmts, CUSTOMER, 10_000, None)
        .await
        .unwrap();
    assert_eq!(slots.len(), 60, "every seeded row is dirty");
    slots.sort_by_key(|s| s.row_id);
    let every = |k: usize| -> Vec<Selected> { slots.iter().step_by(k).copied().collect() };
    let ids_of =
        |chunk: &[Selected]| -> BTreeSet<Uuid> { chunk.iter().map(|s| s.row_id).collect() };

    // Every other slot: 30 slots whose range holds 59 entities (at most 2 per slot).
    let half = every(2);
    let snap = snapshot::read_chunk(&mut conn, &stmts, CUSTOMER, &half, |_| async {})
        .await
        .unwrap();
    assert!(snap.by_range, "a dense batch is read by its range");
    assert_eq!(
        snap.entities.num_rows(),
        59,
        "the range's entities, not only the batch's"
    );
    assert_eq!(ids_of(&snap.versions), ids_of(&half));

    // Every third slot (20 slots, 58 entities in range) and a single slot: read by id.
    for (chunk, rows) in [(every(3), 20), (every(60), 1)] {
        let sparse = snapshot::read_chunk(&mut conn, &stmts, CUSTOMER, &chunk, |_| async {})
            .await
            .unwrap();
        assert!(!sparse.by_range, "{} slots", chunk.len());
        assert_eq!(sparse.entities.num_rows(), rows);
    }

    // The range's extra rows change nothing: the file equals the one written from the
    // batch's own entity and EAV rows, and holds exactly the batch's rows.
    let wanted = ids_of(&half);
    let own = |b: &RecordBatch| -> RecordBatch {
        let ids = b
            .column(0)
            .as_any()
            .downcast_ref::<FixedSizeBinaryArray>()
            .unwrap();
        let keep: BooleanArray = (0..ids.len())
            .map(|i| Some(wanted.contains(&Uuid::from_slice(ids.value(i)).unwrap())))
            .collect();
        arrow::compute::filter_record_batch(b, &keep).unwrap()
    };
    let (entities, eav) = (own(&snap.entities), own(&snap.eav));
    assert_eq!(entities.num_rows(), 30);
    assert!(eav.num_rows() > 0 && eav.num_rows() < snap.eav.num_rows());
    let engine = Engine::open(&EngineConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (ranged, exact) = (
        dir.path().join("range.parquet"),
        dir.path().join("own.parquet"),
    );
    let export = |entities: &RecordBatch, eav: &RecordBatch, path: &std::path::Path| {
        let inputs = Inputs {
            change_log: std::slice::from_ref(&snap.change_log),
            entities: std::slice::from_ref(entities),
            eav: std::slice::from_ref(eav),
        };
        engine
            .export(&def, CUSTOMER, Driver::ChangeLog, inputs, path)
            .unwrap()
    };
    let n = export(&snap.entities, &snap.eav, &ranged);
    export(&entities, &eav, &exact);
    assert_eq!(n, 30);
    oracle::assert_same_file(&ranged, &exact);
    let rows = oracle::read_parquet(std::fs::read(&ranged).unwrap().into());
    let exported: BTreeSet<Uuid> = rows.iter().map(|(id, _)| *id).collect();
    assert_eq!(exported, wanted);
    assert!(rows.iter().all(|(_, row)| row.deleted_at == 0));

    // A whole flush of the seeded backlog (batches of 40): two dense batches, read by range; the lake
    // equals the writer's rows.
    let report = rig.flush().await;
    let s = only(&report);
    assert_eq!(
        (s.batches, s.batches_by_range, s.rows_exported),
        (2, 2, 60),
        "{s:?}"
    );
    let (compared, dirty) = oracle::assert_matches(&rig.writer, rig.store.as_ref(), MANIFEST).await;
    assert_eq!((compared, dirty), (60, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_read_ahead_come_out_in_selection_order_each_row_once() {
    // Batch k+1 is read on a second connection while batch k is still being read. With
    // windows of one batch, however the reads interleave, file k holds exactly the k-th run of
    // the dirty slots in (changed_at, row_id) order, every slot is exported and marked once,
    // and no batch beyond --max-batches is read.
    let mut rig = rig(LakeKind::S3).await;
    rig.opts.window_batches = 1;
    let mut r = Rng::new(4242);
    rig.seed(250, &mut r).await;
    let order = dirty_in_selection_order(&rig).await;
    assert_eq!(order.len(), 250);

    // --max-batches bounds the reads too: no batch is read beyond it.
    let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = reads.clone();
    let counting = FlushHooks {
        before_export: Some(Rig::hook(move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async {}.boxed()
        })),
        ..Default::default()
    };
    let mut opts = rig.opts.clone();
    opts.max_batches = Some(0);
    let report = lakecdc::flush::run_with_hooks(&rig.ctx, &opts, &counting)
        .await
        .unwrap();
    assert_eq!(only(&report).batches, 0);
    assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 0);
    opts.max_batches = Some(2);
    let report = lakecdc::flush::run_with_hooks(&rig.ctx, &opts, &counting)
        .await
        .unwrap();
    assert_eq!((only(&report).batches, only(&report).rows_marked), (2, 80));
    assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 2);

    // The first batch's read waits (up to 60 s) until the second batch's read has started:
    // with reads ahead that is at once; read one after the other, it never happens.
    let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
    let second_started = Arc::new(tokio::sync::Notify::new());
    let (seen, started) = (calls.clone(), second_started.clone());
    let hooks = FlushHooks {
        before_export: Some(Arc::new(move |_, ids: Vec<Uuid>| {
            let (seen, started) = (seen.clone(), started.clone());
            async move {
                let first = {
                    let mut calls = seen.lock().unwrap();
                    calls.push(("start", ids[0]));
                    calls.len() == 1
                };
                if first {
                    let _ = tokio::time::timeout(Duration::from_secs(60), started.notified()).await;
                } else {
                    started.notify_one();
                }
                seen.lock().unwrap().push(("end", ids[0]));
            }
            .boxed()
        })),
        ..Default::default()
    };
    let report = rig.flush_with(&hooks).await;
    let s = only(&report);
    assert_eq!(
        (s.batches, s.rows_exported, s.rows_marked, s.rows_left_dirty),
        (5, 170, 170, 0),
        "{s:?}"
    );
    let calls = calls.lock().unwrap().clone();
    // A batch's slots come sorted by row id.
    let second_first = order[120..160].iter().min().copied().unwrap();
    assert_eq!(
        calls[1],
        ("start", second_first),
        "the second batch is read while the first waits: {calls:?}"
    );

    let listed = rig.listed().await;
    assert_eq!(listed.len(), 7);
    for (k, key) in listed.iter().enumerate() {
        let bytes = rig.store.get_bytes(key).await.unwrap().bytes;
        let got: BTreeSet<Uuid> = oracle::read_parquet(bytes)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        let want: BTreeSet<Uuid> = order.iter().skip(k * 40).take(40).copied().collect();
        assert_eq!(got, want, "file {k} ({key})");
    }
    let (compared, dirty) = rig.assert_oracle().await;
    assert_eq!((compared, dirty), (250, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_failing_ahead_leaves_the_committed_batch_marked_and_the_rest_dirty() {
    // The second batch's read fails (its EAV table vanishes once the first batch is
    // committed): the first batch stays listed and marked, every later row stays dirty,
    // nothing else is listed, and a clean retry converges.
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(5151);
    rig.seed(120, &mut r).await;
    rig.opts.window_batches = 1;
    let committed = Arc::new(tokio::sync::Notify::new());
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (url, on_commit, count) = (rig.db.url.clone(), committed.clone(), calls.clone());
    let hooks = FlushHooks {
        before_export: Some(Rig::hook(move || {
            let (url, committed) = (url.clone(), on_commit.clone());
            let second = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 1;
            async move {
                if second {
                    // Bounded: a first batch that is never marked fails the test, not hangs it.
                    tokio::time::timeout(Duration::from_secs(60), committed.notified())
                        .await
                        .expect("the first batch is marked");
                    let c = harness::pg_client(&url).await;
                    c.batch_execute("ALTER TABLE eav_data RENAME TO eav_away")
                        .await
                        .unwrap();
                }
            }
            .boxed()
        })),
        before_mark: Some(Rig::hook(move || {
            committed.notify_one();
            async {}.boxed()
        })),
        ..Default::default()
    };
    let report = rig.flush_with(&hooks).await;
    let s = only(&report);
    assert_eq!(s.outcome, Outcome::Failed, "{s:?}");
    assert_eq!((s.rows_exported, s.rows_marked), (40, 40), "{s:?}");
    assert_eq!(rig.listed().await.len(), 1);
    assert_eq!(oracle::dirty(&rig.writer).await.len(), 80);
    rig.writer
        .client
        .batch_execute("ALTER TABLE eav_away RENAME TO eav_data")
        .await
        .unwrap();
    let retry = rig.flush().await;
    assert_eq!(only(&retry).rows_marked, 80, "{retry:?}");
    let (compared, dirty) = rig.assert_oracle().await;
    assert_eq!((compared, dirty), (120, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_second_connection_batches_are_read_one_after_the_other() {
    // The database refuses new connections just when the second read connection is opened:
    // the reads take turns on the first, and the flush exports and marks every row.
    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(6161);
    rig.seed(120, &mut r).await;
    let db = rig.db.url.rsplit_once('/').unwrap().1.to_string();
    let admin = Arc::new(harness::pg_client(&harness::pg_admin_url()).await);
    let allow = |on: bool| format!("ALTER DATABASE {db} ALLOW_CONNECTIONS {on}");
    let reopened = Arc::new((
        std::sync::atomic::AtomicBool::new(false),
        tokio::sync::Notify::new(),
    ));
    let attempts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (a1, a2, a3) = (admin.clone(), admin.clone(), attempts.clone());
    let (refuse, reopen) = (allow(false), allow(true));
    let (r1, r2) = (reopened.clone(), reopened.clone());
    let counted = reads.clone();
    let hooks = FlushHooks {
        before_second_connection: Some(Rig::hook(move || {
            a3.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let (admin, sql) = (a1.clone(), refuse.clone());
            async move { admin.batch_execute(&sql).await.unwrap() }.boxed()
        })),
        // The second batch's read runs once the refused connection has been given up:
        // connections are allowed again, for the mark.
        before_export: Some(Rig::hook(move || {
            let second = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 1;
            let (admin, sql, reopened) = (a2.clone(), reopen.clone(), r1.clone());
            async move {
                if second {
                    admin.batch_execute(&sql).await.unwrap();
                    reopened.0.store(true, std::sync::atomic::Ordering::SeqCst);
                    reopened.1.notify_one();
                }
            }
            .boxed()
        })),
        before_mark: Some(Rig::hook(move || {
            let reopened = r2.clone();
            async move {
                if !reopened.0.load(std::sync::atomic::Ordering::SeqCst) {
                    let wait = reopened.1.notified();
                    let _ = tokio::time::timeout(Duration::from_secs(30), wait).await;
                }
            }
            .boxed()
        })),
    };
    let report = rig.flush_with(&hooks).await;
    admin.batch_execute(&allow(true)).await.unwrap();
    let s = only(&report);
    assert_eq!(s.outcome, Outcome::Flushed, "{s:?}");
    assert_eq!(
        (s.batches, s.rows_exported, s.rows_marked, s.rows_left_dirty),
        (3, 120, 120, 0),
        "{s:?}"
    );
    assert_eq!(attempts.load(std::sync::atomic::Ordering::SeqCst), 1);
    let (compared, dirty) = rig.assert_oracle().await;
    assert_eq!((compared, dirty), (120, 0));
}

/// The row ids of `files`, read from the lake, each file checked to be sorted by row id.
async fn ids_of_sorted_files(rig: &Rig, files: &[lakecdc::flush::FileReport]) -> Vec<Uuid> {
    let mut exported = Vec::new();
    for f in files {
        let rows = oracle::read_parquet(rig.store.get_bytes(&f.path).await.unwrap().bytes);
        let ids: Vec<Uuid> = rows.iter().map(|(id, _)| *id).collect();
        assert!(ids.is_sorted(), "a file is sorted by row id");
        exported.extend(ids);
    }
    exported
}

/// Lets the rig's database accept connections again.
async fn allow_connections(rig: &Rig, admin: &tokio_postgres::Client) {
    let db = rig.db.url.rsplit_once('/').unwrap().1;
    admin
        .batch_execute(&format!("ALTER DATABASE {db} ALLOW_CONNECTIONS true"))
        .await
        .unwrap();
}

/// Flush hooks whose first `before_second_connection` call makes the rig's database refuse new
/// connections and whose second call allows them again; the count of calls.
fn refusing_connections_once(
    rig: &Rig,
    admin: Arc<tokio_postgres::Client>,
) -> (FlushHooks, Arc<std::sync::atomic::AtomicUsize>) {
    let db = rig.db.url.rsplit_once('/').unwrap().1.to_string();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = calls.clone();
    let hooks = FlushHooks {
        before_second_connection: Some(Rig::hook(move || {
            let first = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
            let sql = format!("ALTER DATABASE {db} ALLOW_CONNECTIONS {}", !first);
            let admin = admin.clone();
            async move { admin.batch_execute(&sql).await.unwrap() }.boxed()
        })),
        ..FlushHooks::default()
    };
    (hooks, calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_heap_pass_that_cannot_open_its_connections_fails_before_reading_and_a_rerun_converges() {
    // docs/design.md §4.1, "Heap passes": the pass opens its sessions before it exports a
    // snapshot. Asked for explicitly (--read-order heap), a refused connection fails the run
    // with the server's reason, nothing published or marked; the next run flushes everything.
    let mut rig = rig(LakeKind::S3).await;
    rig.opts.read_order = ReadOrder::Heap;
    let mut r = Rng::new(5330);
    rig.seed(30, &mut r).await;
    let admin = Arc::new(harness::pg_client(&harness::pg_admin_url()).await);
    let (hooks, calls) = refusing_connections_once(&rig, admin.clone());
    let report = rig.flush_with(&hooks).await;
    allow_connections(&rig, &admin).await;
    let s = only(&report);
    assert_eq!(s.outcome, Outcome::Failed, "{s:?}");
    assert!(
        s.reason
            .as_deref()
            .unwrap()
            .contains("not currently accepting connections"),
        "{s:?}"
    );
    assert_eq!(
        (s.table_scans, s.batches, s.rows_exported, s.rows_marked),
        (0, 0, 0, 0),
        "{s:?}"
    );
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(
        rig.store.list("data/").await.unwrap().is_empty(),
        "nothing is uploaded"
    );
    assert_eq!(dirty_in_selection_order(&rig).await.len(), 30);
    let again = rig.flush().await;
    let s = only(&again);
    assert_eq!(
        (s.table_scans, s.rows_by_scan, s.rows_marked),
        (1, 30, 30),
        "{s:?}"
    );
    let (compared, dirty) = rig.assert_oracle().await;
    assert_eq!((compared, dirty), (30, 0));
}

/// Loads 100,000 entities of random ids, every one dirty, then runs `then` (the statistics
/// the test wants).
async fn load_random_backlog(rig: &Rig, then: &str) {
    rig.writer
        .client
        .batch_execute(&format!(
            "INSERT INTO entity_main (ltbase_schema_id, ltbase_row_id, ltbase_created_at, \
             ltbase_updated_at, text_01) \
             SELECT 100, gen_random_uuid(), 1000 + i, 1000 + i, 'c' || i \
             FROM generate_series(1, 100000) AS i; \
             INSERT INTO change_log (schema_id, row_id, changed_at) \
             SELECT 100, ltbase_row_id, ltbase_updated_at FROM entity_main; {then}"
        ))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_automatic_heap_pass_without_its_connections_reads_by_windows() {
    // docs/design.md §4.1, "Heap passes": a backlog of scattered ids large enough for `auto` to
    // choose a pass (100,000 random ids, all of them dirty); the database refuses the pass's
    // sessions, so the run reads by windows on its own connection instead, and every row is
    // exported and marked.
    let rig = rig(LakeKind::Local).await;
    load_random_backlog(&rig, "ANALYZE entity_main; ANALYZE change_log;").await;
    let admin = Arc::new(harness::pg_client(&harness::pg_admin_url()).await);
    let (hooks, calls) = refusing_connections_once(&rig, admin.clone());
    let report = flush_in_batches(&rig, 25_000, &hooks).await;
    allow_connections(&rig, &admin).await;
    let s = only(&report);
    assert_eq!(s.outcome, Outcome::Flushed, "{s:?}");
    assert_eq!(
        (
            s.table_scans,
            s.rows_by_scan,
            s.rows_exported,
            s.rows_marked,
            s.rows_left_dirty
        ),
        (0, 0, 100_000, 100_000, 0),
        "{s:?}"
    );
    // The pass's sessions, then the windows' second read connection.
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(ids_of_sorted_files(&rig, &s.files).await.len(), 100_000);
    assert!(dirty_in_selection_order(&rig).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_table_never_analysed_is_read_in_heap_order_by_a_sample_of_its_order() {
    // docs/design.md §4.2, "Without statistics": a bulk load of 100,000 random ids before any
    // ANALYZE leaves no correlation in pg_stats and no reltuples; `auto` measures both from a
    // page sample and reads the backlog in one heap pass (without it: by windows).
    let rig = rig(LakeKind::Local).await;
    for table in ["entity_main", "eav_data"] {
        rig.writer
            .client
            .batch_execute(&format!(
                "ALTER TABLE {table} SET (autovacuum_enabled = false)"
            ))
            .await
            .unwrap();
    }
    load_random_backlog(&rig, "ANALYZE change_log;").await;
    let unanalysed = rig
        .writer
        .client
        .query_one(
            "SELECT (SELECT count(*) FROM pg_stats WHERE tablename = 'entity_main'), \
             (SELECT reltuples FROM pg_class WHERE relname = 'entity_main')::float8",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(unanalysed.get::<_, i64>(0), 0, "no statistics");
    assert!(unanalysed.get::<_, f64>(1) <= 0.0, "no row count");
    let opts = FlushOptions {
        batch_size: 25_000,
        ..rig.opts.clone()
    };
    let report = lakecdc::flush::run(&rig.ctx, &opts).await.unwrap();
    let s = only(&report);
    assert_eq!(s.outcome, Outcome::Flushed, "{s:?}");
    assert_eq!(
        (
            s.table_scans,
            s.rows_by_scan,
            s.rows_exported,
            s.rows_marked
        ),
        (1, 100_000, 100_000, 100_000),
        "{s:?}"
    );
    assert_eq!(s.files.len(), 4, "{s:?}");
    assert_eq!(ids_of_sorted_files(&rig, &s.files).await.len(), 100_000);
    assert!(dirty_in_selection_order(&rig).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_mark_locks_slots_in_row_id_order_as_batch_writers_do() {
    // docs/hazards.md #554: application batch writers lock rows in (schema_id, row_id) order; a mark
    // taking them in another order can hold one a writer needs while waiting for one it holds.
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(554);
    let ids = rig.seed(2, &mut r).await;
    let (low, high) = (ids[0].min(ids[1]), ids[0].max(ids[1]));
    // The lower row is written last, so the selection (changed_at order) lists it second.
    rig.writer.update(low, Customer::random(&mut r)).await;
    // An application transaction holds the lower row's dirty slot.
    let app = rig.db.client().await;
    app.batch_execute("BEGIN").await.unwrap();
    let slot = "SELECT 1 FROM change_log WHERE schema_id = 100 AND row_id = $1 \
                AND flushed_at = 0 FOR UPDATE";
    assert_eq!(app.execute(slot, &[&low]).await.unwrap(), 1);
    let (ctx, opts) = (rig.ctx.clone(), rig.opts.clone());
    let flush = tokio::spawn(async move { lakecdc::flush::run(&ctx, &opts).await });
    // Until the mark waits for that slot.
    let watcher = rig.db.client().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND wait_event_type = 'Lock' AND query LIKE 'UPDATE%'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the mark never waited"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The writer goes on to the higher row, as a batch writer does: the mark must not hold it.
    let nowait = format!("{slot} NOWAIT");
    let got = app.execute(nowait.as_str(), &[&high]).await;
    assert!(
        got.is_ok(),
        "the mark locked the higher row before the lower one: {got:?}"
    );
    app.batch_execute("ROLLBACK").await.unwrap();
    let report = flush.await.unwrap().unwrap();
    assert_eq!(only(&report).rows_marked, 2);
    assert!(oracle::dirty(&rig.writer).await.is_empty());
    assert_eq!(rig.assert_oracle().await, (2, 0));
}

/// Seeds 30 rows and has an application transaction lock the fifth slot of the first batch
/// of [`one_batch_windows`]. Returns the slots in selection order and the application's
/// connection, in its transaction.
async fn a_locked_slot(rig: &mut Rig, seed: u64) -> (Vec<Uuid>, tokio_postgres::Client) {
    let mut r = Rng::new(seed);
    rig.seed(30, &mut r).await;
    let order = dirty_in_selection_order(rig).await;
    let app = rig.db.client().await;
    app.batch_execute("BEGIN").await.unwrap();
    let slot = "SELECT 1 FROM change_log WHERE schema_id = 100 AND row_id = $1 \
                AND flushed_at = 0 FOR UPDATE";
    assert_eq!(app.execute(slot, &[&order[4]]).await.unwrap(), 1);
    (order, app)
}

/// Flush options of windows of one batch: batch k holds the k-th run of ten slots in
/// selection order.
fn one_batch_windows(rig: &Rig) -> FlushOptions {
    FlushOptions {
        batch_size: 10,
        window_batches: 1,
        ..rig.opts.clone()
    }
}

/// [`a_locked_slot`], then a flush of [`one_batch_windows`] started behind it.
async fn flush_behind_a_locked_slot(
    rig: &mut Rig,
    seed: u64,
) -> (
    Vec<Uuid>,
    tokio_postgres::Client,
    tokio::task::JoinHandle<lakecdc::error::Result<lakecdc::flush::FlushReport>>,
) {
    let (order, app) = a_locked_slot(rig, seed).await;
    let (ctx, opts) = (rig.ctx.clone(), one_batch_windows(rig));
    let flush = tokio::spawn(async move { lakecdc::flush::run(&ctx, &opts).await });
    (order, app, flush)
}

#[tokio::test]
async fn a_mark_waiting_on_a_row_lock_does_not_hold_back_the_next_batchs_mark() {
    // docs/design.md §4.1, "Pipelining": a batch's mark runs on a second mark connection while
    // the one before it is still running. The first batch's mark waits for a slot an
    // application transaction holds; the second batch's lands meanwhile.
    let mut rig = rig(LakeKind::S3).await;
    let (order, app, flush) = flush_behind_a_locked_slot(&mut rig, 2).await;
    let (first, second) = (order[..10].to_vec(), order[10..20].to_vec());
    let watcher = rig.db.client().await;
    let marked = |ids: Vec<Uuid>| {
        let w = &watcher;
        async move {
            let n: i64 = w
                .query_one(
                    "SELECT count(*) FROM change_log WHERE schema_id = 100 \
                     AND row_id = ANY($1) AND flushed_at > 0",
                    &[&ids],
                )
                .await
                .unwrap()
                .get(0);
            n
        }
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while marked(second.clone()).await < 10 {
        assert!(
            std::time::Instant::now() < deadline,
            "the second batch was not marked while the first batch's mark waited"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The first batch's mark is one statement, still waiting: none of its slots is marked.
    assert_eq!(marked(first.clone()).await, 0);
    assert!(!flush.is_finished());
    app.batch_execute("ROLLBACK").await.unwrap();
    let report = flush.await.unwrap().unwrap();
    let s = only(&report);
    assert_eq!((s.batches, s.rows_marked, s.rows_left_dirty), (3, 30, 0));
    assert_eq!(marked(order.clone()).await, 30);
    assert!(oracle::dirty(&rig.writer).await.is_empty());
    assert_eq!(rig.assert_oracle().await, (30, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_mark_fails_the_run_but_the_next_batch_is_still_marked() {
    // docs/design.md §4.1, "Pipelining": the first batch's mark waits for a slot an
    // application transaction holds and its session is then ended. The run fails, but the
    // batch committed after it (waiting for a connection) is marked on a new one; only the
    // first batch's rows stay dirty (exported again next time: a duplicate, never a loss).
    let mut rig = rig(LakeKind::Local).await;
    let (order, app, flush) = flush_behind_a_locked_slot(&mut rig, 4).await;
    let (watcher, admin) = (
        rig.db.client().await,
        harness::pg_client(&harness::pg_admin_url()).await,
    );
    // The first batch's mark, waiting for the application's lock, once the second batch's
    // mark has landed (the third batch then waits for a free connection).
    let waiting = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
                   AND wait_event_type = 'Lock' AND query LIKE 'UPDATE%flushed_at%'";
    let marked = "SELECT count(*) FROM change_log WHERE schema_id = 100 AND flushed_at > 0";
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let pid: i32 = loop {
        let n: i64 = watcher.query_one(marked, &[]).await.unwrap().get(0);
        let rows = watcher.query(waiting, &[]).await.unwrap();
        if n == 10 && rows.len() == 1 {
            break rows[0].get(0);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the first batch's mark never waited alone ({n} marked, {} waiting)",
            rows.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    let report = flush.await.unwrap().unwrap();
    app.batch_execute("ROLLBACK").await.unwrap();
    let s = only(&report);
    assert_eq!(s.outcome, Outcome::Failed, "{s:?}");
    assert_eq!(
        (s.batches, s.rows_exported, s.rows_marked, s.rows_left_dirty),
        (3, 30, 20, 10),
        "{s:?}"
    );
    // The first batch's ten slots stay dirty; the second's and the third's are marked.
    assert_eq!(
        oracle::dirty(&rig.writer).await,
        order[..10].iter().copied().collect()
    );
    // The next run exports them again and the lake equals the database.
    let again = lakecdc::flush::run(&rig.ctx, &rig.opts).await.unwrap();
    assert_eq!(only(&again).rows_marked, 10);
    assert_eq!(rig.assert_oracle().await, (30, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_second_mark_connection_leaves_the_marks_taking_turns() {
    // docs/design.md §4.1, "Pipelining": the first batch's mark waits for a slot an
    // application transaction holds, so the second batch's mark asks for a connection of its
    // own; the database refuses it. The run does not fail: the marks take turns on the first.
    let mut rig = rig(LakeKind::Local).await;
    let (_, app) = a_locked_slot(&mut rig, 3).await;
    let app = Arc::new(app);
    let db = rig.db.url.rsplit_once('/').unwrap().1.to_string();
    let admin = Arc::new(harness::pg_client(&harness::pg_admin_url()).await);
    let marks = Arc::new(AtomicUsize::new(0));
    let (a1, app1, counted) = (admin.clone(), app.clone(), marks.clone());
    let hooks = FlushHooks {
        // Before the second batch's mark: no new connection from now on; the application
        // ends its transaction a little later, once that mark has asked for one.
        before_mark: Some(Rig::hook(move || {
            let second = counted.fetch_add(1, AtomicOrdering::SeqCst) == 1;
            let (admin, app, db) = (a1.clone(), app1.clone(), db.clone());
            async move {
                if second {
                    let refuse = format!("ALTER DATABASE {db} ALLOW_CONNECTIONS false");
                    admin.batch_execute(&refuse).await.unwrap();
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        app.batch_execute("ROLLBACK").await.unwrap();
                    });
                }
            }
            .boxed()
        })),
        ..FlushHooks::default()
    };
    let opts = one_batch_windows(&rig);
    let report = lakecdc::flush::run_with_hooks(&rig.ctx, &opts, &hooks).await;
    allow_connections(&rig, &admin).await;
    let report = report.unwrap();
    let s = only(&report);
    assert_eq!(s.outcome, Outcome::Flushed, "{s:?}");
    assert_eq!(
        (s.batches, s.rows_marked, s.rows_left_dirty),
        (3, 30, 0),
        "{s:?}"
    );
    assert_eq!(marks.load(AtomicOrdering::SeqCst), 3);
    assert!(oracle::dirty(&rig.writer).await.is_empty());
    assert_eq!(rig.assert_oracle().await, (30, 0));
}

#[tokio::test]
async fn equal_versions_across_batch_boundaries_are_exported_once_each() {
    // docs/hazards.md #183: the selection pages on (changed_at, row_id); a page boundary inside a run
    // of equal changed_at values must neither skip nor repeat a row.
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(183);
    let ids = rig.seed(90, &mut r).await;
    // Three shared versions, 30 rows each, above every earlier one (the writer contract:
    // change_log.changed_at = ltbase_updated_at).
    rig.writer
        .client
        .batch_execute(
            "UPDATE change_log c SET changed_at = s.top + 1000 + s.n % 3 \
             FROM (SELECT row_id, row_number() OVER (ORDER BY row_id) AS n, \
                          max(changed_at) OVER () AS top \
                   FROM change_log WHERE flushed_at = 0) s \
             WHERE c.row_id = s.row_id AND c.flushed_at = 0; \
             UPDATE entity_main m SET ltbase_updated_at = c.changed_at FROM change_log c \
             WHERE c.row_id = m.ltbase_row_id AND c.flushed_at = 0",
        )
        .await
        .unwrap();
    // Windows of 14 slots, each cut into two batches of 7: window boundaries fall inside the
    // runs of equal versions.
    rig.opts.batch_size = 7;
    rig.opts.window_batches = 2;
    let report = rig.flush().await;
    let s = only(&report);
    assert_eq!((s.rows_exported, s.rows_left_dirty), (90, 0), "{s:?}");
    assert_eq!(
        s.files.len(),
        13,
        "six windows of two batches and one of 6 rows"
    );
    // Window after window in (changed_at, row_id) order, every row exactly once; within a
    // window, batch after batch in row-id order.
    let mut last: Option<(i64, Uuid)> = None;
    let mut seen = BTreeSet::new();
    for window in s.files.chunks(2) {
        let mut keys: Vec<(i64, Uuid)> = Vec::new();
        let mut ids_by_batch: Vec<Vec<Uuid>> = Vec::new();
        for f in window {
            let rows = oracle::read_parquet(rig.store.get_bytes(&f.path).await.unwrap().bytes);
            keys.extend(rows.iter().map(|(id, r)| (r.changed_at, *id)));
            let mut ids: Vec<Uuid> = rows.iter().map(|(id, _)| *id).collect();
            ids.sort();
            ids_by_batch.push(ids);
        }
        if let [a, b] = &ids_by_batch[..] {
            assert!(
                a.last() < b.first(),
                "the window's batches are cut in row-id order"
            );
        }
        keys.sort();
        assert!(
            last.is_none_or(|l| l < keys[0]),
            "{} starts at or before the previous window's end",
            window[0].path
        );
        last = keys.last().copied();
        for (_, id) in keys {
            assert!(seen.insert(id), "{id} exported twice");
        }
    }
    assert_eq!(seen, ids.iter().copied().collect::<BTreeSet<_>>());
    assert!(oracle::dirty(&rig.writer).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_rewritten_after_its_window_was_selected_is_exported_at_its_new_version_once() {
    // docs/hazards.md #45: a window's later batches read their slots again in their own
    // snapshots; a slot rewritten in between has moved to a newer tuple, is not read with its
    // old batch, and goes out once, at its new version, with a later window.
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(4545);
    rig.seed(60, &mut r).await;
    rig.opts.batch_size = 10;
    rig.opts.window_batches = 3;
    let order = dirty_in_selection_order(&rig).await;
    // The first window is the 30 oldest slots; its largest row id is in its third batch.
    let victim = order[..30].iter().max().copied().unwrap();
    let writer = rig.second_writer().await;
    let (w2, fired) = (
        writer.clone(),
        Arc::new(std::sync::atomic::AtomicBool::new(false)),
    );
    let f2 = fired.clone();
    let hooks = FlushHooks {
        before_export: Some(Rig::hook(move || {
            let (w, f) = (w2.clone(), f2.clone());
            async move {
                if !f.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    let mut r = Rng::new(46);
                    w.lock()
                        .await
                        .update(victim, Customer::random(&mut r))
                        .await;
                }
            }
            .boxed()
        })),
        ..Default::default()
    };
    let report = rig.flush_with(&hooks).await;
    assert!(fired.load(std::sync::atomic::Ordering::SeqCst));
    rig.take_model(&writer).await;
    let s = only(&report);
    assert_eq!((s.rows_exported, s.rows_left_dirty), (60, 0), "{s:?}");
    let new_version = rig.writer.rows[&victim].version;
    let mut copies = Vec::new();
    for (k, f) in s.files.iter().enumerate() {
        let rows = oracle::read_parquet(rig.store.get_bytes(&f.path).await.unwrap().bytes);
        for (id, row) in rows {
            if id == victim {
                copies.push((k, row.changed_at));
            }
        }
    }
    assert_eq!(copies.len(), 1, "{copies:?}");
    let (file, version) = copies[0];
    assert_eq!(version, new_version);
    assert!(
        file >= 3,
        "exported with a later window, not in file {file}"
    );
    assert_eq!(rig.assert_oracle().await, (60, 0));
}

/// The dirty slots' row ids in `(changed_at, row_id)` order.
async fn dirty_in_selection_order(rig: &Rig) -> Vec<Uuid> {
    dirty_ids(rig, "changed_at, row_id").await
}

/// The dirty slots' row ids, ordered by `order` (an `ORDER BY` list).
async fn dirty_ids(rig: &Rig, order: &str) -> Vec<Uuid> {
    let sql = format!("SELECT row_id FROM change_log WHERE flushed_at = 0 ORDER BY {order}");
    let rows = rig.writer.client.query(&sql, &[]).await.unwrap();
    rows.iter().map(|row| row.get(0)).collect()
}

/// Hooks that once, at `window` (`before_export` or `before_mark`), update `a`, hard-delete
/// `b` and create `newcomer` through `writer`.
fn rewrite_once(
    window: &str,
    writer: Arc<tokio::sync::Mutex<Writer>>,
    (a, b, newcomer): (Uuid, Uuid, Uuid),
) -> FlushHooks {
    let hook = Rig::hook(move || {
        let w = writer.clone();
        async move {
            let mut w = w.lock().await;
            if w.rows.contains_key(&newcomer) {
                return; // only once
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            let mut r = Rng::new(7);
            w.update(a, Customer::random(&mut r)).await;
            w.hard_delete(b).await;
            w.create(newcomer, Customer::random(&mut r)).await;
        }
        .boxed()
    });
    match window {
        "before_export" => FlushHooks {
            before_export: Some(hook),
            ..Default::default()
        },
        _ => FlushHooks {
            before_mark: Some(hook),
            ..Default::default()
        },
    }
}

/// One flush of `rig` in batches of `batch_size` slots, with `hooks`.
async fn flush_in_batches(rig: &Rig, batch_size: i64, hooks: &FlushHooks) -> FlushReport {
    let opts = FlushOptions {
        batch_size,
        ..rig.opts.clone()
    };
    lakecdc::flush::run_with_hooks(&rig.ctx, &opts, hooks)
        .await
        .unwrap()
}

/// Asserts each row of `models` is in `rows` live, at its model's version and values.
fn assert_as_before<const N: usize>(
    rows: &BTreeMap<Uuid, oracle::LakeRow>,
    models: [(Uuid, &crate::support::writer::ModelRow); N],
    window: &str,
) {
    for (id, model) in models {
        let row = &rows[&id];
        assert_eq!(
            (row.changed_at, row.deleted_at),
            (model.version, 0),
            "{window}: {id}"
        );
        for (col, want) in model.value.expected() {
            assert_eq!(row.columns.get(col), Some(&want), "{window}: {id} {col}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flush_whose_lock_session_ends_publishes_no_further_batch_and_a_rerun_converges() {
    // docs/hazards.md L68: the database ends the session holding the schema's lock while the
    // run reads its third batch. From then on another run may take the lock and flush the
    // schema, so no further batch is published: its staged delta is deleted, its rows stay
    // dirty, and the run fails naming the lost lock. What was published before stays listed
    // and marked; the next run exports the rest.
    let mut rig = rig(LakeKind::S3).await;
    rig.opts.batch_size = 40;
    rig.opts.window_batches = 1;
    let mut r = Rng::new(6801);
    rig.seed(200, &mut r).await;
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let ended = Arc::new(std::sync::Mutex::new(None::<i32>));
    let url = rig.db.url.clone();
    let (counted, holder) = (calls.clone(), ended.clone());
    let hooks = FlushHooks {
        before_export: Some(Rig::hook(move || {
            let (counted, holder, url) = (counted.clone(), holder.clone(), url.clone());
            async move {
                if counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) != 2 {
                    return;
                }
                // Recorded first: the run may notice its lock's session gone and drop this
                // read before the helper returns.
                *holder.lock().unwrap() = Some(0);
                let pid = harness::end_lock_session(&url, 100).await;
                *holder.lock().unwrap() = Some(pid);
            }
            .boxed()
        })),
        ..Default::default()
    };
    let report = rig.flush_with(&hooks).await;
    assert!(
        ended.lock().unwrap().is_some(),
        "the hook ended the lock's session"
    );
    let s = only(&report);
    assert_eq!(s.outcome, Outcome::Failed, "{s:?}");
    let reason = s.reason.as_deref().unwrap();
    assert!(
        reason.contains("the lock of schema 100 was lost") && reason.contains("no longer holds"),
        "{reason}"
    );
    // Only listed deltas are left (the unpublished one was deleted, no staging object is
    // left), each listed batch is marked, and every other row is still dirty.
    let listed = rig.listed().await;
    assert!(
        listed.len() < 5,
        "no batch is published after the lock is lost: {listed:?}"
    );
    assert_eq!(rig.keys("data/").await, listed);
    let mut exported = BTreeSet::new();
    for key in &listed {
        let bytes = rig.store.get_bytes(key).await.unwrap().bytes;
        for (id, _) in oracle::read_parquet(bytes) {
            assert!(exported.insert(id), "{id} exported twice");
        }
    }
    assert_eq!(s.rows_marked as usize, exported.len(), "{s:?}");
    let dirty: BTreeSet<Uuid> = dirty_in_selection_order(&rig).await.into_iter().collect();
    assert_eq!(dirty.len(), 200 - exported.len());
    assert!(dirty.is_disjoint(&exported));

    let again = rig.flush().await;
    let s = only(&again);
    assert_eq!(s.outcome, Outcome::Flushed, "{s:?}");
    assert_eq!(s.rows_marked as usize, dirty.len(), "{s:?}");
    let (compared, left) = rig.assert_oracle().await;
    assert_eq!((compared, left), (200, 0));
}

#[tokio::test]
async fn a_numeric_eav_value_beyond_a_double_is_exported_as_its_nearest_double() {
    // docs/design.md §2 allows `eav_data.value_numeric NUMERIC`; docs/hazards.md L80. The plain
    // cast to float8 fails on 1e400 or 1e-400 and with it every read of the schema until the
    // row changes. Each read path (the windows' snapshot reads, a heap pass, init in row-id
    // and in heap order) exports the nearest double instead.
    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(4400);
    let ids = rig.seed(12, &mut r).await;
    let ids: Vec<Uuid> = ids
        .into_iter()
        .filter(|id| !rig.writer.rows[id].soft_deleted)
        .take(6)
        .collect();
    assert_eq!(ids.len(), 6);
    assert!(!rig.flush().await.failed());
    let admin = rig.db.client().await;
    admin
        .batch_execute("ALTER TABLE eav_data ALTER COLUMN value_numeric TYPE numeric")
        .await
        .unwrap();
    let values = [
        ("1e400", f64::INFINITY),
        ("-1e400", f64::NEG_INFINITY),
        ("1e-400", 0.0),
        ("-1.5e-330", 0.0),
        ("NaN", f64::NAN),
        ("12.5", 12.5),
    ];
    let set = "INSERT INTO eav_data (schema_id, row_id, attr_id, array_indices, value_numeric) \
               VALUES (100, $1, 14, '', $2::text::numeric) \
               ON CONFLICT (schema_id, row_id, attr_id, array_indices) \
               DO UPDATE SET value_numeric = EXCLUDED.value_numeric, value_text = NULL";
    let assert_lake = |state: &BTreeMap<Uuid, oracle::LakeRow>, how: &str| {
        for ((text, want), id) in values.iter().zip(&ids) {
            let got = &state[id].columns["balance"];
            let oracle::V::F(got) = got else {
                panic!("{how}: {text} became {got:?}")
            };
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{how}: {text} became {got}, not {want}"
            );
        }
    };
    for order in [ReadOrder::RowId, ReadOrder::Heap] {
        for ((text, _), id) in values.iter().zip(&ids) {
            admin.execute(set, &[id, text]).await.unwrap();
            rig.writer.restamp_ahead(*id, 0).await;
        }
        rig.opts.read_order = order;
        let report = rig.flush().await;
        let s = only(&report);
        assert_eq!(
            (s.outcome, s.rows_marked),
            (Outcome::Flushed, 6),
            "{order:?}: {s:?}"
        );
        let state = oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
        assert_lake(&state, &format!("flush, {order:?}"));
    }
    for order in [ReadOrder::RowId, ReadOrder::Heap] {
        let o = lakecdc::init::InitOptions {
            schemas: vec!["customer".into()],
            work_dir: rig.opts.work_dir.clone(),
            replace_delta: true,
            read_order: order,
            ..Default::default()
        };
        let report = lakecdc::init::run(&rig.ctx, &o).await.unwrap();
        assert_eq!(report.exit_code(), 0, "{order:?}: {report:?}");
        let state = oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
        assert_lake(&state, &format!("init, {order:?}"));
    }
}

#[tokio::test]
async fn an_idle_run_still_reaches_the_lake_and_fails_on_a_missing_bucket() {
    // docs/hazards.md L104: a run with nothing to flush made no request, so a missing bucket
    // or a wrong key exited 0 until the first run with work.
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(44);
    rig.seed(3, &mut r).await;
    rig.flush().await;
    let calls = rig.store.calls().len();
    let idle = rig.flush().await;
    assert!(!idle.failed(), "{idle:?}");
    let since = &rig.store.calls()[calls..];
    assert_eq!(since.len(), 1, "{since:?}");
    assert_eq!(since[0].op, Op::GetRange, "{since:?}");
    let missing =
        lakecdc::store::s3::S3Store::connect(&harness::s3_options("lakecdc-absent-bucket")).await;
    let ctx = lakecdc::job::Context {
        lake: lakecdc::lake::Lake {
            store: Arc::new(missing),
            layout: rig.ctx.lake.layout.clone(),
        },
        ..rig.job_context()
    };
    let err = lakecdc::flush::run(&ctx, &rig.opts).await.unwrap_err();
    assert!(err.chain().contains("does not exist"), "{}", err.chain());
    assert!(err.chain().contains("reach the lake"), "{}", err.chain());
}

#[tokio::test]
async fn a_dry_run_keeps_no_real_run_out_of_the_schema() {
    // docs/hazards.md L106: a dry run held the schema lock while it planned, so the real
    // run beside it reported the schema `locked` (and a dry gc made gc exit 3).
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(106);
    rig.seed(30, &mut r).await;
    rig.opts.dry_run = true;
    // In heap order the plan opens its sessions (the hook) while a real run holds the lock.
    rig.opts.read_order = ReadOrder::Heap;
    let connector = rig.ctx.connector.clone();
    let free = Arc::new(AtomicUsize::new(0));
    let seen = free.clone();
    let hooks = FlushHooks {
        before_second_connection: Some(Arc::new(move |schema_id, _| {
            let (connector, seen) = (connector.clone(), seen.clone());
            async move {
                let lock = lakecdc::source::SchemaLock::try_acquire(&connector, schema_id)
                    .await
                    .unwrap();
                if let Some(lock) = lock {
                    seen.fetch_add(1, AtomicOrdering::SeqCst);
                    lock.release().await.unwrap();
                }
            }
            .boxed()
        })),
        ..Default::default()
    };
    let report = rig.flush_with(&hooks).await;
    assert_eq!(only(&report).outcome, Outcome::Flushed, "{report:?}");
    assert_eq!(
        free.load(AtomicOrdering::SeqCst),
        1,
        "the plan held the lock"
    );
    // A schema another run holds is still `locked` for the plan, as for the run.
    let held = lakecdc::source::SchemaLock::try_acquire(&rig.ctx.connector, CUSTOMER)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(only(&rig.flush().await).outcome, Outcome::Locked);
    held.release().await.unwrap();
    // gc's and init's plans give the lock back as well: a real gc right after runs.
    let gc = lakecdc::gc::GcOptions {
        schemas: vec!["customer".into()],
        grace: Duration::from_secs(15 * 60),
        dry_run: true,
        repair: false,
        settle_rows: lakecdc::gc::SETTLE_ROWS,
    };
    let planned = lakecdc::gc::run(&rig.job_context(), &gc).await.unwrap();
    assert_ne!(
        planned.schemas[0].outcome,
        Some(lakecdc::gc::Outcome::Locked)
    );
    assert_eq!(planned.exit_code(), 0, "{planned:?}");
}
