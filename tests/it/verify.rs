//! `lakecdc verify`: a clean lake is intact; a flipped byte and a missing object are named.

use bytes::Bytes;
use lakecdc::store::{ObjectStore, PutMode};
use lakecdc::verify::{Outcome, VerifyOptions};

use crate::support::harness;
use crate::support::rig::{LakeKind, Rig, rig};
use crate::support::writer::Rng;

fn opts(rig: &Rig) -> VerifyOptions {
    VerifyOptions {
        schemas: vec![],
        parallelism: 3,
        work_dir: rig.opts.work_dir.clone(),
        source: None,
        engine: Default::default(),
    }
}

async fn flushed_rig(kind: LakeKind) -> Rig {
    let mut rig = rig(kind).await;
    let mut r = Rng::new(99);
    rig.seed(120, &mut r).await;
    let report = rig.flush().await;
    assert!(!report.failed(), "{report:?}");
    rig
}

#[tokio::test]
async fn a_clean_lake_is_intact_and_nothing_is_written() {
    for kind in [LakeKind::S3, LakeKind::Local] {
        let rig = flushed_rig(kind).await;
        let before = rig.store.writes().len();
        let report = lakecdc::verify::run(&rig.job_context(), &opts(&rig))
            .await
            .unwrap();
        assert_eq!(report.exit_code(), 0, "{report:?}");
        let customer = &report.schemas[0];
        assert_eq!(
            (customer.schema_id, customer.outcome),
            (100, Outcome::Intact)
        );
        assert_eq!(customer.files, 3);
        assert!(customer.problems.is_empty());
        assert_eq!(report.schemas[1].outcome, Outcome::NoManifest);
        assert_eq!(rig.store.writes().len(), before, "verify wrote to the lake");
    }
}

#[tokio::test]
async fn a_flipped_byte_and_a_missing_object_are_named() {
    let rig = flushed_rig(LakeKind::S3).await;
    let listed = rig.listed().await;
    // Flip one byte in the middle of the first object (same size).
    let victim = &listed[0];
    let mut bytes = rig.store.get_bytes(victim).await.unwrap().bytes.to_vec();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    rig.store
        .put_bytes(victim, Bytes::from(bytes), PutMode::Overwrite)
        .await
        .unwrap();
    // Delete the second.
    rig.store.delete(&listed[1]).await.unwrap();
    let report = lakecdc::verify::run(&rig.job_context(), &opts(&rig))
        .await
        .unwrap();
    assert_eq!(report.exit_code(), 3);
    let s = &report.schemas[0];
    assert_eq!(s.outcome, Outcome::Diverged);
    let kinds: Vec<(&str, &str)> = s
        .problems
        .iter()
        .map(|p| (p.kind, p.path.as_str()))
        .collect();
    assert!(kinds.contains(&("checksum", victim.as_str())), "{kinds:?}");
    assert!(
        kinds.contains(&("dangling", listed[1].as_str())),
        "{kinds:?}"
    );
    assert!(!kinds.iter().any(|(_, p)| *p == listed[2]), "{kinds:?}");
    // The binary says the same, with exit 3.
    let out = harness::bin()
        .args(["verify", "--pg-url", &rig.db.url, "--lake"])
        .arg(format!("s3://{}", bucket_of(&rig)))
        .args(["--s3-path-style", "--s3-endpoint", &harness::s3_endpoint()])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(&format!("checksum {victim}")), "{stdout}");
    assert!(
        stdout.contains(&format!("dangling {}", listed[1])),
        "{stdout}"
    );
}

fn bucket_of(rig: &Rig) -> String {
    rig.store.describe().trim_start_matches("s3://").to_string()
}

