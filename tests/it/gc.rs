//! `lakecdc gc`: orphans are sighted, kept within the grace period and deleted past it (with a
//! moved clock); unlisted deltas and unknown keys are never deleted; #463 refusal; dry run.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use lakecdc::clock::{Clock, ManualClock, SystemClock};
use lakecdc::gc::{Context, GcOptions, Outcome};
use lakecdc::store::fault::{Action, Op};
use lakecdc::store::{ObjectStore, PutMode};
use uuid::Uuid;

use crate::support::rig::{LakeKind, Rig, rig};
use crate::support::writer::Rng;

const MIN: i64 = 60_000;

/// gc on `clock`, keeping no manifest history: the grace alone decides (tests/it/history.rs
/// covers the retention).
fn ctx(rig: &Rig, clock: Arc<ManualClock>) -> Context {
    let mut ctx = Context {
        clock,
        ..rig.job_context()
    };
    ctx.lake.layout = ctx.lake.layout.with_history_retention(Duration::ZERO);
    ctx
}

fn opts(dry_run: bool) -> GcOptions {
    GcOptions {
        schemas: vec!["customer".into()],
        grace: std::time::Duration::from_secs(15 * 60),
        dry_run,
        repair: false,
        settle_rows: lakecdc::gc::SETTLE_ROWS,
    }
}

async fn put(store: &dyn ObjectStore, key: &str) {
    store
        .put_bytes(key, Bytes::from_static(b"x"), PutMode::Overwrite)
        .await
        .unwrap();
}

#[tokio::test]
async fn orphans_are_deleted_only_past_the_grace_and_deltas_never() {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(7);
    rig.seed(30, &mut r).await;
    rig.flush().await;
    let layout = rig.ctx.lake.layout.clone();
    // A staging object, as earlier releases left when a delete failed.
    let tmp = [layout.tmp_key(100, Uuid::new_v4())];
    put(rig.store.as_ref(), &tmp[0]).await;
    let merged = layout.merged_base_key(100, Uuid::now_v7());
    let init = layout.init_base_key(100, Uuid::new_v4(), Uuid::new_v4(), Uuid::now_v7());
    let delta = layout.delta_key(100, Uuid::now_v7());
    let unknown = "data/100/notes.txt".to_string();
    for k in [&merged, &init, &delta, &unknown] {
        put(rig.store.as_ref(), k).await;
    }
    let listed_before = rig.listed().await;
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let gc = ctx(&rig, clock.clone());

    // First run: everything is sighted, nothing deleted.
    let report = lakecdc::gc::run(&gc, &opts(false)).await.unwrap();
    let s = &report.schemas[0];
    // The unknown key and the unreadable delta need a person.
    assert_eq!(s.outcome, Some(Outcome::Attention));
    let mut within = s.within_grace.clone();
    within.sort();
    let mut want = vec![tmp[0].clone(), merged.clone(), init.clone()];
    want.sort();
    assert_eq!(within, want);
    assert_eq!(s.unlisted_deltas, std::slice::from_ref(&delta));
    assert_eq!(s.unknown, std::slice::from_ref(&unknown));
    assert!(s.deleted.is_empty());
    assert_eq!(report.exit_code(), 3);
    let state_key = layout.gc_state_key(100);
    let state: serde_json::Value =
        serde_json::from_slice(&rig.store.get_bytes(&state_key).await.unwrap().bytes).unwrap();
    assert_eq!(state["first_unlisted_ms"].as_object().unwrap().len(), 3);

    // Ten minutes later: still within the grace.
    clock.advance(10 * MIN);
    let report = lakecdc::gc::run(&gc, &opts(false)).await.unwrap();
    assert!(report.schemas[0].deleted.is_empty());

    // Past the grace, a dry run reports and changes nothing.
    clock.advance(6 * MIN);
    let state_before = rig.store.get_bytes(&state_key).await.unwrap().bytes;
    let writes_before = rig.store.writes().len();
    let report = lakecdc::gc::run(&gc, &opts(true)).await.unwrap();
    assert_eq!(report.schemas[0].deleted.len(), 3);
    assert_eq!(rig.store.writes().len(), writes_before, "dry run wrote");
    assert_eq!(
        rig.store.get_bytes(&state_key).await.unwrap().bytes,
        state_before
    );
    for k in [&tmp[0], &merged, &init] {
        rig.store.head(k).await.unwrap();
    }

    // The real run deletes exactly the three orphans.
    let report = lakecdc::gc::run(&gc, &opts(false)).await.unwrap();
    let s = &report.schemas[0];
    let mut deleted = s.deleted.clone();
    deleted.sort();
    assert_eq!(deleted, want);
    for k in &want {
        assert!(rig.store.head(k).await.unwrap_err().is_not_found(), "{k}");
    }
    for k in [&delta, &unknown] {
        rig.store.head(k).await.unwrap();
    }
    for k in &listed_before {
        rig.store.head(k).await.unwrap();
    }
    assert_eq!(
        s.outcome,
        Some(Outcome::Attention),
        "the unreadable unlisted delta and the unknown key still need a look"
    );
    let state: serde_json::Value =
        serde_json::from_slice(&rig.store.get_bytes(&state_key).await.unwrap().bytes).unwrap();
    assert!(state["first_unlisted_ms"].as_object().unwrap().is_empty());
    let (compared, dirty) = rig.assert_oracle().await;
    assert_eq!((compared, dirty), (30, 0));
}

