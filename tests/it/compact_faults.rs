//! `lakecdc compact` under injected store faults: a failed upload, an
//! ambiguous manifest save, and a pass that lost a race and starts over. After each fault the
//! exact state is checked: the manifest (unchanged, or for an ambiguous save one of its two
//! consistent outcomes), every listed file present with its checksum, the lake's state and
//! every row of PostgreSQL in it, and nothing left behind but unlisted objects that gc
//! removes. A later clean run converges.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use lakecdc::compact::{CompactOptions, Decision, Outcome, SchemaCompact};
use lakecdc::lake::KeyKind;
use lakecdc::store::ObjectStore;
use lakecdc::store::fault::{Action, Gate, Op};
use uuid::Uuid;

use crate::compact::{lake_with_base_and_deltas, opts};
use crate::support::oracle::{self, LakeRow};
use crate::support::rig::Rig;
use crate::support::writer::Rng;

const MANIFEST: &str = "manifest/100.json";
const OWNER: &str = "data/100/_owner.json";

async fn compact(rig: &Rig, o: &CompactOptions) -> SchemaCompact {
    let report = lakecdc::compact::run(&rig.job_context(), o).await.unwrap();
    assert_eq!(report.schemas.len(), 1, "{report:?}");
    report.schemas.into_iter().next().unwrap()
}

/// The lake as a compaction found it.
struct Before {
    manifest: Bytes,
    state: BTreeMap<Uuid, LakeRow>,
    objects: BTreeSet<String>,
    listed: BTreeSet<String>,
}

async fn objects(rig: &Rig) -> BTreeSet<String> {
    rig.keys("data/100/").await.into_iter().collect()
}

async fn before(rig: &Rig) -> Before {
    Before {
        manifest: rig.store.get_bytes(MANIFEST).await.unwrap().bytes,
        state: oracle::lake_state(rig.store.as_ref(), MANIFEST).await,
        objects: objects(rig).await,
        listed: rig.listed().await.into_iter().collect(),
    }
}

/// Every live row of the model is in the lake with its values, nothing is dirty, and the
/// lake's state (listed files read and checksummed by the oracle) is `state`.
async fn assert_no_row_lost(rig: &Rig, state: &BTreeMap<Uuid, LakeRow>, what: &str) {
    assert_eq!(
        &oracle::lake_state(rig.store.as_ref(), MANIFEST).await,
        state,
        "{what}: the lake's state changed"
    );
    let live = rig.writer.rows.values().filter(|m| !m.soft_deleted).count();
    assert!(live > 100, "{what}: too few rows to mean anything ({live})");
    assert_eq!(
        rig.assert_oracle().await,
        (live, 0),
        "{what}: rows compared, dirty"
    );
}

/// Runs gc past its grace and asserts it leaves exactly the listed files and the prefix's
/// owner marker, deleting exactly `expected` (what the failure left behind), and nothing it
/// only reports (unlisted deltas, unknown keys). Returns nothing: the listing proves it.
pub async fn assert_gc_removes_exactly(rig: &Rig, expected: &BTreeSet<String>, what: &str) {
    let listed: BTreeSet<String> = rig.listed().await.into_iter().collect();
    let present = objects(rig).await;
    let leftovers: BTreeSet<String> = present
        .iter()
        .filter(|k| !listed.contains(*k) && *k != OWNER)
        .cloned()
        .collect();
    assert_eq!(&leftovers, expected, "{what}: what is left unlisted");
    let (clock, gctx, gopts) = rig.gc_on_a_manual_clock();
    let first = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    clock.advance(16 * 60_000);
    let second = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    let s = &second.schemas[0];
    assert_eq!(
        s.outcome,
        Some(lakecdc::gc::Outcome::Clean),
        "{what}: {second:?}"
    );
    assert!(
        s.unlisted_deltas.is_empty() && s.unknown.is_empty(),
        "{what}: left something gc only reports: {s:?}"
    );
    let deleted: BTreeSet<String> = first.schemas[0]
        .deleted
        .iter()
        .chain(&s.deleted)
        .cloned()
        .collect();
    assert_eq!(&deleted, expected, "{what}: gc deleted");
    let mut want = listed;
    want.insert(OWNER.to_string());
    assert_eq!(objects(rig).await, want, "{what}: after gc");
}

/// The merged bases uploaded since the store's `calls`-th call.
fn merged_bases_put(rig: &Rig, calls: usize) -> Vec<String> {
    let layout = &rig.ctx.lake.layout;
    rig.store.calls()[calls..]
        .iter()
        .filter(|c| c.op == Op::PutFile)
        .filter(|c| matches!(layout.classify(&c.key), KeyKind::MergedBase { .. }))
        .map(|c| c.key.clone())
        .collect()
}

