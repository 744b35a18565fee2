//! `lakecdc compact` on SeaweedFS: the lake's state is identical before and after and equals
//! PostgreSQL; every compaction hazard of docs/hazards.md; a concurrent flush during a rewrite.

use std::sync::Arc;

use bytes::Bytes;
use futures::FutureExt;
use lakecdc::compact::{CompactOptions, Decision, Hook, Outcome};
use lakecdc::job::Context;
use lakecdc::lake::KeyKind;
use lakecdc::store::{ObjectStore, PutMode};

use crate::support::oracle;
use crate::support::rig::{LakeKind, Rig, rig};
use crate::support::writer::{Customer, Rng};

const MANIFEST: &str = "manifest/100.json";

/// Compaction of the test schema. New bases line up with base row groups of any size, so that
/// the copying of unchanged column chunks runs on these small files too.
pub fn opts(rig: &Rig) -> CompactOptions {
    CompactOptions {
        schemas: vec!["customer".into()],
        work_dir: rig.opts.work_dir.clone(),
        min_repeat_rows: 1,
        ..CompactOptions::default()
    }
}

async fn compact(rig: &Rig, o: &CompactOptions) -> lakecdc::compact::SchemaCompact {
    let report = lakecdc::compact::run(&rig.job_context(), o).await.unwrap();
    report.schemas.into_iter().next().unwrap()
}

