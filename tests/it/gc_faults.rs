//! `lakecdc gc` under injected store faults and concurrency: a failed delete (refused, or
//! landed then reported failed), a conflicting save of its `.gc-state` (written by another
//! writer meanwhile), and two gc runs at once while a compaction publishes. No listed file is
//! ever deleted, the sightings and the manifest's `retired` list stay exact, and a later run
//! converges.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use lakecdc::compact::Outcome as CompactOutcome;
use lakecdc::gc::{GcReport, Outcome, SchemaGc};
use lakecdc::store::fault::{Action, Call, Gate, Op};
use lakecdc::store::{ObjectStore, PutMode};
use uuid::Uuid;

use crate::compact::{lake_with_base_and_deltas, opts as compact_opts};
use crate::support::oracle;
use crate::support::rig::Rig;

const MANIFEST: &str = "manifest/100.json";
const STATE: &str = "manifest/100.json.gc-state";
const MIN: i64 = 60_000;

fn set(keys: &[String]) -> BTreeSet<String> {
    keys.iter().cloned().collect()
}

fn only(report: &GcReport) -> &SchemaGc {
    assert_eq!(report.schemas.len(), 1, "{report:?}");
    &report.schemas[0]
}

/// The sightings recorded in the gc state object.
async fn sightings(rig: &Rig) -> BTreeMap<String, i64> {
    match rig.store.get_bytes(STATE).await {
        Ok(got) => {
            let v: serde_json::Value = serde_json::from_slice(&got.bytes).unwrap();
            v["first_unlisted_ms"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_i64().unwrap()))
                .collect()
        }
        Err(e) if e.is_not_found() => BTreeMap::new(),
        Err(e) => panic!("gc state: {e}"),
    }
}

async fn exists(rig: &Rig, key: &str) -> bool {
    match rig.store.head(key).await {
        Ok(_) => true,
        Err(e) if e.is_not_found() => false,
        Err(e) => panic!("{key}: {e}"),
    }
}

/// Every listed file exists with its checksum and the lake equals PostgreSQL.
async fn assert_lake_intact(rig: &Rig) {
    let live = rig.writer.rows.values().filter(|m| !m.soft_deleted).count();
    assert!(live > 100, "{live}");
    assert_eq!(rig.assert_oracle().await, (live, 0));
}

/// A compacted lake (its sources retired, still present) with three orphans of the shapes gc
/// deletes: a tmp object, a merged base and an init base. Returns the rig and the keys gc
/// may delete once they are past the grace.
async fn lake_with_garbage(seed: u64) -> (Rig, BTreeSet<String>) {
    let (rig, _) = lake_with_base_and_deltas(seed).await;
    let sources = set(&rig.listed().await);
    let report = lakecdc::compact::run(&rig.job_context(), &compact_opts(&rig))
        .await
        .unwrap();
    assert_eq!(
        report.schemas[0].outcome,
        CompactOutcome::Done,
        "{report:?}"
    );
    assert_eq!(
        oracle::retired_paths(rig.store.as_ref(), MANIFEST).await,
        sources
    );
    let mut garbage = sources;
    garbage.extend(put_orphans(&rig).await);
    (rig, garbage)
}