#[tokio::test]
async fn a_store_failing_while_an_unlisted_delta_is_read_fails_the_run_not_a_person() {
    // docs/hazards.md L69: a network blip while gc reads an unlisted delta is a failed run
    // (exit 1: the next run reads it again), never "a person must act" (exit 3), which is kept
    // for an object whose content cannot be read.
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(11);
    rig.seed(20, &mut r).await;
    rig.flush().await;
    let delta = rig.ctx.lake.layout.delta_key(100, Uuid::now_v7());
    put(rig.store.as_ref(), &delta).await;
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let gc = ctx(&rig, clock);
    let state_key = rig.ctx.lake.layout.gc_state_key(100);
    let state_before = rig.store.get_bytes(&state_key).await.ok().map(|g| g.bytes);

    rig.store
        .arm(Op::Head, Some(delta.as_str()), 1, Action::Fail);
    let report = lakecdc::gc::run(&gc, &opts(false)).await.unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, Some(Outcome::Failed), "{s:?}");
    assert!(
        s.unlisted_deltas.is_empty() && s.deleted.is_empty(),
        "{s:?}"
    );
    let reason = s.reason.as_deref().unwrap_or_default();
    assert!(reason.contains(&delta), "{reason}");
    assert_eq!(report.exit_code(), 1);
    // Nothing was sighted or saved by the failed run.
    assert_eq!(
        rig.store.get_bytes(&state_key).await.ok().map(|g| g.bytes),
        state_before
    );
    rig.store.head(&delta).await.unwrap();

    // The next run reads it: one byte is not Parquet, so that one is for a person.
    let report = lakecdc::gc::run(&gc, &opts(false)).await.unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, Some(Outcome::Attention), "{s:?}");
    assert_eq!(s.unlisted_deltas, std::slice::from_ref(&delta));
    assert_eq!(report.exit_code(), 3);
}

#[tokio::test]
async fn a_prefix_of_bases_that_the_manifest_does_not_list_is_refused() {
    // docs/hazards.md #463/#481
    let rig = rig(LakeKind::S3).await;
    let layout = rig.ctx.lake.layout.clone();
    let base = layout.init_base_key(100, Uuid::new_v4(), Uuid::new_v4(), Uuid::now_v7());
    let tmp = layout.tmp_key(100, Uuid::new_v4());
    put(rig.store.as_ref(), &base).await;
    put(rig.store.as_ref(), &tmp).await;
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms() + 24 * 60 * MIN));
    let report = lakecdc::gc::run(&ctx(&rig, clock), &opts(false))
        .await
        .unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, Some(Outcome::Refused));
    assert!(s.reason.as_deref().unwrap().contains("lists none"), "{s:?}");
    assert_eq!(report.exit_code(), 3);
    rig.store.head(&base).await.unwrap();
    rig.store.head(&tmp).await.unwrap();
    assert!(
        rig.store
            .writes()
            .iter()
            .all(|c| c.op == Op::PutBytes && !c.key.contains("gc-state"))
    );
}

