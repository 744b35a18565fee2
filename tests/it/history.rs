//! Manifest history (time travel, docs/design.md §3.4): every save is copied to
//! `<manifest key>.history/<version:020>.json`; an earlier version stays readable through
//! `load_as_of`, with every file it lists, across later flushes, a compaction and gc within the
//! retention; past the retention gc deletes the files only old versions listed and the old
//! copies (never the newest) and `load_as_of` says so. A failed copy never fails the job;
//! a retention of 0 writes none; inspect shows the range.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use lakecdc::compact::{Decision, Outcome as CompactOutcome};
use lakecdc::lake::history::{self, AsOf};
use lakecdc::lake::manifest::{self, Manifest};
use lakecdc::store::fault::{Action, Op};
use lakecdc::store::memory::MemoryStore;
use lakecdc::store::{ObjectStore, PutMode};

use crate::support::rig::{LakeKind, Rig, rig};
use crate::support::writer::Rng;

const SCHEMA: i16 = 100;
const MIN: i64 = 60_000;
const HOUR: i64 = 60 * MIN;

/// The live manifest of the customer schema.
async fn live(rig: &Rig) -> Manifest {
    let layout = &rig.ctx.lake.layout;
    manifest::load_within(
        rig.store.as_ref(),
        &layout.manifest_key(SCHEMA),
        SCHEMA,
        layout.limits(),
    )
    .await
    .unwrap()
    .unwrap()
    .manifest
}

fn paths(m: &Manifest) -> BTreeSet<String> {
    m.files.iter().map(|f| f.path.clone()).collect()
}

/// The versions of the history copies in the store, by listing their keys.
async fn copies(rig: &Rig) -> Vec<i64> {
    let layout = &rig.ctx.lake.layout;
    let prefix = history::prefix(layout, SCHEMA);
    let mut versions: Vec<i64> = rig
        .keys(&prefix)
        .await
        .iter()
        .map(|k| {
            let digits = k
                .strip_prefix(&prefix)
                .unwrap()
                .strip_suffix(".json")
                .unwrap();
            assert_eq!(digits.len(), 20, "{k}");
            digits.parse().unwrap()
        })
        .collect();
    versions.sort();
    versions
}

async fn as_of(rig: &Rig, at: AsOf) -> lakecdc::Result<Manifest> {
    history::load_as_of(rig.store.as_ref(), &rig.ctx.lake.layout, SCHEMA, &at).await
}

async fn exists(rig: &Rig, key: &str) -> bool {
    match rig.store.head(key).await {
        Ok(_) => true,
        Err(e) if e.is_not_found() => false,
        Err(e) => panic!("head {key}: {e}"),
    }
}