#[tokio::test]
async fn a_stop_request_reports_every_schema_skipped_and_writes_nothing() {
    // A SIGTERM before (or between) schemas: verify, gc and compact each report the schemas
    // they skipped as `stopped`, with a non-zero exit code, so a stopped run never passes for
    // a complete one.
    let rig = flushed_rig(LakeKind::S3).await;
    let stopped = rig.job_context();
    stopped.shutdown.request();
    let before = rig.store.writes().len();
    let verify = lakecdc::verify::run(&stopped, &opts(&rig)).await.unwrap();
    assert_eq!(
        verify
            .schemas
            .iter()
            .map(|s| (s.schema_id, s.outcome))
            .collect::<Vec<_>>(),
        [(100, Outcome::Stopped), (101, Outcome::Stopped)]
    );
    assert_eq!(verify.exit_code(), 3);
    let gc = lakecdc::gc::run(
        &stopped,
        &lakecdc::gc::GcOptions {
            schemas: vec![],
            grace: std::time::Duration::from_secs(15 * 60),
            dry_run: false,
            repair: false,
            settle_rows: lakecdc::gc::SETTLE_ROWS,
        },
    )
    .await
    .unwrap();
    assert!(
        gc.schemas
            .iter()
            .all(|s| s.outcome == Some(lakecdc::gc::Outcome::Stopped)),
        "{gc:?}"
    );
    assert_eq!((gc.schemas.len(), gc.exit_code()), (2, 3));
    let compact_opts = lakecdc::compact::CompactOptions {
        max_deltas: 0,
        work_dir: rig.opts.work_dir.clone(),
        ..Default::default()
    };
    let outcomes = |r: &lakecdc::compact::CompactReport| -> Vec<_> {
        r.schemas.iter().map(|s| (s.schema_id, s.outcome)).collect()
    };
    use lakecdc::compact::Outcome::{Done, NoManifest, Stopped};
    let compact = lakecdc::compact::run(&stopped, &compact_opts)
        .await
        .unwrap();
    assert_eq!(outcomes(&compact), [(100, Stopped), (101, Stopped)]);
    assert_eq!(compact.exit_code(), 3);
    assert!(compact.to_text().contains("stopped"));
    assert_eq!(rig.store.writes().len(), before, "a stopped run wrote");
    // Without the stop, the same runs work on every schema (and compact writes: the stopped
    // run had something to do).
    let verify = lakecdc::verify::run(&rig.job_context(), &opts(&rig))
        .await
        .unwrap();
    assert_eq!(verify.exit_code(), 0, "{verify:?}");
    let compact = lakecdc::compact::run(&rig.job_context(), &compact_opts)
        .await
        .unwrap();
    assert_eq!(
        outcomes(&compact),
        [(100, Done), (101, NoManifest)],
        "{compact:?}"
    );
    assert!(rig.store.writes().len() > before, "{compact:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_writer_stamps_the_columns_its_files_hold() {
    // docs/hazards.md #256: each entry's column stamp is the file's own (names and types), whoever
    // wrote it; verify compares them.
    use lakecdc::compact::{CompactOptions, Decision};
    use lakecdc::init::InitOptions;
    use lakecdc::lake::manifest;
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(256);
    rig.seed(60, &mut r).await;
    let init = InitOptions {
        schemas: vec!["customer".into()],
        work_dir: rig.opts.work_dir.clone(),
        ..InitOptions::default()
    };
    lakecdc::init::run(&rig.ctx, &init).await.unwrap();
    let load = || async {
        manifest::load(rig.store.as_ref(), "manifest/100.json", 100)
            .await
            .unwrap()
            .unwrap()
            .manifest
    };
    let mut stamps: Vec<_> = load()
        .await
        .files
        .iter()
        .map(|f| f.columns.clone())
        .collect();
    let compact = |(dirty_ratio, max_deltas)| CompactOptions {
        schemas: vec!["customer".into()],
        work_dir: rig.opts.work_dir.clone(),
        dirty_ratio,
        max_deltas,
        ..CompactOptions::default()
    };
    // Deltas, merged into a new base (rewrite); more deltas, folded into a consolidated one.
    for (ops, target, decision) in [
        (30, (0.05, 32), Decision::Rewrite),
        (10, (1.0, 0), Decision::Consolidate),
    ] {
        for half in 0..2 {
            for _ in 0..ops / 2 {
                rig.writer.random_op(&mut r).await;
            }
            if half == 0 {
                rig.flush().await;
            }
        }
        rig.flush().await;
        let report = lakecdc::compact::run(&rig.job_context(), &compact(target))
            .await
            .unwrap();
        assert_eq!(report.schemas[0].plan.as_ref().unwrap().decision, decision);
    }
    for _ in 0..5 {
        rig.writer.random_op(&mut r).await;
    }
    rig.flush().await;
    let loaded = load().await;
    let kinds: std::collections::BTreeSet<(String, String)> = loaded
        .files
        .iter()
        .map(|f| {
            let kind = format!("{:?}", rig.ctx.lake.layout.classify(&f.path));
            (
                format!("{:?}", f.tier),
                kind.split(' ').next().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        kinds.len(),
        2,
        "a merged base, a consolidated delta and a fresh delta: {kinds:?}"
    );
    assert_eq!(
        loaded.files.len(),
        3,
        "a merged base, a consolidated delta and a fresh delta"
    );
    stamps.extend(loaded.files.iter().map(|f| f.columns.clone()));
    assert!(
        stamps.iter().all(Option::is_some),
        "an entry without a column stamp"
    );
    assert!(
        stamps.windows(2).all(|w| w[0] == w[1]),
        "writers stamp different columns"
    );
    // Verify checks every stamp against its file's footer: all agree, and a wrong one is named.
    let report = lakecdc::verify::run(&rig.job_context(), &opts(&rig))
        .await
        .unwrap();
    assert_eq!(report.schemas[0].outcome, Outcome::Intact, "{report:?}");
    assert_eq!(report.schemas[0].files, loaded.files.len());
    // A wrong column stamp is named, and so is a listed row-id range that is not the file's
    // (point lookups prune by it: docs/hazards.md R14).
    let victim = loaded.files[0].path.clone();
    let other = loaded.files[1].path.clone();
    let tamper = |path: String, change: fn(&mut manifest::FileEntry)| {
        let store = rig.store.clone();
        async move {
            manifest::commit(
                store.as_ref(),
                "manifest/100.json",
                100,
                &lakecdc::clock::SystemClock,
                Default::default(),
                |m| {
                    change(m.files.iter_mut().find(|f| f.path == path).unwrap());
                    Ok(())
                },
            )
            .await
            .unwrap();
        }
    };
    let named = || async {
        let report = lakecdc::verify::run(&rig.job_context(), &opts(&rig))
            .await
            .unwrap();
        let mut named: Vec<(&'static str, String)> = report.schemas[0]
            .problems
            .iter()
            .map(|p| (p.kind, p.path.clone()))
            .collect();
        named.sort();
        named
    };
    tamper(victim.clone(), |f| {
        f.columns
            .as_mut()
            .unwrap()
            .insert("changed_at".into(), "VARCHAR".into());
    })
    .await;
    assert_eq!(named().await, [("columns", victim.clone())]);
    tamper(other.clone(), |f| {
        f.row_id_min = "00000000-0000-0000-0000-000000000000".into();
    })
    .await;
    assert_eq!(
        named().await,
        [("columns", victim), ("row_id_range", other)]
    );
}

#[tokio::test]
async fn verify_waits_its_turn_behind_a_held_schema_lock() {
    // A flush holds a schema for seconds each minute: verify (and gc, init) started beside it
    // wait up to --lock-wait for the lock instead of reporting the schema `locked` (exit 3).
    let rig = flushed_rig(LakeKind::S3).await;
    let held = lakecdc::source::SchemaLock::try_acquire(&rig.ctx.connector, 100)
        .await
        .unwrap()
        .unwrap();
    let outcome = |r: &lakecdc::verify::VerifyReport| r.schemas[0].outcome;
    // Not waiting: locked at once.
    let report = lakecdc::verify::run(&rig.job_context(), &opts(&rig))
        .await
        .unwrap();
    assert_eq!((outcome(&report), report.exit_code()), (Outcome::Locked, 3));
    // Waiting longer than the holder keeps it: verified once it is released.
    let waiting = lakecdc::job::Context {
        lock_wait: std::time::Duration::from_secs(30),
        ..rig.job_context()
    };
    let release = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(800)).await;
        held.release().await.unwrap();
    });
    let started = std::time::Instant::now();
    let report = lakecdc::verify::run(&waiting, &opts(&rig)).await.unwrap();
    release.await.unwrap();
    assert_eq!((outcome(&report), report.exit_code()), (Outcome::Intact, 0));
    assert!(started.elapsed() >= std::time::Duration::from_millis(700));
    assert_eq!(report.schemas[0].files, 3);
    // Held past the wait: locked after it, not before.
    let _held = lakecdc::source::SchemaLock::try_acquire(&rig.ctx.connector, 100)
        .await
        .unwrap()
        .unwrap();
    let short = lakecdc::job::Context {
        lock_wait: std::time::Duration::from_millis(600),
        ..rig.job_context()
    };
    let started = std::time::Instant::now();
    let report = lakecdc::verify::run(&short, &opts(&rig)).await.unwrap();
    assert_eq!(outcome(&report), Outcome::Locked);
    assert!(started.elapsed() >= std::time::Duration::from_millis(500));
    // A stop request ends the wait at once.
    let stopping = lakecdc::job::Context {
        lock_wait: std::time::Duration::from_secs(600),
        ..rig.job_context()
    };
    let stop = stopping.shutdown.clone();
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        stop.request();
    });
    let started = std::time::Instant::now();
    let report = lakecdc::verify::run(&stopping, &opts(&rig)).await.unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    assert_ne!(outcome(&report), Outcome::Intact);
    assert_ne!(report.exit_code(), 0);
}