#[tokio::test]
async fn a_file_retired_after_an_early_sighting_still_gets_its_whole_grace() {
    // gc sights a base while it is still unlisted (a compaction staging it); the compaction
    // lists it, and a later one retires it before gc runs again. Readers of the manifest that
    // listed it get the whole grace from its retirement, not from the old sighting.
    use lakecdc::lake::manifest;
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(461);
    rig.seed(20, &mut r).await;
    rig.flush().await;
    let layout = rig.ctx.lake.layout.clone();
    let base = layout.merged_base_key(100, Uuid::now_v7());
    put(rig.store.as_ref(), &base).await;
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let gc = ctx(&rig, clock.clone());
    let first = lakecdc::gc::run(&gc, &opts(false)).await.unwrap();
    assert_eq!(first.schemas[0].within_grace, std::slice::from_ref(&base));
    let commit = |clock: Arc<ManualClock>, f: Box<dyn Fn(&mut manifest::Manifest) + Send>| {
        let store = rig.store.clone();
        async move {
            manifest::commit(
                store.as_ref(),
                "manifest/100.json",
                100,
                clock.as_ref(),
                Default::default(),
                |m| {
                    f(m);
                    Ok(())
                },
            )
            .await
            .unwrap();
        }
    };
    // Listed by the first compaction, then retired by a second one 20 minutes later.
    let listed = base.clone();
    commit(
        clock.clone(),
        Box::new(move |m| {
            let mut entry = m.files[0].clone();
            entry.path = listed.clone();
            entry.tier = manifest::Tier::Base;
            m.files.push(entry);
        }),
    )
    .await;
    clock.advance(20 * MIN);
    let (retired, now) = (base.clone(), clock.now_ms());
    commit(
        clock.clone(),
        Box::new(move |m| {
            m.files.retain(|f| f.path != retired);
            m.retire([&retired], now);
        }),
    )
    .await;
    let second = lakecdc::gc::run(&gc, &opts(false)).await.unwrap();
    assert_eq!(
        second.schemas[0].within_grace,
        std::slice::from_ref(&base),
        "deleted right after its retirement: {second:?}"
    );
    rig.store.head(&base).await.unwrap();
    clock.advance(16 * MIN);
    let third = lakecdc::gc::run(&gc, &opts(false)).await.unwrap();
    assert_eq!(
        third.schemas[0].deleted,
        std::slice::from_ref(&base),
        "{third:?}"
    );
    assert!(rig.store.head(&base).await.unwrap_err().is_not_found());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_listed_while_gc_lists_the_prefix_is_not_sighted() {
    // A base committed between gc's manifest load and its listing looks unlisted to the first
    // load. The second look finds it listed: it must be neither deleted nor remembered as
    // sighted (an early sighting would later cut its grace short once it is unlisted again).
    use lakecdc::lake::manifest;
    use lakecdc::store::fault::Gate;
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(462);
    rig.seed(10, &mut r).await;
    rig.flush().await;
    let base = rig.ctx.lake.layout.merged_base_key(100, Uuid::now_v7());
    put(rig.store.as_ref(), &base).await;
    let gate = Gate::new();
    rig.store
        .arm(Op::List, Some("data/100/"), 1, Action::Pause(gate.clone()));
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms() + 60 * MIN));
    let gc = ctx(&rig, clock.clone());
    let calls = rig.store.calls().len();
    let run = tokio::spawn(async move { lakecdc::gc::run(&gc, &opts(false)).await });
    tokio::time::timeout(std::time::Duration::from_secs(30), gate.wait_reached())
        .await
        .expect("gc never listed the prefix");
    // The race under test: gc read the manifest before its listing.
    assert!(
        rig.store.calls()[calls..]
            .iter()
            .any(|c| c.op == Op::GetBytes && c.key == "manifest/100.json"),
        "gc listed before reading the manifest"
    );
    let listed = base.clone();
    manifest::commit(
        rig.store.as_ref(),
        "manifest/100.json",
        100,
        clock.as_ref(),
        Default::default(),
        |m| {
            let mut entry = m.files[0].clone();
            entry.path = listed.clone();
            entry.tier = manifest::Tier::Base;
            m.files.push(entry);
            Ok(())
        },
    )
    .await
    .unwrap();
    gate.release();
    let report = run.await.unwrap().unwrap();
    let s = &report.schemas[0];
    assert!(
        s.deleted.is_empty() && s.within_grace.is_empty(),
        "{report:?}"
    );
    rig.store.head(&base).await.unwrap();
    let state = rig
        .store
        .get_bytes(&rig.ctx.lake.layout.gc_state_key(100))
        .await
        .map(|g| String::from_utf8(g.bytes.to_vec()).unwrap())
        .unwrap_or_default();
    assert!(!state.contains(&base), "sighted while listed: {state}");
}

