//! Manifest commits against SeaweedFS: conditional creates and updates under contention, the
//! schema stamp, and typed not-found.

use std::sync::Arc;

use bytes::Bytes;
use lakecdc::Error;
use lakecdc::clock::SystemClock;
use lakecdc::lake::manifest::{self, CommitPolicy, FileEntry, Tier};
use lakecdc::store::fault::{Action, FaultStore, Op};
use lakecdc::store::{ObjectStore, PutMode};

use crate::support::harness;

fn entry(path: String) -> FileEntry {
    FileEntry {
        tier: Tier::Delta,
        path,
        row_id_min: String::new(),
        row_id_max: String::new(),
        created_min: 1,
        created_max: 1,
        size_bytes: 10,
        row_count: 1,
        checksum: Some(format!("sha256:{}", "0".repeat(64))),
        columns: None,
        extra: Default::default(),
    }
}

fn policy() -> CommitPolicy {
    CommitPolicy {
        max_attempts: 40,
        ..CommitPolicy::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_all_land_exactly_once() {
    let bucket = harness::s3_bucket().await;
    let store: Arc<dyn ObjectStore> = bucket.clone();
    let key = "manifest/100.json";
    // The manifest does not exist yet: the first saves race on If-None-Match (#203).
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                manifest::commit(store.as_ref(), key, 100, &SystemClock, policy(), |m| {
                    m.files.push(entry(format!("data/100/{i}.parquet")));
                    Ok(())
                })
                .await
            })
        })
        .collect();
    let mut attempts = 0;
    for t in tasks {
        attempts += t.await.unwrap().unwrap().attempts;
    }
    assert!(
        attempts > 8,
        "no writer ever conflicted ({attempts} attempts): the race did not happen"
    );
    let loaded = manifest::load(store.as_ref(), key, 100)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(loaded.manifest.version, 8);
    let mut paths: Vec<String> = loaded
        .manifest
        .files
        .iter()
        .map(|f| f.path.clone())
        .collect();
    paths.sort();
    let want: Vec<String> = (0..8).map(|i| format!("data/100/{i}.parquet")).collect();
    assert_eq!(paths, want);
}

#[tokio::test]
async fn a_stale_writer_rereads_and_reapplies() {
    let bucket = harness::s3_bucket().await;
    let key = "manifest/7.json";
    let store: Arc<dyn ObjectStore> = bucket.clone();
    manifest::commit(store.as_ref(), key, 7, &SystemClock, policy(), |m| {
        m.files.push(entry("a".into()));
        Ok(())
    })
    .await
    .unwrap();
    // Another writer commits between our load and our save: pause our PUT, let it in.
    let faulty = Arc::new(FaultStore::new(store.clone()));
    let gate = lakecdc::store::fault::Gate::new();
    faulty.arm(
        Op::PutBytes,
        Some("manifest"),
        1,
        Action::Pause(gate.clone()),
    );
    let ours = {
        let faulty = faulty.clone();
        tokio::spawn(async move {
            manifest::commit(faulty.as_ref(), key, 7, &SystemClock, policy(), |m| {
                m.files.push(entry("ours".into()));
                Ok(())
            })
            .await
        })
    };
    gate.wait_reached().await;
    manifest::commit(store.as_ref(), key, 7, &SystemClock, policy(), |m| {
        m.files.push(entry("theirs".into()));
        Ok(())
    })
    .await
    .unwrap();
    gate.release();
    let committed = ours.await.unwrap().unwrap();
    assert_eq!(committed.attempts, 2);
    let paths: Vec<String> = committed
        .manifest
        .files
        .iter()
        .map(|f| f.path.clone())
        .collect();
    assert_eq!(paths, ["a", "theirs", "ours"]);
    assert_eq!(committed.manifest.version, 3);
    let reread = manifest::load(store.as_ref(), key, 7)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reread.manifest, committed.manifest);
}

#[tokio::test]
async fn a_foreign_stamp_is_refused_and_nothing_is_written() {
    let bucket = harness::s3_bucket().await;
    let store: Arc<dyn ObjectStore> = bucket.clone();
    let body = br#"{"schema_id": 8, "version": 3, "updated_at_ms": 5, "files": []}"#;
    store
        .put_bytes(
            "manifest/7.json",
            Bytes::from_static(body),
            PutMode::Overwrite,
        )
        .await
        .unwrap();
    let faulty = FaultStore::new(store.clone());
    let err = manifest::commit(
        &faulty,
        "manifest/7.json",
        7,
        &SystemClock,
        policy(),
        |_| Ok(()),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Manifest { .. }), "{err}");
    assert!(err.to_string().contains("belongs to schema 8"), "{err}");
    assert!(faulty.writes().is_empty(), "{:?}", faulty.writes());
    assert_eq!(
        &store.get_bytes("manifest/7.json").await.unwrap().bytes[..],
        body
    );
}

#[tokio::test]
async fn only_typed_not_found_means_no_manifest() {
    let bucket = harness::s3_bucket().await;
    let store: Arc<dyn ObjectStore> = bucket.clone();
    assert!(
        manifest::load(store.as_ref(), "manifest/9.json", 9)
            .await
            .unwrap()
            .is_none()
    );
    // A read failure is an error, and commit writes nothing (never "create empty").
    let faulty = FaultStore::new(store.clone());
    faulty.arm(Op::GetBytes, None, 1, Action::Fail);
    let err = manifest::commit(
        &faulty,
        "manifest/9.json",
        9,
        &SystemClock,
        policy(),
        |_| Ok(()),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Storage {
                op: "load manifest",
                ..
            }
        ),
        "{err}"
    );
    assert!(faulty.writes().is_empty());
    // A missing bucket is not an absent manifest either.
    let missing =
        lakecdc::store::s3::S3Store::connect(&harness::s3_options("lakecdc-absent-bucket")).await;
    let err = manifest::load(&missing, "manifest/9.json", 9)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Storage {
                op: "load manifest",
                source: lakecdc::store::StoreError::NoSuchBucket { .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.chain().contains("does not exist"), "{}", err.chain());
}