/// New deltas over the single base, enough for a rewrite.
async fn more_deltas(rig: &mut Rig, r: &mut Rng) {
    for _ in 0..40 {
        rig.writer.random_op(r).await;
    }
    let report = rig.flush().await;
    assert!(report.schemas[0].rows_marked > 0, "{report:?}");
}

/// A failed upload of the merged base, refused or landed then reported failed. The base goes
/// straight to its final key (docs/design.md §4.3): no temporary object, no copy. The schema
/// fails naming the step, the manifest is byte-for-byte the same, and a base that landed is
/// deleted in band (gc would remove it past its grace: it is an unlisted merged base).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_upload_publishes_nothing_and_leaves_nothing() {
    let (mut rig, mut r) = lake_with_base_and_deltas(1701).await;
    let cases = [
        (Op::PutFile, Action::Fail, "upload merged base"),
        (Op::PutFile, Action::FailAfter, "upload merged base"),
    ];
    for (op, action, step) in cases {
        let what = format!("{op:?} {action:?}");
        let b = before(&rig).await;
        assert!(b.listed.len() >= 2, "{what}: nothing to merge");
        let calls = rig.store.calls().len();
        rig.store.arm(op, None, 1, action.clone());
        let s = compact(&rig, &opts(&rig)).await;
        assert_eq!(s.outcome, Outcome::Failed, "{what}: {s:?}");
        assert_eq!(s.plan.as_ref().unwrap().decision, Decision::Rewrite);
        let err = s.error.as_deref().unwrap();
        assert!(err.contains(step), "{what}: {err}");
        assert!(err.contains("injected fault"), "{what}: {err}");
        assert_eq!(s.new_base, None, "{what}");
        // The fault fired where it was meant to.
        let faulted: Vec<_> = rig.store.calls()[calls..]
            .iter()
            .filter(|c| c.op == op)
            .cloned()
            .collect();
        assert_eq!(faulted.len(), 1, "{what}: {faulted:?}");
        let layout = &rig.ctx.lake.layout;
        assert!(
            matches!(layout.classify(&faulted[0].key), KeyKind::MergedBase { .. }),
            "{what}: {faulted:?}"
        );
        assert!(
            !rig.store.calls()[calls..].iter().any(|c| c.op == Op::Copy),
            "{what}: a merged base is not copied"
        );
        // The manifest is unchanged; every listed file is there with its checksum and no row
        // is lost.
        assert_eq!(
            rig.store.get_bytes(MANIFEST).await.unwrap().bytes,
            b.manifest,
            "{what}: the manifest changed"
        );
        assert_no_row_lost(&rig, &b.state, &what).await;
        // Nothing is left: no temporary object, and a base that landed was deleted.
        assert!(rig.keys("data/100/_tmp/").await.is_empty(), "{what}");
        let new: BTreeSet<String> = objects(&rig)
            .await
            .difference(&b.objects)
            .cloned()
            .collect();
        assert_eq!(new, BTreeSet::new(), "{what}: left behind");
        if matches!(action, Action::FailAfter) {
            assert!(
                rig.store.calls()[calls..]
                    .iter()
                    .any(|c| c.op == Op::Delete && c.key == faulted[0].key),
                "{what}: the landed base was deleted in band"
            );
        }
        assert_gc_removes_exactly(&rig, &BTreeSet::new(), &what).await;
        // A clean run converges: one base with the same state.
        let s = compact(&rig, &opts(&rig)).await;
        assert_eq!(s.outcome, Outcome::Done, "{what}: {s:?}");
        assert_eq!(rig.listed().await, [s.new_base.clone().unwrap()], "{what}");
        assert_no_row_lost(&rig, &b.state, &what).await;
        assert_eq!(
            oracle::retired_paths(rig.store.as_ref(), MANIFEST).await,
            b.listed,
            "{what}: the merged sources are retired"
        );
        assert_gc_removes_exactly(&rig, &b.listed, &what).await;
        more_deltas(&mut rig, &mut r).await;
    }
}

