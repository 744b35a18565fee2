//! gc settles unlisted deltas (docs/design.md §4.4): the leftover of an ambiguous save whose
//! rows went out again is deleted past the grace with exit 0; an orphan holding rows the lake
//! lacks is lost data (exit 3) until `gc --repair` requeues them, after which a flush makes
//! `verify --source` exit 0 and the orphan is deleted in turn; right after a compaction gc
//! exits 0.

use std::collections::{BTreeMap, BTreeSet};

use lakecdc::gc::Outcome;
use lakecdc::store::ObjectStore;
use lakecdc::store::fault::{Action, Op};

use crate::support::oracle;
use crate::support::rig::{LakeKind, Rig, rig};
use crate::support::writer::Rng;
use crate::verify_source::verify_source;

const MANIFEST: &str = "manifest/100.json";
const MIN: i64 = 60_000;

/// A lake with one orphan delta: a flush whose manifest save failed ambiguously (the delta
/// was kept, its rows stayed dirty). Returns the orphan's key.
async fn lake_with_orphan(seed: u64) -> (Rig, Rng, String) {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(seed);
    rig.seed(40, &mut r).await;
    assert!(!rig.flush().await.failed());
    for _ in 0..15 {
        rig.writer.random_op(&mut r).await;
    }
    let orphan = orphan_of_a_failed_save(&rig).await;
    (rig, r, orphan)
}

/// A flush whose manifest save fails ambiguously (the delta is kept, its rows stay dirty):
/// the key of the delta it leaves unlisted.
async fn orphan_of_a_failed_save(rig: &Rig) -> String {
    let before: BTreeSet<String> = rig.keys("data/100/").await.into_iter().collect();
    rig.store.arm(Op::PutBytes, Some(MANIFEST), 1, Action::Fail);
    let report = rig.flush().await;
    assert!(report.failed(), "{report:?}");
    let orphans: Vec<String> = rig
        .keys("data/100/")
        .await
        .into_iter()
        .filter(|k| !before.contains(k) && !k.contains("/_tmp/"))
        .collect();
    assert_eq!(orphans.len(), 1, "{orphans:?}");
    assert!(!rig.listed().await.contains(&orphans[0]));
    orphans[0].clone()
}

/// Marks every dirty slot flushed by hand, as if exported: nothing will export those rows
/// again. Returns how many.
async fn marked_by_hand(rig: &Rig) -> u64 {
    let marked = rig
        .writer
        .client
        .execute(
            "UPDATE change_log SET flushed_at = 1 WHERE schema_id = 100 AND flushed_at = 0",
            &[],
        )
        .await
        .unwrap();
    assert!(marked > 0);
    marked
}