/// Puts a tmp object, a merged base and an init base nobody lists.
async fn put_orphans(rig: &Rig) -> BTreeSet<String> {
    let layout = &rig.ctx.lake.layout;
    let keys = [
        layout.tmp_key(100, Uuid::new_v4()),
        layout.merged_base_key(100, Uuid::now_v7()),
        layout.init_base_key(100, Uuid::new_v4(), Uuid::new_v4(), Uuid::now_v7()),
    ];
    for k in &keys {
        rig.store
            .put_bytes(k, Bytes::from_static(b"orphan"), PutMode::Overwrite)
            .await
            .unwrap();
    }
    keys.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delete_keeps_the_object_its_sighting_and_its_retirement() {
    let (rig, garbage) = lake_with_garbage(1801).await;
    let retired = oracle::retired_paths(rig.store.as_ref(), MANIFEST).await;
    let listed = set(&rig.listed().await);
    let (clock, gctx, gopts) = rig.gc_on_a_manual_clock();
    // First sighting.
    let first = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    assert_eq!(set(&only(&first).within_grace), garbage);
    assert!(only(&first).deleted.is_empty());
    let sighted = sightings(&rig).await;
    assert_eq!(sighted.keys().cloned().collect::<BTreeSet<_>>(), garbage);
    // Past the grace, two deletes of retired sources fail: one refused, one that landed and
    // was reported failed anyway.
    clock.advance(16 * MIN);
    let mut victims = retired.iter();
    let (refused, lost_answer) = (
        victims.next().unwrap().clone(),
        victims.next().unwrap().clone(),
    );
    rig.store.arm(Op::Delete, Some(&refused), 1, Action::Fail);
    rig.store
        .arm(Op::Delete, Some(&lost_answer), 1, Action::FailAfter);
    let calls = rig.store.calls().len();
    let second = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    let s = only(&second);
    let failed: BTreeSet<String> = [refused.clone(), lost_answer.clone()].into();
    assert_eq!(s.outcome, Some(Outcome::Pending), "{second:?}");
    // Kept for the next run, which retries them: nothing for a person to do.
    assert_eq!(second.exit_code(), 0);
    assert_eq!(set(&s.within_grace), failed, "{second:?}");
    assert_eq!(
        set(&s.deleted),
        garbage.difference(&failed).cloned().collect(),
        "{second:?}"
    );
    // Both faults fired, on exactly those keys.
    let deletes: Vec<String> = rig.store.calls()[calls..]
        .iter()
        .filter(|c| c.op == Op::Delete)
        .map(|c| c.key.clone())
        .collect();
    assert_eq!(set(&deletes), garbage);
    assert!(exists(&rig, &refused).await);
    assert!(!exists(&rig, &lost_answer).await);
    for k in garbage.difference(&failed) {
        assert!(!exists(&rig, k).await, "{k}");
    }
    // The failed keys keep their first sighting (their grace is not restarted) and their
    // retirement; the rest are forgotten.
    let kept = sightings(&rig).await;
    assert_eq!(
        kept,
        failed
            .iter()
            .map(|k| (k.clone(), sighted[k]))
            .collect::<BTreeMap<_, _>>()
    );
    assert_eq!(
        oracle::retired_paths(rig.store.as_ref(), MANIFEST).await,
        failed
    );
    assert_eq!(set(&rig.listed().await), listed);
    assert_lake_intact(&rig).await;
    // The next run deletes the refused one and forgets the one already gone.
    let third = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    let s = only(&third);
    assert_eq!(s.outcome, Some(Outcome::Clean), "{third:?}");
    assert_eq!(s.deleted, std::slice::from_ref(&refused));
    assert!(!exists(&rig, &refused).await);
    assert!(sightings(&rig).await.is_empty());
    assert!(
        oracle::retired_paths(rig.store.as_ref(), MANIFEST)
            .await
            .is_empty()
    );
    let mut want = listed.clone();
    want.insert("data/100/_owner.json".into());
    assert_eq!(set(&rig.keys("data/100/").await), want);
    assert_lake_intact(&rig).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gc_state_written_meanwhile_fails_the_save_and_is_kept() {
    // gc deletes what is due, then saves its sightings conditionally on the state it loaded.
    // Another writer replaces the state in between: the save is refused, the run fails naming
    // the step, the other writer's state stands, and the next run converges.
    let (rig, garbage) = lake_with_garbage(1802).await;
    let listed = set(&rig.listed().await);
    let manifest = rig.store.get_bytes(MANIFEST).await.unwrap().bytes;
    let (clock, gctx, gopts) = rig.gc_on_a_manual_clock();
    lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    clock.advance(16 * MIN);
    // A new orphan, sighted by the next run: its state changes, so it saves.
    let late = put_orphans(&rig).await;
    let gate = Gate::new();
    rig.store.arm(
        Op::PutBytes,
        Some(".gc-state"),
        1,
        Action::Pause(gate.clone()),
    );
    let run = {
        let (gctx, gopts) = (gctx.clone(), gopts.clone());
        tokio::spawn(async move { lakecdc::gc::run(&gctx, &gopts).await })
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), gate.wait_reached())
        .await
        .expect("gc never saved its state");
    // By its save, gc has deleted everything due.
    for k in &garbage {
        assert!(!exists(&rig, k).await, "{k}");
    }
    let foreign = br#"{"first_unlisted_ms":{"data/100/_tmp/written-by-another-gc":1}}"#;
    rig.store
        .put_bytes(STATE, Bytes::from_static(foreign), PutMode::Overwrite)
        .await
        .unwrap();
    gate.release();
    let report = run.await.unwrap().unwrap();
    let s = only(&report);
    assert_eq!(s.outcome, Some(Outcome::Failed), "{report:?}");
    assert_eq!(report.exit_code(), 1);
    let why = s.reason.as_deref().unwrap();
    assert!(
        why.contains("save gc state") && why.contains(STATE),
        "{why}"
    );
    assert!(why.contains("precondition failed"), "{why}");
    // The other writer's state is not overwritten; the manifest was not touched (the retired
    // list is forgotten only after a successful save); the listed files are all there.
    assert_eq!(
        &rig.store.get_bytes(STATE).await.unwrap().bytes[..],
        &foreign[..]
    );
    assert_eq!(rig.store.get_bytes(MANIFEST).await.unwrap().bytes, manifest);
    assert_eq!(set(&rig.listed().await), listed);
    for k in &late {
        assert!(exists(&rig, k).await, "{k}");
    }
    assert_lake_intact(&rig).await;
    // The next run sights the late orphans afresh, drops the stale foreign key and forgets
    // the retired sources that are gone.
    let next = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    let s = only(&next);
    assert_eq!(s.outcome, Some(Outcome::Pending), "{next:?}");
    assert_eq!(set(&s.within_grace), late);
    assert!(s.deleted.is_empty());
    assert_eq!(
        sightings(&rig)
            .await
            .keys()
            .cloned()
            .collect::<BTreeSet<_>>(),
        late
    );
    assert!(
        oracle::retired_paths(rig.store.as_ref(), MANIFEST)
            .await
            .is_empty()
    );
    clock.advance(16 * MIN);
    let last = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    assert_eq!(set(&only(&last).deleted), late, "{last:?}");
    assert_eq!(only(&last).outcome, Some(Outcome::Clean));
    assert!(sightings(&rig).await.is_empty());
    assert_lake_intact(&rig).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_gc_while_one_runs_is_locked_out_and_touches_nothing() {
    let (rig, garbage) = lake_with_garbage(1803).await;
    let (clock, gctx, gopts) = rig.gc_on_a_manual_clock();
    lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    clock.advance(16 * MIN);
    // The first run is held at its first delete.
    let gate = Gate::new();
    rig.store
        .arm(Op::Delete, None, 1, Action::Pause(gate.clone()));
    let first = {
        let (gctx, gopts) = (gctx.clone(), gopts.clone());
        tokio::spawn(async move { lakecdc::gc::run(&gctx, &gopts).await })
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), gate.wait_reached())
        .await
        .expect("gc never deleted");
    let calls = rig.store.calls().len();
    let second = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    assert_eq!(only(&second).outcome, Some(Outcome::Locked), "{second:?}");
    assert!(only(&second).deleted.is_empty());
    assert_eq!(second.exit_code(), 3);
    assert_eq!(
        rig.store.calls()[calls..].to_vec(),
        Vec::<Call>::new(),
        "the locked-out run touched the store"
    );
    assert!(!first.is_finished());
    gate.release();
    let first = first.await.unwrap().unwrap();
    assert_eq!(set(&only(&first).deleted), garbage, "{first:?}");
    assert_eq!(only(&first).outcome, Some(Outcome::Clean));
    assert_lake_intact(&rig).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_gc_runs_racing_a_compaction_never_delete_a_listed_file() {
    // Rounds of: new garbage sighted and aged past the grace, new deltas flushed; then two gc
    // runs start at once while a compaction merges and publishes. Whichever gc gets the
    // schema lock deletes exactly the due garbage (the other is locked out or, after it,
    // finds nothing due); no store delete names a file listed during the round (the sources
    // the compaction retires meanwhile get their grace first).
    let (mut rig, _) = lake_with_base_and_deltas(1804).await;
    let mut r = crate::support::writer::Rng::new(18040);
    let (clock, gctx, gopts) = rig.gc_on_a_manual_clock();
    let mut outcomes = Vec::new();
    for round in 0..4 {
        // A delta over the last round's base; the garbage of the last round's compaction (its
        // retired sources) plus new orphans, sighted and then aged past the grace.
        for _ in 0..30 {
            rig.writer.random_op(&mut r).await;
        }
        rig.flush().await;
        put_orphans(&rig).await;
        let listed_before = set(&rig.listed().await);
        let sighting = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
        let due = set(&only(&sighting).within_grace);
        assert!(due.len() >= 3, "round {round}: {sighting:?}");
        assert!(
            due.is_disjoint(&listed_before),
            "round {round}: {sighting:?}"
        );
        clock.advance(16 * MIN);
        let calls = rig.store.calls().len();
        let start = Arc::new(tokio::sync::Barrier::new(3));
        let spawn_gc = || {
            let (gctx, gopts, start) = (gctx.clone(), gopts.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                lakecdc::gc::run(&gctx, &gopts).await.unwrap()
            })
        };
        let (a, b) = (spawn_gc(), spawn_gc());
        let compaction = {
            let (c, o, start) = (
                rig.job_context(),
                lakecdc::compact::CompactOptions {
                    dirty_ratio: 0.0,
                    ..compact_opts(&rig)
                },
                start.clone(),
            );
            tokio::spawn(async move {
                start.wait().await;
                lakecdc::compact::run(&c, &o).await.unwrap()
            })
        };
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        let compacted = compaction.await.unwrap();
        assert_eq!(
            compacted.schemas[0].outcome,
            CompactOutcome::Done,
            "round {round}: {compacted:?}"
        );
        let new_base = compacted.schemas[0].new_base.clone().unwrap();
        let mut listed_in_round = listed_before.clone();
        listed_in_round.insert(new_base.clone());
        let (sa, sb) = (only(&a), only(&b));
        outcomes.push((sa.outcome, sb.outcome));
        for s in [sa, sb] {
            assert!(
                matches!(
                    s.outcome,
                    Some(Outcome::Clean | Outcome::Pending | Outcome::Locked)
                ),
                "round {round}: {s:?}"
            );
        }
        let (da, db) = (set(&sa.deleted), set(&sb.deleted));
        assert!(da.is_disjoint(&db), "round {round}: deleted twice");
        let deleted: BTreeSet<String> = da.union(&db).cloned().collect();
        assert_eq!(deleted, due, "round {round}: {a:?} {b:?}");
        // No delete named a listed file, and every listed file is there.
        for c in &rig.store.calls()[calls..] {
            if c.op == Op::Delete {
                assert!(
                    !listed_in_round.contains(&c.key),
                    "round {round}: deleted listed {}",
                    c.key
                );
            }
        }
        assert_eq!(
            rig.listed().await,
            std::slice::from_ref(&new_base),
            "round {round}"
        );
        assert_eq!(
            oracle::retired_paths(rig.store.as_ref(), MANIFEST).await,
            listed_before,
            "round {round}: only this round's sources are retired"
        );
        for k in &listed_before {
            assert!(exists(&rig, k).await, "round {round}: {k}");
        }
        assert_lake_intact(&rig).await;
    }
    // The rounds did race: at least once one run found the other holding the lock.
    assert!(
        outcomes
            .iter()
            .any(|(a, b)| *a == Some(Outcome::Locked) || *b == Some(Outcome::Locked)),
        "{outcomes:?}"
    );
    // Final state: past the grace, gc leaves exactly the listed base and the owner marker.
    clock.advance(16 * MIN);
    lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    clock.advance(16 * MIN);
    let last = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    assert_eq!(only(&last).outcome, Some(Outcome::Clean), "{last:?}");
    let mut want = set(&rig.listed().await);
    want.insert("data/100/_owner.json".into());
    assert_eq!(set(&rig.keys("data/100/").await), want);
    assert!(sightings(&rig).await.is_empty());
    assert_lake_intact(&rig).await;
}