async fn ops(rig: &mut Rig, r: &mut Rng, n: usize) {
    for _ in 0..n {
        rig.writer.random_op(r).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_earlier_version_stays_readable_within_the_retention_and_is_collected_past_it() {
    let (mut rig, mut r) = crate::compact::lake_with_base_and_deltas(41).await;
    let layout = rig.ctx.lake.layout.clone();

    // Every save so far has its copy, byte for byte the manifest as saved.
    let old = live(&rig).await;
    let saved = copies(&rig).await;
    assert_eq!(saved, (1..=old.version).collect::<Vec<_>>());
    let live_bytes = rig
        .store
        .get_bytes(&layout.manifest_key(SCHEMA))
        .await
        .unwrap()
        .bytes;
    let copy_bytes = rig
        .store
        .get_bytes(&history::key(&layout, SCHEMA, old.version))
        .await
        .unwrap()
        .bytes;
    assert_eq!(copy_bytes, live_bytes);
    let old_files = paths(&old);
    assert!(old_files.len() >= 2, "{old_files:?}");

    // Later flushes and a compaction that retires every file of the old version.
    ops(&mut rig, &mut r, 40).await;
    rig.flush().await;
    let between = live(&rig).await;
    ops(&mut rig, &mut r, 40).await;
    rig.flush().await;
    let report = lakecdc::compact::run(&rig.job_context(), &crate::compact::opts(&rig))
        .await
        .unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, CompactOutcome::Done, "{s:?}");
    assert_eq!(s.plan.as_ref().unwrap().decision, Decision::Rewrite);
    let compacted = live(&rig).await;
    assert!(paths(&compacted).is_disjoint(&old_files));
    let retired = compacted.retired_paths();
    assert!(old_files.is_subset(&retired), "{retired:?}");

    // gc past its grace but within the retention: the retired files are all kept.
    let (clock, gc_ctx, gc_opts) =
        rig.gc_on_a_manual_clock_keeping_history(history::DEFAULT_RETENTION);
    let first = lakecdc::gc::run(&gc_ctx, &gc_opts).await.unwrap();
    assert!(first.schemas[0].deleted.is_empty(), "{first:?}");
    clock.advance(16 * MIN);
    let within = lakecdc::gc::run(&gc_ctx, &gc_opts).await.unwrap();
    let s = &within.schemas[0];
    assert!(s.deleted.is_empty(), "deleted within the retention: {s:?}");
    assert!(s.history_deleted.is_empty(), "{s:?}");
    assert_eq!(s.history_kept, copies(&rig).await.len());
    let mut kept = s.within_grace.iter().cloned().collect::<BTreeSet<_>>();
    kept.retain(|k| old_files.contains(k));
    assert_eq!(kept, old_files, "the retired files are reported as kept");

    // The old version loads, by version and by time, and every file it lists exists.
    let back = as_of(&rig, AsOf::Version(old.version)).await.unwrap();
    assert_eq!(back, old);
    for f in &back.files {
        assert!(exists(&rig, &f.path).await, "{} is gone", f.path);
    }
    let at_time = as_of(
        &rig,
        AsOf::Time {
            epoch_ms: old.updated_at_ms,
        },
    )
    .await
    .unwrap();
    assert_eq!(at_time, old);
    // Between two saves, the older one is in force.
    let just_before = as_of(
        &rig,
        AsOf::Time {
            epoch_ms: between.updated_at_ms - 1,
        },
    )
    .await
    .unwrap();
    assert_eq!(just_before.version, between.version - 1);
    assert_eq!(
        as_of(&rig, AsOf::Version(between.version)).await.unwrap(),
        between
    );
    // The live manifest is the newest version.
    let now = live(&rig).await;
    assert_eq!(as_of(&rig, AsOf::Version(now.version)).await.unwrap(), now);
    let ahead = as_of(&rig, AsOf::Version(now.version + 1))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        ahead.contains(&format!("at version {}", now.version)),
        "{ahead}"
    );

    // Past the retention: the files only old versions listed and the old copies go.
    clock.advance(25 * HOUR);
    let before_gc = copies(&rig).await;
    let newest_before = *before_gc.last().unwrap();
    let listed_before = paths(&live(&rig).await);
    let past = lakecdc::gc::run(&gc_ctx, &gc_opts).await.unwrap();
    let s = &past.schemas[0];
    let deleted: BTreeSet<String> = s.deleted.iter().cloned().collect();
    assert!(old_files.is_subset(&deleted), "{s:?}");
    assert!(deleted.is_disjoint(&listed_before), "{s:?}");
    for k in &old_files {
        assert!(!exists(&rig, k).await, "{k} survived the retention");
    }
    for k in &listed_before {
        assert!(exists(&rig, k).await, "listed {k} was deleted");
    }
    // Every copy but the newest was superseded before the window: deleted.
    let want: Vec<String> = before_gc[..before_gc.len() - 1]
        .iter()
        .map(|v| history::key(&layout, SCHEMA, *v))
        .collect();
    assert_eq!(s.history_deleted, want);
    assert_eq!(s.history_kept, 1);
    // The newest copy stays; gc's own save (dropping the deleted retirements) added one.
    let after = live(&rig).await;
    assert_eq!(after.version, newest_before + 1);
    assert!(after.retired_paths().is_disjoint(&old_files));
    assert_eq!(copies(&rig).await, vec![newest_before, after.version]);

    // The old version is past the retention, by version and by time.
    for at in [
        AsOf::Version(old.version),
        AsOf::Time {
            epoch_ms: old.updated_at_ms,
        },
    ] {
        let err = as_of(&rig, at).await.unwrap_err().to_string();
        assert!(err.contains("past the history retention"), "{err}");
        assert!(
            err.contains(&format!("oldest version kept is {newest_before}")),
            "{err}"
        );
        assert!(err.contains("schema 100"), "{err}");
    }
    // The kept versions still load with all their files.
    for v in [newest_before, after.version] {
        let m = as_of(&rig, AsOf::Version(v)).await.unwrap();
        assert_eq!(m.version, v);
        for f in &m.files {
            assert!(exists(&rig, &f.path).await, "{} is gone", f.path);
        }
    }
    let (_, dirty) = rig.assert_oracle().await;
    assert_eq!(dirty, 0);

    // inspect shows the range kept.
    let range = history::range(rig.store.as_ref(), &layout, SCHEMA)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (range.oldest.version, range.newest.version, range.count),
        (newest_before, after.version, 2)
    );
    assert_eq!(range.newest.updated_at_ms, after.updated_at_ms);
    let report = rig.inspect().await;
    let customer = report
        .schemas
        .iter()
        .find(|s| s.schema_id == SCHEMA)
        .unwrap();
    assert_eq!(customer.history, Some(range));
    let json = serde_json::to_value(customer).unwrap();
    assert_eq!(json["history"]["oldest"]["version"], newest_before);
    assert_eq!(json["history"]["newest"]["version"], after.version);
    assert_eq!(json["history"]["count"], 2);
    let text = report.to_text();
    assert!(
        text.contains(&format!(
            "history           versions {newest_before} ({}) to {} ({}), 2 copies",
            history::format_ms(range.oldest.updated_at_ms),
            after.version,
            history::format_ms(after.updated_at_ms)
        )),
        "{text}"
    );
}

