//! `lakecdc inspect`: read-only, shows the lock holder of a paused flush, and its JSON carries
//! every field.

use std::sync::Arc;

use futures::FutureExt;
use lakecdc::flush::FlushHooks;
use lakecdc::store::ObjectStore;
use tokio::sync::Notify;

use crate::support::harness;
use crate::support::rig::{LakeKind, rig};
use crate::support::writer::Rng;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inspect_shows_the_holder_of_a_paused_flush_and_writes_nothing() {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(11);
    rig.seed(50, &mut r).await;
    rig.flush().await;
    rig.seed(30, &mut r).await;
    let (reached, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (re, rel) = (reached.clone(), release.clone());
    let hooks = FlushHooks {
        before_mark: Some(Arc::new(move |_, _| {
            let (re, rel) = (re.clone(), rel.clone());
            async move {
                re.notify_one();
                rel.notified().await;
            }
            .boxed()
        })),
        ..Default::default()
    };
    let (ctx, opts) = (rig.ctx.clone(), rig.opts.clone());
    let flush =
        tokio::spawn(async move { lakecdc::flush::run_with_hooks(&ctx, &opts, &hooks).await });
    // Bounded: a flush that fails before its mark fails the test instead of hanging it.
    tokio::time::timeout(std::time::Duration::from_secs(60), reached.notified())
        .await
        .expect("the flush reaches its mark");
    let manifest_before = rig.store.get_bytes("manifest/100.json").await.unwrap();
    let bucket = rig.store.describe().trim_start_matches("s3://").to_string();
    let out = tokio::task::spawn_blocking({
        let url = rig.db.url.clone();
        move || {
            harness::bin()
                .args([
                    "inspect",
                    "--json",
                    "--pg-url",
                    &url,
                    "--lake",
                    &format!("s3://{bucket}"),
                ])
                .args(["--s3-path-style", "--s3-endpoint", &harness::s3_endpoint()])
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &report["schemas"][0];
    assert_eq!(s["schema"], "customer");
    let holder = &s["lock_holder"];
    assert!(holder["pid"].as_i64().unwrap() > 0, "{s}");
    assert_eq!(holder["application_name"], "lakecdc-test");
    assert!(holder["since_ms"].as_i64().unwrap() > 1_600_000_000_000);
    assert_eq!(s["dirty_rows"], 30, "the paused batch is not marked yet");
    assert_eq!(s["flush_would_run"], false);
    assert!(
        s["flush_reason"]
            .as_str()
            .unwrap()
            .contains("--min-records")
    );
    assert!(s["oldest_dirty_age_s"].is_i64());
    assert_eq!(s["manifest"], true);
    assert_eq!(
        s["delta"]["files"], 3,
        "two from the first flush, one committed by the paused one"
    );
    assert_eq!(s["base"]["files"], 0);
    assert_eq!(s["compaction"]["decision"], "noop");
    assert_eq!(s["unlisted"]["tmp"], 0);
    assert_eq!(report["schemas"][1]["lock_holder"], serde_json::Value::Null);
    assert_eq!(report["schemas"][1]["manifest"], false);
    // Read-only: the manifest is untouched.
    let manifest_after = rig.store.get_bytes("manifest/100.json").await.unwrap();
    assert_eq!(manifest_after.etag, manifest_before.etag);
    release.notify_one();
    let report = flush.await.unwrap().unwrap();
    assert_eq!(report.schemas[0].rows_marked, 30);
    let _ = &mut rig;
}

#[test]
fn a_missing_change_log_index_is_reported() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let rig = rt.block_on(rig(LakeKind::Local));
    rt.block_on(async {
        rig.writer
            .client
            .batch_execute("DROP INDEX change_log_dirty_idx")
            .await
            .unwrap();
    });
    let lake = rig.opts.work_dir.join("lake");
    let out = harness::bin()
        .args(["inspect", "--pg-url", &rig.db.url, "--lake"])
        .arg(&lake)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("WARNING") && text.contains("index"), "{text}");
    assert!(text.contains("manifest          none"), "{text}");
}

#[tokio::test]
async fn a_schema_that_cannot_be_inspected_is_reported_and_the_others_still_are() {
    use lakecdc::store::PutMode;
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(12);
    rig.seed(20, &mut r).await;
    rig.flush().await;
    // Another schema's manifest is unreadable.
    rig.store
        .put_bytes(
            "manifest/101.json",
            bytes::Bytes::from_static(b"{not json"),
            PutMode::Overwrite,
        )
        .await
        .unwrap();
    let report = rig.inspect().await;
    let by_id: Vec<(i16, bool, Option<&str>)> = report
        .schemas
        .iter()
        .map(|s| (s.schema_id, s.manifest, s.error.as_deref()))
        .collect();
    assert_eq!(by_id.len(), 2, "{by_id:?}");
    assert_eq!((by_id[0].0, by_id[0].1, by_id[0].2), (100, true, None));
    assert_eq!(report.schemas[0].delta.rows, 20);
    assert_eq!(by_id[1].0, 101);
    assert!(
        by_id[1].2.is_some_and(|e| e.contains("manifest/101.json")),
        "{by_id:?}"
    );
    assert_eq!(report.exit_code(), 1);
    let text = report.to_text();
    assert!(text.contains("  error             "), "{text}");
}

#[test]
fn a_missing_local_lake_is_an_error_not_a_new_lake() {
    // A mistyped or relative --lake (a cron job's working directory) must not quietly become
    // a new lake that flush writes to and marks rows flushed for.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut rig = rt.block_on(rig(LakeKind::Local));
    let mut r = Rng::new(13);
    rt.block_on(rig.seed(5, &mut r));
    let missing = rig.opts.work_dir.join("no-such-lake");
    let file = rig.opts.work_dir.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    for (lake, says) in [
        (
            &missing,
            "does not exist: create it (mkdir -p) or fix --lake",
        ),
        (&file, "is not a directory: fix --lake"),
    ] {
        for command in [
            &["flush", "--force"][..],
            &["inspect"],
            &["verify"],
            &["gc"],
        ] {
            let out = harness::bin()
                .args(command)
                .args(["--pg-url", &rig.db.url, "--lake"])
                .arg(lake)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{command:?}: {stderr}");
            assert!(stderr.contains(says), "{command:?}: {stderr}");
        }
    }
    assert!(!missing.exists(), "a command created the lake");
    let dirty = rt.block_on(crate::support::oracle::dirty(&rig.writer));
    assert_eq!(dirty.len(), 5, "nothing was flushed");
}