/// The refusal names the manifest that owns the prefix.
fn assert_owned_by_the_first_manifest(why: Option<&str>) {
    assert!(
        why.is_some_and(|w| w.contains("belongs to manifest manifest/100.json")),
        "{why:?}"
    );
}

#[tokio::test]
async fn a_data_prefix_belongs_to_one_manifest() {
    // A second manifest (another --manifest-template) over the same data prefix: gc would take
    // the first manifest's files for orphans. The first writer to publish claims the prefix;
    // init under the other manifest refuses it, and so do flush, gc and compact.
    use lakecdc::init::{InitOptions, Outcome as InitOutcome};
    use lakecdc::lake::{Lake, Layout};
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(463);
    rig.seed(20, &mut r).await;
    let init_opts = InitOptions {
        schemas: vec!["customer".into()],
        work_dir: rig.opts.work_dir.clone(),
        ..InitOptions::default()
    };
    let report = lakecdc::init::run(&rig.ctx, &init_opts).await.unwrap();
    assert_eq!(report.schemas[0].outcome, InitOutcome::Exported);
    let marker = rig
        .store
        .get_bytes(&rig.ctx.lake.layout.owner_key(100))
        .await
        .unwrap();
    assert!(
        String::from_utf8_lossy(&marker.bytes).contains("manifest/100.json"),
        "{marker:?}"
    );
    let objects = rig.keys("data/100/").await;
    // The same lake seen through another manifest template.
    let mut other = rig.ctx.clone();
    other.lake = Lake {
        store: rig.store.clone(),
        layout: Layout::new("", "data", "staging/{schema_id}.json").unwrap(),
    };
    let report = lakecdc::init::run(&other, &init_opts).await.unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, InitOutcome::Refused, "{s:?}");
    assert_owned_by_the_first_manifest(s.reason.as_deref());
    // flush through the other manifest writes nothing and leaves the rows dirty.
    rig.seed(5, &mut r).await;
    let dirty = crate::support::oracle::dirty(&rig.writer).await;
    assert!(dirty.len() >= 5);
    let writes = rig.store.writes().len();
    // The run, and its dry run, fail the same way.
    for dry_run in [false, true] {
        let flush_opts = lakecdc::flush::FlushOptions {
            schemas: vec!["customer".into()],
            dry_run,
            ..rig.opts.clone()
        };
        let report = lakecdc::flush::run(&other, &flush_opts).await.unwrap();
        let s = &report.schemas[0];
        assert_eq!(s.outcome, lakecdc::flush::Outcome::Failed, "{s:?}");
        assert_owned_by_the_first_manifest(s.reason.as_deref());
        assert_eq!(rig.store.writes().len(), writes, "the refused flush wrote");
        assert_eq!(crate::support::oracle::dirty(&rig.writer).await, dirty);
    }
    // The other manifest lists one of the prefix's bases (so the older "lists none of them"
    // guard does not apply) and, as a delta, another: gc through it must still refuse, not
    // delete the rest, and compact has work to do there.
    let mine = lakecdc::lake::manifest::load(rig.store.as_ref(), "manifest/100.json", 100)
        .await
        .unwrap()
        .unwrap();
    let one = mine.manifest.files[0].clone();
    let mut delta = mine.manifest.files[1].clone();
    delta.tier = lakecdc::lake::manifest::Tier::Delta;
    lakecdc::lake::manifest::commit(
        rig.store.as_ref(),
        "staging/100.json",
        100,
        &SystemClock,
        Default::default(),
        |m| {
            m.files.extend([one.clone(), delta.clone()]);
            Ok(())
        },
    )
    .await
    .unwrap();
    let gc_ctx = Context {
        lake: other.lake.clone(),
        ..ctx(
            &rig,
            Arc::new(ManualClock::new(SystemClock.now_ms() + 24 * 60 * MIN)),
        )
    };
    let report = lakecdc::gc::run(&gc_ctx, &opts(false)).await.unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, Some(Outcome::Refused), "{report:?}");
    assert_owned_by_the_first_manifest(s.reason.as_deref());
    assert_eq!(
        rig.keys("data/100/").await,
        objects,
        "the other manifest touched the prefix"
    );
    // compact through the other manifest (a base and a delta to merge) fails the schema
    // before writing anything.
    let staged_before = rig.store.get_bytes("staging/100.json").await.unwrap().bytes;
    use lakecdc::compact::CompactOptions;
    let compact_opts = CompactOptions {
        dirty_ratio: 0.0,
        work_dir: rig.opts.work_dir.clone(),
        ..Default::default()
    };
    // A dry run says so too (it claims nothing, so only the check before any work can).
    let dry = CompactOptions {
        dry_run: true,
        ..compact_opts.clone()
    };
    let report = lakecdc::compact::run(&gc_ctx, &dry).await.unwrap();
    assert_eq!(
        report.schemas[0].outcome,
        lakecdc::compact::Outcome::Failed,
        "{report:?}"
    );
    let report = lakecdc::compact::run(&gc_ctx, &compact_opts).await.unwrap();
    let s = &report.schemas[0];
    assert_eq!(
        (s.outcome, s.plan.as_ref().map(|p| p.decision)),
        (
            lakecdc::compact::Outcome::Failed,
            Some(lakecdc::compact::Decision::Rewrite)
        ),
        "{s:?}"
    );
    assert_owned_by_the_first_manifest(s.error.as_deref());
    assert_eq!(
        rig.store.get_bytes("staging/100.json").await.unwrap().bytes,
        staged_before,
        "the refused compaction changed the other manifest"
    );
    assert_eq!(rig.keys("data/100/").await, objects);
    // Under its own manifest, gc runs as usual.
    let gc_ctx = ctx(
        &rig,
        Arc::new(ManualClock::new(SystemClock.now_ms() + 24 * 60 * MIN)),
    );
    let report = lakecdc::gc::run(&gc_ctx, &opts(false)).await.unwrap();
    assert_eq!(
        report.schemas[0].outcome,
        Some(Outcome::Clean),
        "{report:?}"
    );
}