/// An ambiguous manifest save: the store reports a failure that does not prove the write did
/// not happen. Either outcome is consistent: not landed (the manifest is the same, the new
/// base is an unlisted orphan gc removes) or landed (the manifest lists exactly the new base
/// and retires every source, gc removes those). The schema fails saying so and naming the
/// base; nothing is deleted in band; a clean run converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ambiguous_manifest_save_leaves_one_of_two_consistent_lakes() {
    let (mut rig, mut r) = lake_with_base_and_deltas(1702).await;
    for landed in [false, true] {
        let what = if landed { "landed" } else { "not landed" };
        let b = before(&rig).await;
        let action = if landed {
            Action::FailAfter
        } else {
            Action::Fail
        };
        rig.store.arm(Op::PutBytes, Some(MANIFEST), 1, action);
        let calls = rig.store.calls().len();
        let s = compact(&rig, &opts(&rig)).await;
        assert_eq!(s.outcome, Outcome::Failed, "{what}: {s:?}");
        let err = s.error.clone().unwrap();
        assert!(err.contains("may or may not have landed"), "{what}: {err}");
        // The staged base is named and kept: it may be listed.
        let copies = merged_bases_put(&rig, calls);
        assert_eq!(copies.len(), 1, "{what}: {copies:?}");
        let base = &copies[0];
        assert!(err.contains(base.as_str()), "{what}: {err}");
        rig.store.head(base).await.unwrap();
        assert!(
            !rig.store.calls()[calls..]
                .iter()
                .any(|c| c.op == Op::Delete && c.key == *base),
            "{what}: the possibly listed base was deleted"
        );
        let m = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
            .await
            .unwrap();
        let listed: BTreeSet<String> = rig.listed().await.into_iter().collect();
        let leftovers = if landed {
            assert_eq!(listed, [base.clone()].into(), "{what}");
            assert_eq!(
                oracle::retired_paths(rig.store.as_ref(), MANIFEST).await,
                b.listed,
                "{what}"
            );
            for src in &b.listed {
                rig.store.head(src).await.unwrap();
            }
            b.listed.clone()
        } else {
            assert_eq!(
                rig.store.get_bytes(MANIFEST).await.unwrap().bytes,
                b.manifest,
                "{what}: {m}"
            );
            [base.clone()].into()
        };
        assert_no_row_lost(&rig, &b.state, what).await;
        assert!(rig.keys("data/100/_tmp/").await.is_empty(), "{what}");
        assert_gc_removes_exactly(&rig, &leftovers, what).await;
        // A clean run converges (a landed save left one base: nothing to do).
        let s = compact(&rig, &opts(&rig)).await;
        assert_eq!(s.outcome, Outcome::Done, "{what}: {s:?}");
        let decision = s.plan.as_ref().unwrap().decision;
        let want = if landed {
            Decision::Noop
        } else {
            Decision::Rewrite
        };
        assert_eq!(decision, want, "{what}: {s:?}");
        assert_eq!(rig.listed().await.len(), 1, "{what}");
        assert_no_row_lost(&rig, &b.state, what).await;
        let retired = if landed { BTreeSet::new() } else { b.listed };
        assert_gc_removes_exactly(&rig, &retired, what).await;
        more_deltas(&mut rig, &mut r).await;
    }
}

/// A compaction rewriting every range (`--dirty-ratio 0`), started and paused at its first
/// manifest save: its outputs are staged, unlisted, until the gate is released.
async fn paused_at_its_save(
    rig: &Rig,
) -> (
    tokio::task::JoinHandle<lakecdc::Result<lakecdc::compact::CompactReport>>,
    std::sync::Arc<Gate>,
) {
    let gate = Gate::new();
    rig.store
        .arm(Op::PutBytes, Some(MANIFEST), 1, Action::Pause(gate.clone()));
    let o = CompactOptions {
        dirty_ratio: 0.0,
        ..opts(rig)
    };
    let c = rig.job_context();
    let compaction = tokio::spawn(async move { lakecdc::compact::run(&c, &o).await });
    tokio::time::timeout(std::time::Duration::from_secs(60), gate.wait_reached())
        .await
        .expect("the compaction never saved");
    (compaction, gate)
}