/// A lake with a base tier (promoted) and a delta tier over it.
pub async fn lake_with_base_and_deltas(seed: u64) -> (Rig, Rng) {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(seed);
    rig.seed(120, &mut r).await;
    rig.flush().await;
    let promote = CompactOptions {
        max_deltas: 0,
        ..opts(&rig)
    };
    let s = compact(&rig, &promote).await;
    assert_eq!(s.plan.as_ref().unwrap().decision, Decision::Promote);
    // Promoted in place: the deltas are listed as bases, nothing is written.
    assert_eq!((s.files_in, s.files_out, s.rows_out), (3, 0, 0), "{s:?}");
    for _ in 0..60 {
        rig.writer.random_op(&mut r).await;
    }
    // Deletes of rows that live in the base, and a delete → recreate.
    let ids: Vec<_> = rig.writer.rows.keys().copied().take(3).collect();
    rig.writer.hard_delete(ids[0]).await;
    rig.writer.hard_delete(ids[1]).await;
    rig.writer.create(ids[1], Customer::random(&mut r)).await;
    rig.flush().await;
    (rig, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rewrite_keeps_the_lake_state_and_retires_its_sources() {
    let (rig, _) = lake_with_base_and_deltas(5).await;
    let before = oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
    let sources = rig.listed().await;
    assert!(sources.len() > 2);
    let s = compact(&rig, &opts(&rig)).await;
    assert_eq!(s.outcome, Outcome::Done, "{s:?}");
    assert_eq!(s.plan.as_ref().unwrap().decision, Decision::Rewrite);
    assert_eq!((s.files_in, s.files_out), (sources.len(), 1));
    let after = oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
    assert_eq!(after, before, "compaction changed the lake's state");
    let (compared, dirty) = rig.assert_oracle().await;
    assert_eq!(dirty, 0);
    assert_eq!(compared, after.len());
    // One base, UUID-named; every source still exists (#461) and is recorded as retired.
    let listed = rig.listed().await;
    assert_eq!(listed.len(), 1);
    assert!(matches!(
        rig.ctx.lake.layout.classify(&listed[0]),
        KeyKind::MergedBase { schema_id: 100, .. }
    ));
    for src in &sources {
        rig.store
            .head(src)
            .await
            .unwrap_or_else(|e| panic!("source {src} was deleted: {e}"));
    }
    let retired = oracle::retired_paths(rig.store.as_ref(), MANIFEST).await;
    assert_eq!(retired.len(), sources.len());
    // The merged file holds no tombstone and is sorted by row_id.
    let rows = oracle::read_parquet(rig.store.get_bytes(&listed[0]).await.unwrap().bytes);
    assert!(rows.iter().all(|(_, r)| r.deleted_at == 0));
    assert!(rows.windows(2).all(|w| w[0].0 < w[1].0));
    // A second rewrite (after more writes) never reuses a key (#188).
    let first_base = listed[0].clone();
    let mut rig = rig;
    let mut r = Rng::new(6);
    for _ in 0..40 {
        rig.writer.random_op(&mut r).await;
    }
    rig.flush().await;
    let s = compact(&rig, &opts(&rig)).await;
    let second = s.new_base.unwrap();
    assert_ne!(second, first_base);
    rig.store.head(&first_base).await.unwrap();
    assert_eq!(rig.assert_oracle().await.1, 0);
}

#[tokio::test]
async fn a_corrupt_source_is_refused_unless_told_otherwise() {
    // docs/hazards.md #347
    let (rig, _) = lake_with_base_and_deltas(347).await;
    let state_before = oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
    let listed = rig.listed().await;
    let victim = listed.last().unwrap().clone();
    let original = rig.store.get_bytes(&victim).await.unwrap().bytes;
    let mut bytes = original.to_vec();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    rig.store
        .put_bytes(&victim, Bytes::from(bytes), PutMode::Overwrite)
        .await
        .unwrap();
    let manifest_before = rig.store.get_bytes(MANIFEST).await.unwrap().bytes;
    let s = compact(&rig, &opts(&rig)).await;
    assert_eq!(s.outcome, Outcome::Failed);
    let err = s.error.unwrap();
    assert!(
        err.contains(&victim) && err.contains("checksum mismatch"),
        "{err}"
    );
    assert_eq!(
        rig.store.get_bytes(MANIFEST).await.unwrap().bytes,
        manifest_before,
        "something was published"
    );
    assert!(rig.keys("data/100/base-").await.is_empty());
    // The override: with intact bytes but a wrong recorded checksum (so the outcome does not
    // depend on whether a flipped byte still decodes), verification refuses and the skip flag
    // merges, keeping the lake's state.
    rig.store
        .put_bytes(&victim, original, PutMode::Overwrite)
        .await
        .unwrap();
    lakecdc::lake::manifest::commit(
        rig.store.as_ref(),
        MANIFEST,
        100,
        &lakecdc::clock::SystemClock,
        Default::default(),
        |m| {
            let e = m.files.iter_mut().find(|f| f.path == victim).unwrap();
            e.checksum = Some(format!("sha256:{}", "0".repeat(64)));
            Ok(())
        },
    )
    .await
    .unwrap();
    let s = compact(&rig, &opts(&rig)).await;
    assert!(s.error.unwrap().contains("checksum mismatch"));
    let skip = CompactOptions {
        skip_input_checksum_verify: true,
        ..opts(&rig)
    };
    let s = compact(&rig, &skip).await;
    assert_eq!(s.outcome, Outcome::Done, "{s:?}");
    assert_eq!(rig.listed().await.len(), 1);
    assert_eq!(
        oracle::lake_state(rig.store.as_ref(), MANIFEST).await,
        state_before
    );
}

#[tokio::test]
async fn entries_outside_the_lake_or_without_system_columns_are_refused() {
    // docs/hazards.md #417 and #187/#189
    let (rig, _) = lake_with_base_and_deltas(417).await;
    let store = rig.store.clone();
    let add = |path: &'static str| {
        let store = store.clone();
        async move {
            lakecdc::lake::manifest::commit(
                store.as_ref(),
                MANIFEST,
                100,
                &lakecdc::clock::SystemClock,
                Default::default(),
                |m| {
                    let mut e = m.files[0].clone();
                    e.path = path.to_string();
                    e.tier = lakecdc::lake::Tier::Delta;
                    m.files.push(e);
                    Ok(())
                },
            )
            .await
            .unwrap();
        }
    };
    add("other-lake/100/0190a1b2-0000-7000-8000-000000000001.parquet").await;
    let s = compact(&rig, &opts(&rig)).await;
    assert_eq!(s.outcome, Outcome::Failed);
    assert!(
        s.error.unwrap().contains("other-lake/100"),
        "refused naming the entry"
    );
    assert!(rig.keys("data/100/base-").await.is_empty());

    // A listed file without `deleted_at`: write one and list it in place of the foreign entry.
    let (rig2, _) = lake_with_base_and_deltas(189).await;
    let bad = rig2.ctx.lake.layout.delta_key(100, uuid::Uuid::now_v7());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.parquet");
    {
        use arrow::array::{FixedSizeBinaryArray, Int64Array};
        use arrow::datatypes::{DataType, Field, Schema};
        let schema = Arc::new(Schema::new(vec![
            lakecdc::schema::batch::uuid_field("row_id", false),
            Field::new("changed_at", DataType::Int64, false),
            Field::new("ltbase_created_at", DataType::Int64, false),
        ]));
        let batch = arrow::record_batch::RecordBatch::try_new(
            schema,
            vec![
                Arc::new(
                    FixedSizeBinaryArray::try_from_iter(
                        [uuid::Uuid::new_v4().into_bytes()].into_iter(),
                    )
                    .unwrap(),
                ),
                Arc::new(Int64Array::from(vec![1i64])),
                Arc::new(Int64Array::from(vec![1i64])),
            ],
        )
        .unwrap();
        let engine = lakecdc::engine::Engine::open(&Default::default()).unwrap();
        engine.write_parquet(&[batch], &path).unwrap();
    }
    let put = rig2.store.put_file(&bad, &path).await.unwrap();
    lakecdc::lake::manifest::commit(
        rig2.store.as_ref(),
        MANIFEST,
        100,
        &lakecdc::clock::SystemClock,
        Default::default(),
        |m| {
            let mut e = m.files[0].clone();
            e.path = bad.clone();
            e.tier = lakecdc::lake::Tier::Delta;
            e.checksum = Some(put.checksum());
            e.size_bytes = put.size as i64;
            m.files.push(e);
            Ok(())
        },
    )
    .await
    .unwrap();
    let s = compact(&rig2, &opts(&rig2)).await;
    assert_eq!(s.outcome, Outcome::Failed);
    let err = s.error.unwrap();
    assert!(err.contains("deleted_at is missing"), "{err}");
    assert!(rig2.keys("data/100/base-").await.is_empty());
}

#[tokio::test]
async fn an_all_tombstone_merge_publishes_a_zero_row_base() {
    // docs/hazards.md #519
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(519);
    let ids = rig.seed(20, &mut r).await;
    rig.flush().await;
    compact(
        &rig,
        &CompactOptions {
            max_deltas: 0,
            ..opts(&rig)
        },
    )
    .await;
    for id in ids {
        rig.writer.hard_delete(id).await;
    }
    rig.flush().await;
    let s = compact(&rig, &opts(&rig)).await;
    assert_eq!(s.outcome, Outcome::Done, "{s:?}");
    assert_eq!((s.rows_in, s.rows_out, s.files_out), (40, 0, 1));
    let m = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
        .await
        .unwrap();
    let files = m["files"].as_array().unwrap();
    assert_eq!(files.len(), 1);
    assert_eq!(files[0]["tier"], "base");
    assert_eq!(files[0]["row_count"], 0);
    assert!(
        oracle::lake_state(rig.store.as_ref(), MANIFEST)
            .await
            .is_empty()
    );
    assert_eq!(rig.assert_oracle().await, (0, 0), "every row was deleted");
}

#[tokio::test]
async fn a_schema_never_flushed_is_a_noop() {
    // docs/hazards.md #524
    let rig = rig(LakeKind::S3).await;
    let report = lakecdc::compact::run(
        &rig.job_context(),
        &CompactOptions {
            schemas: vec![],
            ..opts(&rig)
        },
    )
    .await
    .unwrap();
    assert_eq!(report.exit_code(), 0);
    assert!(
        report
            .schemas
            .iter()
            .all(|s| s.outcome == Outcome::NoManifest)
    );
    assert!(rig.store.writes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flush_committing_during_a_rewrite_keeps_its_delta() {
    let (mut rig, mut r) = lake_with_base_and_deltas(77).await;
    let before_listed = rig.listed().await;
    // While the rewrite's base is staged, a flush commits a new delta.
    let ids: Vec<_> = rig
        .writer
        .rows
        .iter()
        .filter(|(_, m)| !m.soft_deleted)
        .map(|(k, _)| *k)
        .take(5)
        .collect();
    for id in &ids {
        rig.writer.update(*id, Customer::random(&mut r)).await;
    }
    let (fctx, fopts) = (rig.ctx.clone(), rig.opts.clone());
    let hook: Hook = Arc::new(move |_| {
        let (c, o) = (fctx.clone(), fopts.clone());
        async move {
            let report = lakecdc::flush::run(&c, &o).await.unwrap();
            assert_eq!(report.schemas[0].rows_marked, 5);
        }
        .boxed()
    });
    let report = lakecdc::compact::run_with_hook(&rig.job_context(), &opts(&rig), Some(hook))
        .await
        .unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, Outcome::Done, "{s:?}");
    let listed = rig.listed().await;
    assert_eq!(
        listed.len(),
        2,
        "the new base and the concurrent delta: {listed:?}"
    );
    let base = s.new_base.clone().unwrap();
    assert!(listed.contains(&base));
    let delta = listed.iter().find(|k| **k != base).unwrap();
    assert!(!before_listed.contains(delta));
    let (compared, dirty) = rig.assert_oracle().await;
    assert_eq!(dirty, 0);
    assert!(compared > 0);
    let _ = &mut rig;
}

#[tokio::test]
async fn gc_deletes_retired_sources_past_the_grace() {
    let (rig, _) = lake_with_base_and_deltas(461).await;
    let sources = rig.listed().await;
    compact(&rig, &opts(&rig)).await;
    let (clock, gctx, gopts) = rig.gc_on_a_manual_clock();
    let report = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    assert_eq!(report.schemas[0].within_grace.len(), sources.len());
    assert!(
        report.schemas[0].unlisted_deltas.is_empty(),
        "retired deltas are not 'unlisted deltas'"
    );
    clock.advance(16 * 60_000);
    let report = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    assert_eq!(report.schemas[0].deleted.len(), sources.len());
    assert_eq!(report.exit_code(), 0);
    for src in &sources {
        assert!(rig.store.head(src).await.unwrap_err().is_not_found());
    }
    let m = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
        .await
        .unwrap();
    assert!(m["retired"].as_array().unwrap().is_empty());
    let live = rig.writer.rows.values().filter(|m| !m.soft_deleted).count();
    assert!(live > 100);
    assert_eq!(rig.assert_oracle().await, (live, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_conflicting_save_is_retried_and_keeps_the_concurrent_delta() {
    use lakecdc::store::fault::{Action, Gate, Op};
    let (mut rig, mut r) = lake_with_base_and_deltas(78).await;
    let ids: Vec<_> = rig
        .writer
        .rows
        .iter()
        .filter(|(_, m)| !m.soft_deleted)
        .map(|(k, _)| *k)
        .take(4)
        .collect();
    for id in &ids {
        rig.writer.update(*id, Customer::random(&mut r)).await;
    }
    // Hold the compactor's manifest save; a flush commits meanwhile.
    let gate = Gate::new();
    rig.store.arm(
        Op::PutBytes,
        Some("manifest/"),
        1,
        Action::Pause(gate.clone()),
    );
    let calls_before = rig.store.calls().len();
    let c = rig.job_context();
    let o = opts(&rig);
    let task = tokio::spawn(async move { lakecdc::compact::run(&c, &o).await });
    gate.wait_reached().await;
    let report = rig.flush().await;
    assert_eq!(report.schemas[0].rows_marked, 4);
    gate.release();
    let report = task.await.unwrap().unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, Outcome::Done, "{s:?}");
    let manifest_puts = rig.store.calls()[calls_before..]
        .iter()
        .filter(|c| c.op == Op::PutBytes && c.key == MANIFEST)
        .count();
    assert_eq!(
        manifest_puts, 3,
        "compactor (conflict), flush, compactor (retry)"
    );
    let listed = rig.listed().await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed.contains(s.new_base.as_ref().unwrap()));
    let (_, dirty) = rig.assert_oracle().await;
    assert_eq!(dirty, 0);
    let _ = &mut rig;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_base_staged_longer_than_the_lease_is_never_published() {
    // Until listed, a compaction's new base is an orphan to gc. A pass that stalls past its
    // lease between staging and saving (a slow store, a paused process) must not publish a
    // base that gc may already have removed: it deletes it and fails; the lake is unchanged.
    let (rig, _) = lake_with_base_and_deltas(17).await;
    let before = oracle::manifest_json(rig.store.as_ref(), MANIFEST).await;
    let state = oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
    let objects = rig.keys("data/100/").await;
    let stall: Hook = Arc::new(|_| {
        async { tokio::time::sleep(std::time::Duration::from_millis(1500)).await }.boxed()
    });
    let o = CompactOptions {
        commit_lease: std::time::Duration::from_secs(1),
        ..opts(&rig)
    };
    // Refused for its lease: the schema fails, the manifest and the prefix are unchanged.
    let refused = async |report: lakecdc::compact::CompactReport| {
        let s = &report.schemas[0];
        assert_eq!(s.outcome, Outcome::Failed, "{s:?}");
        assert!(s.error.as_deref().unwrap().contains("lease"), "{s:?}");
        assert_eq!(
            oracle::manifest_json(rig.store.as_ref(), MANIFEST).await,
            before,
            "published after the lease"
        );
        assert_eq!(
            rig.keys("data/100/").await,
            objects,
            "the staged base was left"
        );
        assert_eq!(
            oracle::lake_state(rig.store.as_ref(), MANIFEST).await,
            state
        );
    };
    let report = lakecdc::compact::run_with_hook(&rig.job_context(), &o, Some(stall))
        .await
        .unwrap();
    refused(report).await;
    // A host suspended between staging and saving: the monotonic clock stands still, the
    // wall clock (which gc on another host keeps) moves on past the lease.
    use lakecdc::clock::{Clock, ManualClock, SystemClock};
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let suspended: Hook = Arc::new({
        let clock = clock.clone();
        move |_| {
            clock.advance(5 * 60_000 + 1_000);
            async {}.boxed()
        }
    });
    let report = lakecdc::compact::run_with_hook(
        &Context {
            clock: clock.clone(),
            ..rig.job_context()
        },
        &opts(&rig),
        Some(suspended),
    )
    .await
    .unwrap();
    refused(report).await;
    // Within the lease the same rewrite publishes.
    let s = compact(&rig, &opts(&rig)).await;
    assert_eq!(s.outcome, Outcome::Done, "{s:?}");
    assert_eq!(
        oracle::lake_state(rig.store.as_ref(), MANIFEST).await,
        state
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_large_flushs_many_small_disjoint_deltas_are_merged_not_promoted() {
    // docs/design.md §9, "Promotion": one flush read in a heap pass writes its batches in
    // row-id order, disjoint; relabelled they would stay that many small bases for good.
    let mut rig = rig(LakeKind::S3).await;
    rig.opts.read_order = lakecdc::flush::ReadOrder::Heap;
    rig.opts.batch_size = 10;
    let mut r = Rng::new(8);
    rig.seed(120, &mut r).await;
    let flushed = rig.flush().await;
    let deltas = &flushed.schemas[0].files;
    assert_eq!(deltas.len(), 12, "{flushed:?}");
    let m = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
        .await
        .unwrap();
    let mut bounds: Vec<(String, String)> = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let b = |k: &str| f[k].as_str().unwrap().to_string();
            (b("row_id_min"), b("row_id_max"))
        })
        .collect();
    bounds.sort();
    assert!(
        bounds.windows(2).all(|w| w[0].1 < w[1].0),
        "the pass's deltas are disjoint: {bounds:?}"
    );
    let o = CompactOptions {
        max_deltas: 0,
        ..opts(&rig)
    };
    let s = compact(&rig, &o).await;
    let plan = s.plan.as_ref().unwrap();
    assert_eq!(plan.decision, Decision::Rewrite, "{}", plan.reason);
    assert!(
        plan.reason
            .contains("12 small deltas would stay 12 bases where a merge writes about 1"),
        "{}",
        plan.reason
    );
    assert_eq!((s.files_in, s.rows_in, s.files_out), (12, 120, 1), "{s:?}");
    let m = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
        .await
        .unwrap();
    let files = m["files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{m}");
    assert_eq!(
        (files[0]["tier"].as_str(), files[0]["row_count"].as_i64()),
        (Some("base"), Some(120))
    );
    assert_eq!(rig.assert_oracle().await, (120, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn small_bases_no_delta_touches_are_merged_into_one() {
    // docs/design.md §4.3, "Small bases"; docs/hazards.md L118. Bases promoted while small (by
    // an earlier build, or under a smaller --target-base-size) are never touched enough by
    // deltas to be rewritten: once they are many, compaction merges them, deltas or not.
    let mut rig = rig(LakeKind::S3).await;
    rig.opts.read_order = lakecdc::flush::ReadOrder::Heap;
    rig.opts.batch_size = 10;
    let mut r = Rng::new(118);
    rig.seed(120, &mut r).await;
    rig.flush().await;
    // Under a 64 KiB target, twelve disjoint deltas of a few KiB are promoted as they are.
    let small = CompactOptions {
        max_deltas: 0,
        target_base_size: 64 << 10,
        ..opts(&rig)
    };
    let s = compact(&rig, &small).await;
    assert_eq!(
        s.plan.as_ref().unwrap().decision,
        Decision::Promote,
        "{s:?}"
    );
    let bases = |m: &serde_json::Value| -> Vec<(String, i64)> {
        (m["files"].as_array().unwrap().iter())
            .map(|f| {
                (
                    f["tier"].as_str().unwrap().to_string(),
                    f["row_count"].as_i64().unwrap(),
                )
            })
            .collect()
    };
    let m = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
        .await
        .unwrap();
    assert_eq!(bases(&m), vec![("base".to_string(), 10); 12]);
    let promoted: std::collections::BTreeSet<String> = (m["files"].as_array().unwrap().iter())
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect();
    // At the default target they are small, side by side, and no delta is left: merged.
    let s = compact(&rig, &opts(&rig)).await;
    let plan = s.plan.as_ref().unwrap();
    assert_eq!(plan.decision, Decision::Rewrite, "{}", plan.reason);
    assert_eq!(
        plan.reason,
        "12 small bases lie side by side where about 1 would hold them: 12 of them merge"
    );
    assert_eq!(
        (s.files_in, s.rows_in, s.files_out, s.bases_rewritten),
        (12, 120, 1, 12),
        "{s:?}"
    );
    let m = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
        .await
        .unwrap();
    assert_eq!(bases(&m), [("base".to_string(), 120)]);
    let retired: std::collections::BTreeSet<String> = (m["retired"].as_array().unwrap().iter())
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect();
    assert!(promoted.is_subset(&retired), "{m}");
    assert_eq!(rig.assert_oracle().await, (120, 0));
    // One base is nothing to merge.
    let s = compact(&rig, &opts(&rig)).await;
    assert_eq!(s.plan.as_ref().unwrap().decision, Decision::Noop, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dry_run_plans_what_the_run_does_and_writes_nothing() {
    // docs/hazards.md #180, for compaction: both decisions, planned without a write.
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(180);
    rig.seed(40, &mut r).await;
    rig.flush().await;
    // The decision and the counts of what was merged: a dry run reports the pass it plans.
    let decisions = |s: &lakecdc::compact::SchemaCompact| {
        let p = s.plan.as_ref().unwrap();
        let merged = (s.files_in, s.rows_in, s.bases_rewritten, s.bases_kept);
        (s.outcome, p.decision, p.reason.clone(), merged)
    };
    for (max_deltas, expected) in [(0, Decision::Promote), (32, Decision::Noop)] {
        let o = CompactOptions {
            max_deltas,
            ..opts(&rig)
        };
        let manifest = rig.store.get_bytes(MANIFEST).await.unwrap();
        let writes = rig.store.writes().len();
        let keys = rig.keys("").await;
        let dry = compact(
            &rig,
            &CompactOptions {
                dry_run: true,
                ..o.clone()
            },
        )
        .await;
        assert_eq!(dry.plan.as_ref().unwrap().decision, expected, "{dry:?}");
        assert_eq!((dry.files_out, dry.new_base.as_ref()), (0, None));
        assert_eq!(rig.store.writes().len(), writes, "the dry run wrote");
        assert_eq!(rig.keys("").await, keys);
        let after = rig.store.get_bytes(MANIFEST).await.unwrap();
        assert_eq!((after.etag, after.bytes), (manifest.etag, manifest.bytes));
        // The run follows the plan the dry run printed.
        let real = compact(&rig, &o).await;
        assert_eq!(decisions(&real), decisions(&dry));
    }
    // A rewrite, planned then carried out.
    let (rig, _) = lake_with_base_and_deltas(181).await;
    let writes = rig.store.writes().len();
    let dry = compact(
        &rig,
        &CompactOptions {
            dry_run: true,
            ..opts(&rig)
        },
    )
    .await;
    assert_eq!(dry.plan.as_ref().unwrap().decision, Decision::Rewrite);
    assert_eq!(rig.store.writes().len(), writes, "the dry run wrote");
    assert!(dry.files_in > 1 && dry.rows_in > 0, "{dry:?}");
    let real = compact(&rig, &opts(&rig)).await;
    assert_eq!(decisions(&real), decisions(&dry));
    assert!(real.new_base.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn files_with_null_deleted_at_for_live_rows_merge_as_live() {
    // docs/hazards.md #365: the predecessor's early files wrote deleted_at NULL, not 0, for live
    // rows. A merge must read NULL as live, and a newer tombstone must still remove the row.
    use lakecdc::clock::SystemClock;
    use lakecdc::engine::{Engine, EngineConfig};
    use lakecdc::lake::manifest;
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(365);
    rig.seed(20, &mut r).await;
    rig.flush().await;
    // Rewrite every delta as the predecessor wrote it, and list that file instead.
    let engine = Engine::open(&EngineConfig::default()).unwrap();
    let work = tempfile::tempdir().unwrap();
    for path in rig.listed().await {
        let (src, dst) = (
            work.path().join("src.parquet"),
            work.path().join("old.parquet"),
        );
        std::fs::write(&src, rig.store.get_bytes(&path).await.unwrap().bytes).unwrap();
        let select = format!(
            "SELECT * REPLACE (NULLIF(deleted_at, 0) AS deleted_at) FROM read_parquet('{}')",
            src.display()
        );
        engine.copy_to_parquet(&select, &dst).unwrap();
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            Bytes::from(std::fs::read(&dst).unwrap()),
        )
        .unwrap()
        .build()
        .unwrap();
        let (mut rows, mut nulls) = (0, 0);
        for batch in reader {
            let batch = batch.unwrap();
            rows += batch.num_rows();
            nulls += batch.column_by_name("deleted_at").unwrap().null_count();
        }
        assert_eq!(nulls, rows, "every row live, deleted_at NULL");
        let key = rig.ctx.lake.layout.delta_key(100, uuid::Uuid::now_v7());
        let put = rig.store.put_file(&key, &dst).await.unwrap();
        manifest::commit(
            rig.store.as_ref(),
            MANIFEST,
            100,
            &SystemClock,
            Default::default(),
            |m| {
                for f in m.files.iter_mut().filter(|f| f.path == path) {
                    f.path = key.clone();
                    f.size_bytes = put.size as i64;
                    f.checksum = Some(put.checksum());
                }
                Ok(())
            },
        )
        .await
        .unwrap();
    }
    // Those files become the base tier; then a delete and an update over them.
    let promote = CompactOptions {
        max_deltas: 0,
        ..opts(&rig)
    };
    assert_eq!(
        compact(&rig, &promote).await.plan.unwrap().decision,
        Decision::Promote
    );
    let ids: Vec<_> = rig.writer.rows.keys().copied().take(2).collect();
    rig.writer.hard_delete(ids[0]).await;
    rig.writer.update(ids[1], Customer::random(&mut r)).await;
    rig.flush().await;
    let s = compact(&rig, &opts(&rig)).await;
    assert_eq!(
        s.plan.as_ref().unwrap().decision,
        Decision::Rewrite,
        "{s:?}"
    );
    assert_eq!(s.outcome, Outcome::Done, "{s:?}");
    // 19 live rows, exactly PostgreSQL's; the merged base holds them with deleted_at 0.
    assert_eq!(rig.assert_oracle().await, (19, 0));
    let merged = s.new_base.unwrap();
    let rows = oracle::read_parquet(rig.store.get_bytes(&merged).await.unwrap().bytes);
    assert_eq!(rows.len(), 19);
    assert!(rows.iter().all(|(_, r)| r.deleted_at == 0));
    assert!(
        !rows.iter().any(|(id, _)| *id == ids[0]),
        "the tombstone won"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_column_added_between_generations_merges_with_nulls_for_older_rows() {
    // docs/hazards.md #255/#371: a merge reads files of different generations of a schema; an
    // attribute added later is NULL for the rows written before it, its value after.
    let (mut rig, mut r) = lake_with_base_and_deltas(371).await;
    let before = rig.listed().await;
    // The customer schema gains an EAV text attribute.
    let dir = crate::support::rig::schema_dir_with_nickname();
    rig.ctx.schema_dir = Some(dir.path().to_path_buf());
    // Three rows are written with a nickname under the new schema.
    let live: Vec<_> = rig
        .writer
        .rows
        .iter()
        .filter(|(_, m)| !m.soft_deleted)
        .map(|(id, _)| *id)
        .take(3)
        .collect();
    for (i, id) in live.iter().enumerate() {
        rig.writer.update(*id, Customer::random(&mut r)).await;
        rig.writer
            .client
            .execute(
                "INSERT INTO eav_data (schema_id, row_id, attr_id, value_text) VALUES (100, $1, 90, $2)",
                &[id, &format!("nick-{i}")],
            )
            .await
            .unwrap();
    }
    rig.flush().await;
    let s = compact(
        &rig,
        &CompactOptions {
            dirty_ratio: 0.0,
            ..opts(&rig)
        },
    )
    .await;
    assert_eq!(s.outcome, Outcome::Done, "{s:?}");
    assert_eq!(s.plan.as_ref().unwrap().decision, Decision::Rewrite);
    assert!(s.files_in > before.len(), "old and new generations merged");
    let live_rows = rig.writer.rows.values().filter(|m| !m.soft_deleted).count();
    assert!(live_rows > 100);
    assert_eq!(rig.assert_oracle().await, (live_rows, 0));
    let rows = oracle::read_parquet(
        rig.store
            .get_bytes(&s.new_base.unwrap())
            .await
            .unwrap()
            .bytes,
    );
    let mut named = 0;
    for (id, row) in &rows {
        let want = match live.iter().position(|l| l == id) {
            Some(i) => {
                named += 1;
                oracle::V::Str(format!("nick-{i}"))
            }
            None => oracle::V::Null,
        };
        assert_eq!(row.columns.get("nickname"), Some(&want), "{id}");
    }
    assert_eq!(named, 3);
}

/// Every local file of a run sits in one private directory (docs/security.md, "Local files"):
/// seen from inside a compaction, after its sources are downloaded and the new base staged.
#[tokio::test]
async fn a_runs_local_files_are_private_and_gone_when_it_ends() {
    use std::os::unix::fs::MetadataExt;
    let (rig, _) = lake_with_base_and_deltas(911).await;
    let work_dir = tempfile::tempdir().unwrap();
    let dir = work_dir.path().to_path_buf();
    let o = CompactOptions {
        work_dir: dir.clone(),
        ..opts(&rig)
    };
    // The first output's upload waits while the work dir is looked at.
    let gate = lakecdc::store::fault::Gate::new();
    rig.store.arm(
        lakecdc::store::fault::Op::PutFile,
        None,
        1,
        lakecdc::store::fault::Action::Pause(gate.clone()),
    );
    let ctx = rig.job_context();
    let run = tokio::spawn(async move { lakecdc::compact::run(&ctx, &o).await });
    gate.wait_reached().await;
    let mut seen = Vec::new();
    let mut stack = vec![dir.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                stack.push(e.path());
            }
            let rel = e.path().strip_prefix(&dir).unwrap().to_path_buf();
            seen.push((rel, m.is_dir(), m.mode() & 0o777));
        }
    }
    gate.release();
    let report = run.await.unwrap().unwrap();
    assert_eq!(report.schemas[0].outcome, Outcome::Done);
    let top: Vec<_> = seen
        .iter()
        .filter(|(p, ..)| p.components().count() == 1)
        .collect();
    assert_eq!(top.len(), 1, "one scratch directory: {seen:?}");
    let (run_dir, is_dir, mode) = top[0].clone();
    assert!(
        is_dir && run_dir.to_string_lossy().starts_with("lakecdc-"),
        "{seen:?}"
    );
    assert_eq!(mode, 0o700, "{seen:?}");
    assert!(
        seen.contains(&(run_dir.join("spill"), true, 0o700)),
        "{seen:?}"
    );
    let files: Vec<_> = seen.iter().filter(|(_, d, _)| !d).collect();
    assert!(!files.is_empty(), "no local file seen mid-run: {seen:?}");
    for (path, _, mode) in &files {
        assert_eq!(*mode, 0o600, "{} is {mode:o}", path.display());
    }
    for (path, d, mode) in &seen {
        if *d {
            assert_eq!(*mode, 0o700, "{} is {mode:o}", path.display());
        }
    }
    assert_eq!(
        std::fs::read_dir(work_dir.path()).unwrap().count(),
        0,
        "the scratch directory outlived the run"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_file_duckdb_pivots_is_readable_by_compaction_whatever_its_integers() {
    // docs/hazards.md L92: a batch only DuckDB's pivot can export (here a list item whose
    // index is not an integer) was written by DuckDB's Parquet writer, which delta-encodes a
    // 32-bit column with 64-bit deltas: with neighbours 2^31 apart the parquet crate (the
    // compaction's reader) refused the file and every compaction failed.
    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(4592);
    let mut ids: Vec<uuid::Uuid> = (0..3).map(|_| r.uuid()).collect();
    ids.sort();
    for (id, points) in ids.iter().zip([i32::MAX, i32::MIN, i32::MAX]) {
        let mut c = Customer::random(&mut r);
        c.loyalty_points = Some(points);
        rig.writer.create(*id, c).await;
    }
    rig.writer
        .client
        .execute(
            "INSERT INTO eav_data (schema_id, row_id, attr_id, array_indices, value_text) VALUES (100, $1, 19, 'x', 'odd')",
            &[&ids[2]],
        )
        .await
        .unwrap();
    assert!(!rig.flush().await.failed());
    // Read with the parquet crate, as compaction reads it.
    let lake = oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
    let points: Vec<_> = ids
        .iter()
        .map(|id| lake[id].columns["loyalty_points"].clone())
        .collect();
    assert_eq!(
        points,
        [i32::MAX, i32::MIN, i32::MAX].map(|p| oracle::V::Int(i64::from(p)))
    );
    let s = compact(
        &rig,
        &CompactOptions {
            max_deltas: 0,
            ..opts(&rig)
        },
    )
    .await;
    assert!(s.error.is_none(), "{:?}", s.error);
    assert_eq!(
        oracle::lake_state(rig.store.as_ref(), MANIFEST).await.len(),
        3
    );
}