/// Leaves what a run killed mid-write leaves in the rig's lake under `data/100/`: an S3
/// multipart upload never completed (and another writer's, to a key of no lakecdc shape), or
/// a local lake's temporary file. Returns its key (and the other writer's).
async fn killed_write(rig: &Rig, kind: &LakeKind) -> (String, Option<String>) {
    match kind {
        LakeKind::S3 => {
            let bucket = rig.store.describe();
            let s3 = lakecdc::store::s3::S3Store::connect(&crate::support::harness::s3_options(
                bucket.trim_start_matches("s3://").trim_end_matches('/'),
            ))
            .await;
            // A flush's staging key: what lakecdc uploads in parts.
            let key = format!("data/100/_tmp/{}.parquet", Uuid::new_v4());
            let foreign = "data/100/exports/notes.bin".to_string();
            for key in [&key, &foreign] {
                let up = s3
                    .client()
                    .create_multipart_upload()
                    .bucket(s3.bucket())
                    .key(key)
                    .send()
                    .await
                    .unwrap();
                s3.client()
                    .upload_part()
                    .bucket(s3.bucket())
                    .key(key)
                    .upload_id(up.upload_id().unwrap())
                    .part_number(1)
                    .body(vec![7u8; 1024].into())
                    .send()
                    .await
                    .unwrap();
            }
            (key, Some(foreign))
        }
        LakeKind::Local => {
            let key = "data/100/.lakecdc-tmp-killed";
            std::fs::write(rig.work.path().join("lake").join(key), vec![7u8; 1024]).unwrap();
            (key.to_string(), None)
        }
    }
}