/// A compaction whose sources are merged by another compaction while it waits to save: its
/// conditional save conflicts, the re-applied splice finds a source gone, so the staged base
/// (provably unlisted) is deleted and the whole pass starts again from the fresh manifest,
/// where it merges the winner's base with a delta flushed meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pass_that_lost_a_race_deletes_its_base_and_starts_over() {
    let (mut rig, mut r) = lake_with_base_and_deltas(1703).await;
    let b = before(&rig).await;
    let calls = rig.store.calls().len();
    let (loser, gate) = paused_at_its_save(&rig).await;
    // Paused at its save: its base is staged, unlisted.
    let staged = merged_bases_put(&rig, calls);
    assert_eq!(staged.len(), 1, "{staged:?}");
    let lost = staged[0].clone();
    rig.store.head(&lost).await.unwrap();
    assert!(!rig.listed().await.contains(&lost));
    // The winner merges the same sources; then a flush adds a delta over its base.
    let winner = compact(&rig, &opts(&rig)).await;
    assert_eq!(winner.outcome, Outcome::Done, "{winner:?}");
    let won = winner.new_base.clone().unwrap();
    for _ in 0..20 {
        rig.writer.random_op(&mut r).await;
    }
    let flushed = rig.flush().await;
    assert_eq!(flushed.schemas[0].files.len(), 1, "{flushed:?}");
    let delta = flushed.schemas[0].files[0].path.clone();
    let mid = oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
    gate.release();
    let report = loser.await.unwrap().unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, Outcome::Done, "{s:?}");
    assert_eq!(s.attempts, 2, "one lost pass, one that published: {s:?}");
    let new = s.new_base.clone().unwrap();
    assert!(new != lost && new != won);
    // The second pass merged the fresh manifest's files: the winner's base and the delta.
    assert_eq!(s.files_in, 2, "{s:?}");
    assert_eq!(rig.listed().await, std::slice::from_ref(&new));
    // The lost pass's base is gone, deleted by the compactor itself (nothing lists it).
    assert!(rig.store.head(&lost).await.unwrap_err().is_not_found());
    assert!(
        rig.store.calls()[calls..]
            .iter()
            .any(|c| c.op == Op::Delete && c.key == lost)
    );
    // Three saves: the paused one (conflict: nothing written), the winner's, the flush's, and
    // the second pass's.
    let saves = rig.store.calls()[calls..]
        .iter()
        .filter(|c| c.op == Op::PutBytes && c.key == MANIFEST)
        .count();
    assert_eq!(saves, 4);
    let mut retired = b.listed.clone();
    retired.extend([won.clone(), delta.clone()]);
    assert_eq!(
        oracle::retired_paths(rig.store.as_ref(), MANIFEST).await,
        retired
    );
    assert_no_row_lost(&rig, &mid, "after the retry").await;
    assert_gc_removes_exactly(&rig, &retired, "after the retry").await;
    assert_no_row_lost(&rig, &mid, "after gc").await;
}

/// A pass that lost its race to a compaction that left nothing to do reports the second pass
/// alone: no sources, no rows (docs/hazards.md L107; the lost attempt's counts stayed).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pass_that_lost_to_a_complete_compaction_reports_nothing_done() {
    let (rig, _r) = lake_with_base_and_deltas(1707).await;
    let (loser, gate) = paused_at_its_save(&rig).await;
    let winner = compact(&rig, &opts(&rig)).await;
    assert_eq!(winner.outcome, Outcome::Done, "{winner:?}");
    assert!(winner.files_in > 0 && winner.rows_in > 0, "{winner:?}");
    gate.release();
    let report = loser.await.unwrap().unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.attempts, 2, "{s:?}");
    assert_eq!(
        s.plan.as_ref().map(|p| p.decision),
        Some(Decision::Noop),
        "{s:?}"
    );
    assert_eq!(
        (
            s.files_in,
            s.files_out,
            s.rows_in,
            s.rows_out,
            s.bases_rewritten
        ),
        (0, 0, 0, 0, 0),
        "{s:?}"
    );
    assert!(s.new_base.is_none(), "{s:?}");
}

/// A splice whose conditional save meets another writer's newer manifest several times in a
/// row (a flush saves every batch) re-applies itself each time and lands: the merged work is
/// not thrown away after five busy saves (docs/hazards.md L109).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_splice_outlasts_a_run_of_other_writers_saves() {
    let (rig, _r) = lake_with_base_and_deltas(1709).await;
    const BUSY: u32 = 8;
    let gates: Vec<_> = (1..=BUSY)
        .map(|nth| {
            let gate = Gate::new();
            rig.store.arm(
                Op::PutBytes,
                Some(MANIFEST),
                nth,
                Action::Pause(gate.clone()),
            );
            gate
        })
        .collect();
    let o = CompactOptions {
        dirty_ratio: 0.0,
        ..opts(&rig)
    };
    let c = rig.job_context();
    let compaction = tokio::spawn(async move { lakecdc::compact::run(&c, &o).await });
    let inner = rig.store.inner().clone();
    for gate in &gates {
        tokio::time::timeout(std::time::Duration::from_secs(60), gate.wait_reached())
            .await
            .expect("the compaction never tried to save");
        // Another writer saves first (through the inner store: not a call the rules count).
        lakecdc::lake::manifest::commit(
            inner.as_ref(),
            MANIFEST,
            100,
            &lakecdc::clock::SystemClock,
            Default::default(),
            |_| Ok(()),
        )
        .await
        .unwrap();
        gate.release();
    }
    let report = compaction.await.unwrap().unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, Outcome::Done, "{s:?}");
    assert_eq!(s.attempts, 1, "one pass, its save re-applied: {s:?}");
    let new = s.new_base.clone().unwrap();
    assert_eq!(rig.listed().await, std::slice::from_ref(&new));
    let saves = rig
        .store
        .calls()
        .iter()
        .filter(|c| c.op == Op::PutBytes && c.key == MANIFEST)
        .count();
    assert!(saves > BUSY as usize, "{saves}");
}