/// One compaction of the customer schema that must succeed.
async fn compact(rig: &Rig, max_deltas: usize, dirty_ratio: f64) {
    let compact = lakecdc::compact::run(
        &rig.job_context(),
        &lakecdc::compact::CompactOptions {
            schemas: vec!["customer".into()],
            work_dir: rig.opts.work_dir.clone(),
            max_deltas,
            dirty_ratio,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(compact.exit_code(), 0, "{compact:?}");
}

/// Two gc runs over the lake of `rig`, whose one orphan `orphan` is covered: the first sights
/// it and waits (pending, exit 0), the second, past the grace, deletes it (clean).
async fn gc_deletes_a_covered_orphan_past_the_grace(rig: &Rig, orphan: &str) {
    let (clock, gctx, gopts) = rig.gc_on_a_manual_clock();
    let first = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    let s = &first.schemas[0];
    assert_eq!(s.outcome, Some(Outcome::Pending), "{first:?}");
    assert_eq!(s.within_grace, vec![orphan.to_string()]);
    assert!(s.lost.is_empty() && s.unlisted_deltas.is_empty(), "{s:?}");
    assert_eq!(first.exit_code(), 0, "waiting out the grace is normal");
    clock.advance(16 * MIN);
    let second = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    let s = &second.schemas[0];
    assert_eq!(s.deleted, vec![orphan.to_string()], "{second:?}");
    assert_eq!((s.outcome, second.exit_code()), (Some(Outcome::Clean), 0));
    assert!(rig.store.head(orphan).await.unwrap_err().is_not_found());
}

#[tokio::test]
async fn an_orphan_whose_rows_went_out_again_is_deleted_past_the_grace() {
    let (rig, _, orphan) = lake_with_orphan(3101).await;
    // The rows went out again in the next flush.
    assert!(!rig.flush().await.failed());
    gc_deletes_a_covered_orphan_past_the_grace(&rig, &orphan).await;
    rig.assert_oracle().await;
}

/// What a flush killed between its upload and its save leaves (a delta goes straight to its
/// key, docs/design.md §4.1): an orphan whose rows are all still dirty. Covered by the pending
/// slots, it is deleted past the grace, and the next flush lists the rows.
#[tokio::test]
async fn an_orphan_whose_rows_are_still_dirty_is_deleted_past_the_grace() {
    let (rig, _, orphan) = lake_with_orphan(3102).await;
    let dirty = oracle::dirty(&rig.writer).await;
    assert!(!dirty.is_empty());
    gc_deletes_a_covered_orphan_past_the_grace(&rig, &orphan).await;
    // gc touched no slot: the rows are as dirty as before, and the next flush lists them.
    assert_eq!(oracle::dirty(&rig.writer).await, dirty);
    assert!(!rig.flush().await.failed());
    let (_, left) = rig.assert_oracle().await;
    assert_eq!(left, 0);
}

#[tokio::test]
async fn an_orphan_holding_rows_the_lake_lacks_is_lost_until_repaired() {
    let (mut rig, _, orphan) = lake_with_orphan(3102).await;
    let marked = marked_by_hand(&rig).await;
    let (clock, gctx, mut gopts) = rig.gc_on_a_manual_clock();
    let report = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    let s = &report.schemas[0];
    assert_eq!(
        (s.outcome, report.exit_code()),
        (Some(Outcome::Attention), 3)
    );
    assert_eq!(s.lost.len(), 1, "{s:?}");
    assert_eq!(s.lost[0].key, orphan);
    assert_eq!(s.lost[0].rows, marked, "{s:?}");
    assert!(s.within_grace.is_empty() && s.deleted.is_empty());
    assert!(report.to_text().contains("LOST"));
    let (v, code) = verify_source(&rig, false, false).await;
    assert_eq!(code, 3, "{v:?}");
    // A dry run of the repair lists what it would requeue and writes nothing.
    gopts.repair = true;
    let dry = lakecdc::gc::run(
        &gctx,
        &lakecdc::gc::GcOptions {
            dry_run: true,
            ..gopts.clone()
        },
    )
    .await
    .unwrap();
    assert_eq!(
        dry.schemas[0].repaired.as_ref().unwrap().count() as u64,
        marked
    );
    assert!(crate::support::oracle::dirty(&rig.writer).await.is_empty());
    // The repair requeues the lost rows: nothing left for a person.
    let repaired = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    let s = &repaired.schemas[0];
    assert_eq!(s.repaired.as_ref().unwrap().count() as u64, marked, "{s:?}");
    assert_eq!(repaired.exit_code(), 0, "{repaired:?}");
    let dirty = crate::support::oracle::dirty(&rig.writer).await;
    assert_eq!(dirty.len() as u64, marked);
    // Requeued rows carry bumped versions: the model follows them.
    let dirty: Vec<_> = dirty.into_iter().collect();
    rig.writer.follow_versions(&dirty).await;
    assert!(!rig.flush().await.failed());
    let (v, code) = verify_source(&rig, true, false).await;
    assert_eq!(code, 0, "{v:?}");
    rig.assert_oracle().await;
    // Now covered: sighted, then deleted past the grace.
    gopts.repair = false;
    let settled = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    assert_eq!(settled.schemas[0].within_grace, vec![orphan.clone()]);
    assert_eq!(settled.exit_code(), 0);
    clock.advance(16 * MIN);
    let last = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    assert_eq!(last.schemas[0].deleted, vec![orphan]);
    assert_eq!(last.exit_code(), 0);
}

#[tokio::test]
async fn gc_right_after_a_compaction_exits_zero() {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(3103);
    rig.seed(60, &mut r).await;
    assert!(!rig.flush().await.failed());
    for _ in 0..20 {
        rig.writer.random_op(&mut r).await;
    }
    assert!(!rig.flush().await.failed());
    compact(&rig, 1, 0.05).await;
    let retired = crate::support::oracle::retired_paths(rig.store.as_ref(), MANIFEST).await;
    assert!(!retired.is_empty());
    let (_, gctx, gopts) = rig.gc_on_a_manual_clock();
    let report = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    let s = &report.schemas[0];
    assert_eq!(
        s.within_grace.iter().cloned().collect::<BTreeSet<_>>(),
        retired
    );
    assert_eq!((s.outcome, report.exit_code()), (Some(Outcome::Pending), 0));
}

/// [`lake_with_orphan`], whose rows went out again; then every live row is deleted and the
/// deletions flushed, and a compaction folds the deltas into bases, which keep no tombstones:
/// the lake holds no copy of the orphan's rows, and neither does PostgreSQL.
async fn lake_with_a_stale_orphan(seed: u64) -> (Rig, Rng, String) {
    let (mut rig, r, orphan) = lake_with_orphan(seed).await;
    assert!(!rig.flush().await.failed());
    let live: Vec<uuid::Uuid> = rig
        .writer
        .rows
        .iter()
        .filter(|(_, m)| !m.soft_deleted)
        .map(|(id, _)| *id)
        .collect();
    for id in live {
        rig.writer.hard_delete(id).await;
    }
    assert!(!rig.flush().await.failed());
    compact(&rig, 0, 0.0).await;
    let state = crate::support::oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
    assert!(state.is_empty(), "{state:?}");
    (rig, r, orphan)
}

#[tokio::test]
async fn an_orphans_copy_of_a_row_deleted_since_and_compacted_away_is_not_lost() {
    let (rig, _, orphan) = lake_with_a_stale_orphan(3104).await;
    // The orphan's live copies are stale, not lost: it waits out its grace and goes.
    let (clock, gctx, gopts) = rig.gc_on_a_manual_clock();
    let report = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    let s = &report.schemas[0];
    assert!(s.lost.is_empty(), "{s:?}");
    assert!(s.within_grace.contains(&orphan), "{s:?}");
    assert_eq!((s.outcome, report.exit_code()), (Some(Outcome::Pending), 0));
    clock.advance(16 * MIN);
    let second = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    assert!(second.schemas[0].deleted.contains(&orphan), "{second:?}");
    assert_eq!(second.exit_code(), 0, "{second:?}");
    rig.assert_oracle().await;
}

/// docs/hazards.md L78: a row of an orphan that neither the lake nor the source holds, re-created
/// between gc's two questions to the source (which rows are pending, which are live), is
/// pending by the second: the orphan's copy is covered, not reported lost.
#[tokio::test]
async fn a_row_recreated_while_gc_asks_the_source_is_pending_not_lost() {
    let (mut rig, mut r, orphan) = lake_with_a_stale_orphan(3105).await;
    // A live copy in the orphan, of a row gone from the lake and from PostgreSQL.
    let rows =
        crate::support::oracle::read_parquet(rig.store.get_bytes(&orphan).await.unwrap().bytes);
    let (again, _) = rows
        .iter()
        .find(|(_, m)| m.deleted_at == 0)
        .expect("the orphan holds a live copy");
    let again = *again;
    let (_clock, gctx, gopts) = rig.gc_on_a_manual_clock();
    let (at_tx, at_rx) = tokio::sync::oneshot::channel::<()>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let hook_state = std::sync::Arc::new(std::sync::Mutex::new(Some((at_tx, go_rx))));
    let hook: lakecdc::gc::SettleHook = std::sync::Arc::new(move |_| {
        let once = hook_state.lock().unwrap().take();
        Box::pin(async move {
            if let Some((at, go)) = once {
                at.send(()).unwrap();
                go.await.unwrap();
            }
        })
    });
    let gc = tokio::spawn(async move { lakecdc::gc::run_with_hook(&gctx, &gopts, hook).await });
    at_rx
        .await
        .expect("gc asks the source about the orphan's stale rows");
    rig.writer
        .create(again, crate::support::writer::Customer::random(&mut r))
        .await;
    go_tx.send(()).unwrap();
    let report = gc.await.unwrap().unwrap();
    let s = &report.schemas[0];
    assert!(s.lost.is_empty(), "{s:?}");
    assert!(s.within_grace.contains(&orphan), "{s:?}");
    assert_eq!((s.outcome, report.exit_code()), (Some(Outcome::Pending), 0));
    assert!(!rig.flush().await.failed());
    rig.assert_oracle().await;
}

/// The rows gc found lost, by orphan, and the orphans it could not settle.
fn lost_and_kept(report: &lakecdc::gc::GcReport) -> (BTreeMap<String, u64>, Vec<String>) {
    let s = &report.schemas[0];
    (
        s.lost.iter().map(|l| (l.key.clone(), l.rows)).collect(),
        s.unlisted_deltas.clone(),
    )
}

/// docs/hazards.md S21: gc's memory follows its bound, not what the prefix holds. Unlisted
/// deltas are settled in groups of at most `settle_rows` rows with the verdicts of one group;
/// an orphan holding more rows alone is kept for a person, and the others are settled.
#[tokio::test]
async fn unlisted_deltas_are_settled_in_groups_of_bounded_rows() {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(3104);
    rig.seed(40, &mut r).await;
    assert!(!rig.flush().await.failed());
    let mut orphans = Vec::new();
    for _ in 0..3 {
        for _ in 0..6 {
            rig.writer.random_op(&mut r).await;
        }
        orphans.push(orphan_of_a_failed_save(&rig).await);
    }
    let mut sizes = Vec::new();
    for o in &orphans {
        let bytes = rig.store.get_bytes(o).await.unwrap().bytes;
        sizes.push(oracle::read_parquet(bytes).len());
    }
    // A failed save leaves its rows dirty: each orphan holds the earlier ones' rows too.
    assert!(sizes[0] < sizes[1] && sizes[1] < sizes[2], "{sizes:?}");
    marked_by_hand(&rig).await;
    let (_, gctx, gopts) = rig.gc_on_a_manual_clock();
    let run = |settle_rows: usize| {
        let opts = lakecdc::gc::GcOptions {
            dry_run: true,
            settle_rows,
            ..gopts.clone()
        };
        let gctx = &gctx;
        async move { lakecdc::gc::run(gctx, &opts).await.unwrap() }
    };
    let whole = run(usize::MAX).await;
    let (lost, kept) = lost_and_kept(&whole);
    assert_eq!(whole.exit_code(), 3);
    assert!(kept.is_empty(), "{kept:?}");
    assert_eq!(
        lost.keys().cloned().collect::<BTreeSet<_>>(),
        orphans.iter().cloned().collect()
    );
    // The largest orphan fills a group alone: the others are settled apart from it, alike.
    let grouped = run(sizes[2]).await;
    assert_eq!(lost_and_kept(&grouped), (lost.clone(), Vec::new()));
    let tiny = run(sizes[0]).await;
    assert_eq!(
        lost_and_kept(&tiny),
        (
            lost.iter()
                .filter(|(k, _)| **k == orphans[0])
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
            orphans[1..].to_vec()
        )
    );
    // One row short of the largest: it alone is kept, unread, and named.
    let short = run(sizes[2] - 1).await;
    let mut rest = lost.clone();
    rest.remove(&orphans[2]);
    assert_eq!(lost_and_kept(&short), (rest, vec![orphans[2].clone()]));
    assert!(short.to_text().contains(&orphans[2]), "{}", short.to_text());
}