#[tokio::test]
async fn writes_killed_runs_left_unfinished_are_undone_past_an_hour() {
    for s3 in [true, false] {
        let kind = || if s3 { LakeKind::S3 } else { LakeKind::Local };
        let mut rig = rig(kind()).await;
        let mut r = Rng::new(3105);
        rig.seed(10, &mut r).await;
        assert!(!rig.flush().await.failed());
        let (key, foreign) = killed_write(&rig, &kind()).await;
        let unfinished = || async {
            let mut keys: Vec<String> = rig
                .store
                .abandoned_writes("data/100/")
                .await
                .unwrap()
                .into_iter()
                .map(|w| w.key)
                .collect();
            keys.sort();
            keys
        };
        let mut all: Vec<String> = std::iter::once(key.clone())
            .chain(foreign.clone())
            .collect();
        all.sort();
        assert_eq!(unfinished().await, all);
        let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
        let gctx = ctx(&rig, clock.clone());
        // Younger than an hour: it may still be a live run's.
        let report = lakecdc::gc::run(&gctx, &opts(false)).await.unwrap();
        assert!(report.schemas[0].abandoned.is_empty(), "{report:?}");
        clock.advance(61 * MIN);
        let dry = lakecdc::gc::run(&gctx, &opts(true)).await.unwrap();
        assert_eq!(dry.schemas[0].abandoned, [key.as_str()], "{dry:?}");
        assert!(
            dry.to_text().contains("abandoned write"),
            "{}",
            dry.to_text()
        );
        assert_eq!(unfinished().await, all, "a dry run undid it");
        let report = lakecdc::gc::run(&gctx, &opts(false)).await.unwrap();
        let s = &report.schemas[0];
        assert_eq!(s.abandoned, [key.as_str()], "{report:?}");
        assert_eq!((s.outcome, report.exit_code()), (Some(Outcome::Clean), 0));
        // Another writer's upload is not lakecdc's to abort.
        assert_eq!(unfinished().await, foreign.into_iter().collect::<Vec<_>>());
        rig.assert_oracle().await;
    }
}

#[tokio::test]
async fn gc_carries_on_when_unfinished_writes_cannot_be_listed() {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(3106);
    rig.seed(10, &mut r).await;
    assert!(!rig.flush().await.failed());
    rig.store.arm(Op::ListUnfinished, None, 1, Action::Fail);
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let report = lakecdc::gc::run(&ctx(&rig, clock), &opts(false))
        .await
        .unwrap();
    let s = &report.schemas[0];
    assert!(s.abandoned.is_empty(), "{report:?}");
    assert_eq!((s.outcome, report.exit_code()), (Some(Outcome::Clean), 0));
    assert!(
        rig.store.calls().iter().any(|c| c.op == Op::ListUnfinished),
        "gc never asked"
    );
    // Nothing of the lake was touched.
    rig.assert_oracle().await;
}

#[tokio::test]
async fn a_gc_whose_lock_session_ends_deletes_nothing_and_a_rerun_does() {
    // docs/hazards.md L68: the database ends the session holding the schema's lock while gc
    // lists the prefix. Its plan is not acted on: the orphan past its grace stays, no sighting
    // is written, and the schema fails naming the lost lock. The next run deletes it.
    use crate::support::harness;
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(6802);
    rig.seed(10, &mut r).await;
    rig.flush().await;
    let orphan = rig.ctx.lake.layout.merged_base_key(100, Uuid::now_v7());
    put(rig.store.as_ref(), &orphan).await;
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let gc = ctx(&rig, clock.clone());
    // Sighted now, past its grace 16 minutes later.
    lakecdc::gc::run(&gc, &opts(false)).await.unwrap();
    clock.advance(16 * MIN);
    let state_key = rig.ctx.lake.layout.gc_state_key(100);
    let state_before = rig.store.get_bytes(&state_key).await.unwrap().bytes;

    let paused = ctx(&rig, clock.clone());
    let report = harness::with_lock_session_ended(
        &rig.store,
        &rig.db.url,
        100,
        (Op::List, "data/100/"),
        async move { lakecdc::gc::run(&paused, &opts(false)).await },
    )
    .await
    .unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, Some(Outcome::Failed), "{s:?}");
    harness::assert_lock_lost(s.reason.as_deref(), 100);
    assert!(s.deleted.is_empty(), "{s:?}");
    rig.store.head(&orphan).await.unwrap();
    assert_eq!(
        rig.store.get_bytes(&state_key).await.unwrap().bytes,
        state_before
    );

    let report = lakecdc::gc::run(&gc, &opts(false)).await.unwrap();
    assert_eq!(report.schemas[0].deleted, std::slice::from_ref(&orphan));
    assert!(rig.store.head(&orphan).await.unwrap_err().is_not_found());
    let (compared, dirty) = rig.assert_oracle().await;
    assert_eq!((compared, dirty), (10, 0));
}