#[tokio::test]
async fn a_failed_history_copy_leaves_the_job_successful_and_is_counted() {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(43);
    rig.seed(20, &mut r).await;
    rig.flush().await;
    let first = live(&rig).await;
    assert_eq!(copies(&rig).await, (1..=first.version).collect::<Vec<_>>());

    let failures = history::copy_failures();
    rig.store
        .arm(Op::PutBytes, Some(".history/"), 1, Action::Fail);
    ops(&mut rig, &mut r, 10).await;
    let report = rig.flush().await;
    assert!(!report.failed(), "{report:?}");
    let s = report
        .schemas
        .iter()
        .find(|s| s.schema_id == SCHEMA)
        .unwrap();
    assert_eq!(s.outcome, lakecdc::flush::Outcome::Flushed, "{s:?}");
    let missed = live(&rig).await;
    assert_eq!(missed.version, first.version + 1, "one save");
    assert!(history::copy_failures() > failures, "not counted");
    assert_eq!(copies(&rig).await, (1..=first.version).collect::<Vec<_>>());
    // The save itself stood and the rows were exported.
    let (_, dirty) = rig.assert_oracle().await;
    assert_eq!(dirty, 0);

    // A later save is copied again; the missed version is reported as missing, by version
    // and by time (it may have been in force then).
    ops(&mut rig, &mut r, 10).await;
    rig.flush().await;
    let next = live(&rig).await;
    assert_eq!(next.version, missed.version + 1);
    let mut want: Vec<i64> = (1..=first.version).collect();
    want.push(next.version);
    assert_eq!(copies(&rig).await, want);
    let err = as_of(&rig, AsOf::Version(missed.version))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("has no history copy"), "{err}");
    assert!(
        err.contains(&history::key(&rig.ctx.lake.layout, SCHEMA, missed.version)),
        "{err}"
    );
    let err = as_of(
        &rig,
        AsOf::Time {
            epoch_ms: missed.updated_at_ms,
        },
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains(&format!(
            "between versions {} and {}",
            first.version, next.version
        )),
        "{err}"
    );
    // The versions around it still load.
    assert_eq!(
        as_of(&rig, AsOf::Version(first.version)).await.unwrap(),
        first
    );
}

#[tokio::test]
async fn a_retention_of_zero_writes_no_copies_and_gc_keeps_none() {
    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(44);
    rig.seed(20, &mut r).await;
    // History on: the first save is copied.
    rig.flush().await;
    let on = live(&rig).await;
    assert_eq!(copies(&rig).await, (1..=on.version).collect::<Vec<_>>());
    // History off: no copy, and gc deletes the ones left.
    rig.ctx.lake.layout = rig
        .ctx
        .lake
        .layout
        .clone()
        .with_history_retention(Duration::ZERO);
    ops(&mut rig, &mut r, 10).await;
    rig.flush().await;
    let off = live(&rig).await;
    assert!(off.version > on.version);
    assert_eq!(copies(&rig).await, (1..=on.version).collect::<Vec<_>>());
    let (_, gc_ctx, gc_opts) = rig.gc_on_a_manual_clock();
    let dry = lakecdc::gc::run(
        &gc_ctx,
        &lakecdc::gc::GcOptions {
            dry_run: true,
            repair: false,
            ..gc_opts.clone()
        },
    )
    .await
    .unwrap();
    let want: Vec<String> = (1..=on.version)
        .map(|v| history::key(&rig.ctx.lake.layout, SCHEMA, v))
        .collect();
    assert_eq!(dry.schemas[0].history_deleted, want);
    assert!(
        dry.to_text().contains("would delete history copy"),
        "{}",
        dry.to_text()
    );
    assert_eq!(copies(&rig).await.len(), want.len(), "a dry run deleted");
    let report = lakecdc::gc::run(&gc_ctx, &gc_opts).await.unwrap();
    assert_eq!(report.schemas[0].history_deleted, want);
    assert_eq!(report.schemas[0].history_kept, 0);
    assert!(copies(&rig).await.is_empty());
    // With no copy kept only the live version can be read.
    assert_eq!(as_of(&rig, AsOf::Version(off.version)).await.unwrap(), off);
    let err = as_of(&rig, AsOf::Version(on.version))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("oldest version kept is {}", off.version)),
        "{err}"
    );
    assert_eq!(
        history::range(rig.store.as_ref(), &rig.ctx.lake.layout, SCHEMA)
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn history_keys_of_other_shapes_are_never_read_nor_deleted_and_copies_are_checked() {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(45);
    rig.seed(10, &mut r).await;
    rig.flush().await;
    ops(&mut rig, &mut r, 5).await;
    rig.flush().await;
    let layout = rig.ctx.lake.layout.clone();
    let prefix = history::prefix(&layout, SCHEMA);
    let strangers = [
        format!("{prefix}notes.txt"),
        format!("{prefix}1.json"),
        format!("{prefix}00000000000000000001.json.bak"),
        format!("{prefix}x/00000000000000000001.json"),
    ];
    for k in &strangers {
        rig.store
            .put_bytes(k, Bytes::from_static(b"{}"), PutMode::Overwrite)
            .await
            .unwrap();
    }
    let (clock, gc_ctx, gc_opts) =
        rig.gc_on_a_manual_clock_keeping_history(history::DEFAULT_RETENTION);
    clock.advance(48 * HOUR);
    let report = lakecdc::gc::run(&gc_ctx, &gc_opts).await.unwrap();
    let s = &report.schemas[0];
    assert!(!s.history_deleted.is_empty(), "{s:?}");
    assert!(s.history_deleted.iter().all(|k| !strangers.contains(k)));
    for k in &strangers {
        assert!(exists(&rig, k).await, "{k} was deleted");
    }
    let range = history::range(rig.store.as_ref(), &layout, SCHEMA)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(range.count, 1, "{range:?}");

    // A copy whose content is not the version its key names, or of another schema, is refused.
    let current = live(&rig).await;
    assert_eq!(
        range.oldest.version, current.version,
        "the newest copy is kept"
    );
    let mut forged = current.clone();
    forged.version = current.version + 5;
    let key = history::key(&layout, SCHEMA, current.version - 1);
    rig.store
        .put_bytes(
            &key,
            Bytes::from(forged.to_json().unwrap()),
            PutMode::Overwrite,
        )
        .await
        .unwrap();
    let err = as_of(&rig, AsOf::Version(current.version - 1))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(&key) && err.contains("not the"), "{err}");
    let mut foreign = current.clone();
    foreign.schema_id = 101;
    foreign.version = current.version - 1;
    rig.store
        .put_bytes(
            &key,
            Bytes::from(foreign.to_json().unwrap()),
            PutMode::Overwrite,
        )
        .await
        .unwrap();
    let err = as_of(&rig, AsOf::Version(current.version - 1))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(&key) && err.contains("schema 101"), "{err}");
}

#[tokio::test]
async fn a_schema_without_a_manifest_names_itself() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let layout = lakecdc::lake::Layout::new("", "data", "manifest/{schema_id}.json").unwrap();
    let err = history::load_as_of(store.as_ref(), &layout, 7, &AsOf::Version(1))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("schema 7: --as-of version 1"), "{err}");
    assert!(err.contains("manifest/7.json"), "{err}");
    assert_eq!(
        history::range(store.as_ref(), &layout, 7).await.unwrap(),
        None
    );
    // Saves through the key-based commit are copied too; the first version predates any time
    // before it.
    let clock = lakecdc::clock::ManualClock::new(10 * HOUR);
    for _ in 0..3 {
        manifest::commit(
            store.as_ref(),
            &layout.manifest_key(7),
            7,
            &clock,
            Default::default(),
            |_| Ok(()),
        )
        .await
        .unwrap();
        clock.advance(MIN);
    }
    let at = |epoch_ms| AsOf::Time { epoch_ms };
    let load = |a: AsOf| {
        let (store, layout) = (store.clone(), layout.clone());
        async move { history::load_as_of(store.as_ref(), &layout, 7, &a).await }
    };
    assert_eq!(load(at(10 * HOUR)).await.unwrap().version, 1);
    assert_eq!(load(at(10 * HOUR + MIN - 1)).await.unwrap().version, 1);
    assert_eq!(load(at(10 * HOUR + MIN)).await.unwrap().version, 2);
    assert_eq!(load(at(20 * HOUR)).await.unwrap().version, 3);
    let err = load(at(10 * HOUR - 1)).await.unwrap_err().to_string();
    assert!(err.contains("before the schema's first version"), "{err}");
    assert!(err.contains(&history::format_ms(10 * HOUR)), "{err}");
}
