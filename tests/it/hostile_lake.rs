//! A lake written by someone who can write its objects but not run anything on the host: they
//! may make a job fail with a clear error, never make it touch an object outside the schema's
//! own prefix, nor read more than its limits (docs/hazards.md S1–S4).

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use lakecdc::clock::{Clock, ManualClock, SystemClock};
use lakecdc::lake::ReadLimits;
use lakecdc::lake::manifest::{self, Manifest, Tier};
use lakecdc::store::fault::{Call, Op};
use lakecdc::store::{ObjectStore, PutMode};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::compact::lake_with_base_and_deltas;
use crate::support::rig::{LakeKind, Rig, rig};
use crate::support::writer::Rng;

const MANIFEST: &str = "manifest/100.json";
const MIN: i64 = 60_000;

async fn flushed_rig(kind: LakeKind, rows: usize) -> Rig {
    let mut rig = rig(kind).await;
    let mut r = Rng::new(18);
    rig.seed(rows, &mut r).await;
    let report = rig.flush().await;
    assert!(!report.failed(), "{report:?}");
    rig
}

/// Commits `modify` to the customer schema's manifest.
async fn edit(rig: &Rig, clock: &dyn Clock, modify: impl Fn(&mut Manifest)) {
    manifest::commit(
        rig.store.as_ref(),
        MANIFEST,
        100,
        clock,
        Default::default(),
        |m| {
            modify(m);
            Ok(())
        },
    )
    .await
    .unwrap();
}

/// Lists `paths` next to the manifest's entries, each a copy of its first entry.
async fn list_also(rig: &Rig, paths: &[String], tier: Tier) {
    edit(rig, &SystemClock, |m| {
        for p in paths {
            let mut e = m.files[0].clone();
            e.path = p.clone();
            e.tier = tier;
            m.files.push(e);
        }
    })
    .await;
}

/// Replaces the manifest with `json`, as a writer of the bucket can.
async fn put_manifest(rig: &Rig, json: &Value) {
    let body = serde_json::to_vec_pretty(json).unwrap();
    rig.store
        .put_bytes(MANIFEST, Bytes::from(body), PutMode::Overwrite)
        .await
        .unwrap();
}

async fn manifest_json(rig: &Rig) -> Value {
    let got = rig.store.get_bytes(MANIFEST).await.unwrap();
    serde_json::from_slice(&got.bytes).unwrap()
}

/// The manifest, read past the padding a test added.
async fn manifest_json_unpadded(rig: &Rig) -> Value {
    let got = rig.store.get_bytes(MANIFEST).await.unwrap();
    let mut de = serde_json::Deserializer::from_slice(&got.bytes).into_iter::<Value>();
    de.next().unwrap().unwrap()
}

fn since(rig: &Rig, calls: usize) -> Vec<Call> {
    rig.store.calls()[calls..].to_vec()
}

fn verify_opts(rig: &Rig) -> lakecdc::verify::VerifyOptions {
    lakecdc::verify::VerifyOptions {
        schemas: vec!["customer".into()],
        parallelism: 2,
        work_dir: rig.opts.work_dir.clone(),
        source: None,
        engine: Default::default(),
    }
}

fn gc_opts() -> lakecdc::gc::GcOptions {
    lakecdc::gc::GcOptions {
        schemas: vec!["customer".into()],
        grace: std::time::Duration::from_secs(15 * 60),
        dry_run: false,
        repair: false,
        settle_rows: lakecdc::gc::SETTLE_ROWS,
    }
}

async fn inspect(ctx: &lakecdc::job::Context, rig: &Rig) -> lakecdc::inspect::SchemaInspect {
    let report = crate::support::rig::inspect_in(ctx, &rig.opts, &["customer".to_string()]).await;
    report.schemas.into_iter().next().unwrap()
}

#[tokio::test]
async fn verify_names_foreign_manifest_paths_and_never_requests_them() {
    // docs/hazards.md S1
    let rig = flushed_rig(LakeKind::S3, 120).await;
    let ours = rig.listed().await;
    assert_eq!(ours.len(), 3);
    let layout = rig.ctx.lake.layout.clone();
    // Real objects under other prefixes (copies of a listed file, so they would verify), and
    // paths of no shape lakecdc writes.
    let other_schema = layout.delta_key(101, Uuid::now_v7());
    let other_prefix = format!("other/100/{}.parquet", Uuid::now_v7());
    for key in [&other_schema, &other_prefix] {
        rig.store.copy(&ours[0], key).await.unwrap();
    }
    let foreign = vec![
        other_schema.clone(),
        other_prefix.clone(),
        "../x".to_string(),
        format!("/data/100/{}.parquet", Uuid::now_v7()),
        format!("data/100/../101/{}.parquet", Uuid::now_v7()),
    ];
    list_also(&rig, &foreign, Tier::Delta).await;
    let calls = rig.store.calls().len();
    let report = lakecdc::verify::run(&rig.job_context(), &verify_opts(&rig))
        .await
        .unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, lakecdc::verify::Outcome::Diverged, "{s:?}");
    assert_eq!(report.exit_code(), 3);
    assert_eq!(s.files, 8);
    let named: BTreeSet<(&str, &str)> = s
        .problems
        .iter()
        .map(|p| (p.kind, p.path.as_str()))
        .collect();
    let want: BTreeSet<(&str, &str)> = foreign.iter().map(|p| ("foreign", p.as_str())).collect();
    assert_eq!(named, want, "only the foreign paths, each named once");
    let text = report.to_text();
    for p in &foreign {
        assert!(
            text.contains(&format!(
                "foreign {p}: not a data file of schema 100 under data/100/"
            )),
            "{text}"
        );
    }
    // Not one request for them: every request was the manifest or a key of the prefix.
    for c in since(&rig, calls) {
        assert!(!foreign.contains(&c.key), "{c:?}");
        assert!(c.key == MANIFEST || c.key.starts_with("data/100/"), "{c:?}");
    }
    // The listed files of the schema were still checked, each downloaded once.
    let downloads: BTreeSet<String> = since(&rig, calls)
        .into_iter()
        .filter(|c| c.op == Op::GetToFile)
        .map(|c| c.key)
        .collect();
    assert_eq!(downloads, ours.into_iter().collect());
}

#[tokio::test]
async fn gc_never_deletes_a_foreign_key_named_by_the_manifest_or_its_sightings() {
    // docs/hazards.md S1
    let rig = flushed_rig(LakeKind::S3, 20).await;
    let layout = rig.ctx.lake.layout.clone();
    // Garbage-shaped objects of another schema and of another top-level prefix.
    let foreign = [
        layout.merged_base_key(101, Uuid::now_v7()),
        layout.tmp_key(101, Uuid::new_v4()),
        format!("other/100/base-{}.parquet", Uuid::now_v7()),
    ];
    for (i, key) in foreign.iter().enumerate() {
        let body = Bytes::from(format!("foreign object {i}"));
        rig.store
            .put_bytes(key, body, PutMode::Overwrite)
            .await
            .unwrap();
    }
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms() + 24 * 60 * MIN));
    let ctx = lakecdc::job::Context {
        clock: clock.clone(),
        ..rig.job_context()
    };
    // The manifest retires them long ago, and the sightings saw them long ago too.
    let unlisted_long_ago = clock.now_ms() - 12 * 60 * MIN;
    edit(&rig, &SystemClock, |m| {
        m.retire(foreign.iter().take(2), unlisted_long_ago)
    })
    .await;
    let mut sightings: serde_json::Map<String, Value> = foreign
        .iter()
        .map(|k| (k.clone(), json!(unlisted_long_ago)))
        .collect();
    // And an orphan of the schema's own, sighted as long ago: gc's to delete.
    let own = layout.merged_base_key(100, Uuid::now_v7());
    rig.store
        .put_bytes(&own, Bytes::from_static(b"own"), PutMode::Overwrite)
        .await
        .unwrap();
    sightings.insert(own.clone(), json!(unlisted_long_ago));
    let state = serde_json::to_vec(&json!({ "first_unlisted_ms": sightings })).unwrap();
    rig.store
        .put_bytes(
            &layout.gc_state_key(100),
            Bytes::from(state),
            PutMode::Overwrite,
        )
        .await
        .unwrap();
    let intact = |rig: &Rig| {
        let store = rig.store.clone();
        let foreign = foreign.clone();
        async move {
            for (i, key) in foreign.iter().enumerate() {
                let got = store.get_bytes(key).await.unwrap().bytes;
                assert_eq!(got, Bytes::from(format!("foreign object {i}")), "{key}");
            }
        }
    };

    // A manifest retiring foreign keys: refused, naming the first, nothing deleted.
    let calls = rig.store.calls().len();
    let report = lakecdc::gc::run(&ctx, &gc_opts()).await.unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, Some(lakecdc::gc::Outcome::Refused), "{s:?}");
    let reason = s.reason.as_deref().unwrap();
    assert!(
        reason.contains(&format!(
            "{:?} is not a data file of schema 100",
            foreign[0]
        )),
        "{reason}"
    );
    assert!(reason.contains(MANIFEST), "{reason}");
    assert!(s.deleted.is_empty(), "{s:?}");
    assert!(
        since(&rig, calls).iter().all(|c| !c.op.is_write()),
        "a refused gc wrote: {:?}",
        since(&rig, calls)
    );
    intact(&rig).await;
    rig.store.head(&own).await.unwrap();

    // The retirements removed, the sightings still naming the foreign keys: gc deletes its
    // own orphan only, and saves the sightings without the foreign keys.
    let forget: BTreeSet<String> = foreign.iter().cloned().collect();
    edit(&rig, &SystemClock, |m| m.forget_retired(&forget)).await;
    let calls = rig.store.calls().len();
    let report = lakecdc::gc::run(&ctx, &gc_opts()).await.unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.deleted, std::slice::from_ref(&own), "{s:?}");
    let deletes: Vec<String> = since(&rig, calls)
        .into_iter()
        .filter(|c| c.op == Op::Delete)
        .map(|c| c.key)
        .collect();
    assert_eq!(deletes, std::slice::from_ref(&own));
    intact(&rig).await;
    let state = rig
        .store
        .get_bytes(&layout.gc_state_key(100))
        .await
        .unwrap()
        .bytes;
    let state: Value = serde_json::from_slice(&state).unwrap();
    for key in &foreign {
        assert!(state["first_unlisted_ms"].get(key).is_none(), "{state}");
    }
}

#[tokio::test]
async fn init_refuses_to_replace_a_foreign_path() {
    // docs/hazards.md S1: init retires every listed base; a foreign one is never retired.
    let rig = flushed_rig(LakeKind::S3, 20).await;
    let foreign = rig.ctx.lake.layout.merged_base_key(101, Uuid::now_v7());
    list_also(&rig, std::slice::from_ref(&foreign), Tier::Base).await;
    let before = manifest_json(&rig).await;
    let calls = rig.store.calls().len();
    let opts = lakecdc::init::InitOptions {
        schemas: vec!["customer".into()],
        replace_delta: true,
        work_dir: rig.opts.work_dir.clone(),
        ..Default::default()
    };
    let report = lakecdc::init::run(&rig.ctx, &opts).await.unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, lakecdc::init::Outcome::Refused, "{s:?}");
    let reason = s.reason.as_deref().unwrap();
    assert!(
        reason.contains(&format!("{foreign:?} is not a data file of schema 100")),
        "{reason}"
    );
    assert_eq!(report.exit_code(), 1);
    assert!(since(&rig, calls).iter().all(|c| !c.op.is_write()));
    assert_eq!(manifest_json(&rig).await, before);
}

#[tokio::test]
async fn an_oversized_manifest_is_refused_by_every_job_without_being_read() {
    // docs/hazards.md S2
    let mut rig = flushed_rig(LakeKind::Local, 30).await;
    let mut r = Rng::new(40);
    rig.seed(5, &mut r).await;
    let dirty_before = rig.change_log().await;
    // A valid manifest, padded past the default limit by one byte.
    let limit = ReadLimits::default().manifest_bytes;
    let mut body = serde_json::to_vec_pretty(&manifest_json(&rig).await).unwrap();
    body.resize(usize::try_from(limit).unwrap() + 1, b' ');
    rig.store
        .put_bytes(MANIFEST, Bytes::from(body), PutMode::Overwrite)
        .await
        .unwrap();
    let want = format!(
        "manifest {MANIFEST} is at least {} bytes, over the limit of {limit} bytes: refusing to read it",
        limit + 1
    );
    let ctx = rig.job_context();
    let calls = rig.store.calls().len();
    let verify = lakecdc::verify::run(&ctx, &verify_opts(&rig))
        .await
        .unwrap();
    assert_eq!(verify.schemas[0].outcome, lakecdc::verify::Outcome::Failed);
    let compact = lakecdc::compact::run(&ctx, &crate::compact::opts(&rig))
        .await
        .unwrap();
    assert_eq!(
        compact.schemas[0].outcome,
        lakecdc::compact::Outcome::Failed
    );
    let gc = lakecdc::gc::run(&ctx, &gc_opts()).await.unwrap();
    assert_eq!(gc.schemas[0].outcome, Some(lakecdc::gc::Outcome::Failed));
    let inspected = inspect(&ctx, &rig).await;
    let flush = rig.flush().await;
    assert_eq!(flush.schemas[0].outcome, lakecdc::flush::Outcome::Failed);
    let errors = [
        verify.schemas[0].error.clone(),
        compact.schemas[0].error.clone(),
        gc.schemas[0].reason.clone(),
        inspected.error.clone(),
        flush.schemas[0].reason.clone(),
    ];
    for e in errors {
        let e = e.unwrap();
        assert!(e.contains(&want), "{e}");
        assert!(e.contains("--max-manifest-size"), "{e}");
    }
    // Each job made one capped read, refused by the announced length (the error names the
    // whole size, which only the response's header gives before the body is read).
    let manifest_calls: Vec<Op> = since(&rig, calls)
        .into_iter()
        .filter(|c| c.key == MANIFEST)
        .map(|c| c.op)
        .collect();
    assert!(manifest_calls.len() >= 5, "{manifest_calls:?}");
    assert!(
        manifest_calls.iter().all(|op| *op == Op::GetBytes),
        "{manifest_calls:?}"
    );
    // flush published nothing: its rows are still dirty.
    assert_eq!(rig.change_log().await, dirty_before);

    // The limit is the lake's: a smaller one refuses a normal manifest just the same.
    let normal = manifest_json_unpadded(&rig).await;
    put_manifest(&rig, &normal).await;
    let small = lakecdc::job::Context {
        lake: rig.job_context().lake.with_limits(ReadLimits {
            manifest_bytes: 1024,
            ..ReadLimits::default()
        }),
        ..rig.job_context()
    };
    let e = inspect(&small, &rig).await.error.unwrap();
    assert!(e.contains("over the limit of 1024 bytes"), "{e}");
    assert!(inspect(&ctx, &rig).await.error.is_none());
}

#[tokio::test]
async fn a_manifest_listing_a_path_twice_is_refused_at_load() {
    // docs/hazards.md S3
    let rig = flushed_rig(LakeKind::S3, 120).await;
    let mut m = manifest_json(&rig).await;
    let files = m["files"].as_array_mut().unwrap();
    let twice = files[1].clone();
    files.push(twice.clone());
    put_manifest(&rig, &m).await;
    let path = twice["path"].as_str().unwrap();
    let want = format!("manifest {MANIFEST}: lists {path:?} more than once");
    let calls = rig.store.calls().len();
    let verify = lakecdc::verify::run(&rig.job_context(), &verify_opts(&rig))
        .await
        .unwrap();
    assert_eq!(verify.schemas[0].outcome, lakecdc::verify::Outcome::Failed);
    let e = verify.schemas[0].error.clone().unwrap();
    assert!(e.contains(&want), "{e}");
    let compact_opts = lakecdc::compact::CompactOptions {
        max_deltas: 0,
        ..crate::compact::opts(&rig)
    };
    let compact = lakecdc::compact::run(&rig.job_context(), &compact_opts)
        .await
        .unwrap();
    assert!(compact.schemas[0].error.as_deref().unwrap().contains(&want));
    // Nothing downloaded, nothing written.
    assert!(
        since(&rig, calls)
            .iter()
            .all(|c| c.op != Op::GetToFile && !c.op.is_write()),
        "{:?}",
        since(&rig, calls)
    );
}

#[tokio::test]
async fn a_checksum_that_is_not_sha256_hex_is_refused_before_it_names_a_cached_file() {
    // docs/hazards.md S15: query names each cached file by its entry's checksum digits; a
    // checksum of `../victim` would have made it check, delete or read a file outside its cache.
    let rig = flushed_rig(LakeKind::S3, 30).await;
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let victim = tmp.path().join("victim.parquet");
    std::fs::write(&victim, b"not the lake's").unwrap();
    let mut m = manifest_json(&rig).await;
    let entry = &mut m["files"][0];
    let path = entry["path"].as_str().unwrap().to_string();
    entry["checksum"] = json!("sha256:../victim");
    entry["size_bytes"] = json!(1);
    put_manifest(&rig, &m).await;
    let want = format!(
        "manifest {MANIFEST}: entry {path:?} has a malformed checksum \"sha256:../victim\" (want sha256: and 64 lowercase hex digits)"
    );
    for verify in [false, true] {
        let opts = lakecdc::query::QueryOptions {
            verify,
            ..crate::query::options(
                &rig,
                "SELECT count(*) FROM customer",
                lakecdc::query::Format::Csv,
                &tmp.path().join("out.csv"),
                &cache,
            )
        };
        let e = lakecdc::query::run(&rig.job_context(), &opts)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains(&want), "{e}");
    }
    assert_eq!(std::fs::read(&victim).unwrap(), b"not the lake's");
    let verify = lakecdc::verify::run(&rig.job_context(), &verify_opts(&rig))
        .await
        .unwrap();
    assert!(verify.schemas[0].error.as_deref().unwrap().contains(&want));
    // Upper-case digits are malformed too: no object's checksum is written so.
    let mut m = manifest_json(&rig).await;
    let upper = format!("sha256:{}", "AB".repeat(32));
    m["files"][0]["checksum"] = json!(upper);
    put_manifest(&rig, &m).await;
    let verify = lakecdc::verify::run(&rig.job_context(), &verify_opts(&rig))
        .await
        .unwrap();
    assert!(
        verify.schemas[0]
            .error
            .as_deref()
            .unwrap()
            .contains("malformed checksum"),
        "{verify:?}"
    );
}

#[tokio::test]
async fn manifest_counts_sum_without_wrapping_and_negative_ones_are_refused() {
    // docs/hazards.md S4
    let rig = flushed_rig(LakeKind::S3, 20).await;
    let layout = rig.ctx.lake.layout.clone();
    let entry = |rows: i64, bytes: i64| {
        json!({"tier": "base", "path": layout.delta_key(100, Uuid::now_v7()),
               "size_bytes": bytes, "row_count": rows})
    };
    // Each count at the largest a manifest may hold; 1,100 of them pass i64::MAX together.
    let max = lakecdc::lake::manifest::MAX_COUNT;
    let files: Vec<_> = (0..1100).map(|_| entry(max, max)).collect();
    put_manifest(
        &rig,
        &json!({"schema_id": 100, "version": 3, "files": files}),
    )
    .await;
    let ctx = rig.job_context();
    let s = inspect(&ctx, &rig).await;
    assert_eq!(s.error, None);
    assert_eq!(
        (s.base.files, s.base.rows, s.base.bytes),
        (1100, i64::MAX, i64::MAX)
    );
    let plan = s.compaction.as_ref().unwrap();
    assert_eq!((plan.base_rows, plan.base_bytes), (i64::MAX, i64::MAX));
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["base"]["rows"], json!(i64::MAX));

    // A negative or impossible count or size is refused at load, naming the manifest and the
    // entry.
    for (rows, bytes, field) in [
        (-1, 5, "negative row_count (-1)"),
        (5, -7, "negative size_bytes (-7)"),
        (i64::MAX, 5, "impossible row_count (9223372036854775807"),
        (5, max + 1, "impossible size_bytes (9007199254740992"),
    ] {
        let bad = entry(rows, bytes);
        let path = bad["path"].as_str().unwrap().to_string();
        put_manifest(
            &rig,
            &json!({"schema_id": 100, "version": 4, "files": [entry(5, 5), bad]}),
        )
        .await;
        let e = inspect(&ctx, &rig).await.error.unwrap();
        assert!(
            e.contains(&format!(
                "manifest {MANIFEST}: entry {path:?} has a{} {field}",
                if field.starts_with('i') { "n" } else { "" }
            )),
            "{e}"
        );
        let verify = lakecdc::verify::run(&ctx, &verify_opts(&rig))
            .await
            .unwrap();
        assert_eq!(verify.schemas[0].outcome, lakecdc::verify::Outcome::Failed);
        assert!(verify.schemas[0].error.as_deref().unwrap().contains(&path));
    }
}

#[tokio::test]
async fn compaction_refuses_a_source_larger_than_listed_before_downloading_it() {
    // docs/hazards.md S2
    let (rig, _) = lake_with_base_and_deltas(40).await;
    let m = manifest_json(&rig).await;
    let victim = m["files"][1]["path"].as_str().unwrap().to_string();
    let listed = m["files"][1]["size_bytes"].as_u64().unwrap();
    let mut bytes = rig.store.get_bytes(&victim).await.unwrap().bytes.to_vec();
    bytes.extend(std::iter::repeat_n(0u8, 1 << 20));
    rig.store
        .put_bytes(&victim, Bytes::from(bytes), PutMode::Overwrite)
        .await
        .unwrap();
    let calls = rig.store.calls().len();
    let report = lakecdc::compact::run(&rig.job_context(), &crate::compact::opts(&rig))
        .await
        .unwrap();
    let s = &report.schemas[0];
    assert_eq!(
        s.plan.as_ref().unwrap().decision,
        lakecdc::compact::Decision::Rewrite
    );
    assert_eq!(s.outcome, lakecdc::compact::Outcome::Failed);
    let e = s.error.as_deref().unwrap();
    assert!(
        e.contains(&format!(
            "compaction source {victim} is at least {} bytes, over the limit of {listed} bytes",
            listed + (1 << 20)
        )),
        "{e}"
    );
    // Sized, not downloaded; and nothing at all downloaded before every source was sized.
    let ops: Vec<(Op, String)> = since(&rig, calls)
        .into_iter()
        .map(|c| (c.op, c.key))
        .collect();
    assert!(ops.contains(&(Op::Head, victim.clone())), "{ops:?}");
    assert!(!ops.iter().any(|(op, _)| *op == Op::GetToFile), "{ops:?}");
    assert!(rig.keys("data/100/base-").await.is_empty());
}

#[tokio::test]
async fn compaction_checks_the_work_dirs_room_before_downloading() {
    // docs/hazards.md S2
    let (rig, _) = lake_with_base_and_deltas(41).await;
    let m = manifest_json(&rig).await;
    let size = |tier: &str| -> u64 {
        m["files"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["tier"] == tier)
            .map(|f| f["size_bytes"].as_u64().unwrap())
            .sum()
    };
    // Every file is rewritten: at most two bases of the target (never more than the inputs);
    // a consolidated delta is streamed to the store, never written locally.
    let needed = size("base") + size("delta");
    let cramped = lakecdc::compact::CompactOptions {
        free_space: Some(|_| Ok(1000)),
        ..crate::compact::opts(&rig)
    };
    let calls = rig.store.calls().len();
    let report = lakecdc::compact::run(&rig.job_context(), &cramped)
        .await
        .unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, lakecdc::compact::Outcome::Failed);
    let e = s.error.as_deref().unwrap();
    assert!(e.contains("has 1000 bytes free"), "{e}");
    assert!(e.contains(&format!("needs {needed}")), "{e}");
    assert!(
        since(&rig, calls)
            .iter()
            .all(|c| c.op != Op::GetToFile && !c.op.is_write()),
        "{:?}",
        since(&rig, calls)
    );
    // With the room, the same rewrite goes through.
    let roomy = lakecdc::compact::CompactOptions {
        free_space: Some(|_| Ok(u64::MAX)),
        ..crate::compact::opts(&rig)
    };
    let report = lakecdc::compact::run(&rig.job_context(), &roomy)
        .await
        .unwrap();
    assert_eq!(
        report.schemas[0].outcome,
        lakecdc::compact::Outcome::Done,
        "{report:?}"
    );
    assert_eq!(rig.keys("data/100/base-").await.len(), 1);
}

#[tokio::test]
async fn verify_reports_an_object_larger_than_listed_without_downloading_it() {
    // docs/hazards.md S2
    let rig = flushed_rig(LakeKind::S3, 120).await;
    let listed = rig.listed().await;
    let victim = listed[0].clone();
    let mut bytes = rig.store.get_bytes(&victim).await.unwrap().bytes.to_vec();
    let size = bytes.len();
    bytes.extend(std::iter::repeat_n(0u8, 1 << 20));
    rig.store
        .put_bytes(&victim, Bytes::from(bytes), PutMode::Overwrite)
        .await
        .unwrap();
    let calls = rig.store.calls().len();
    let report = lakecdc::verify::run(&rig.job_context(), &verify_opts(&rig))
        .await
        .unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, lakecdc::verify::Outcome::Diverged);
    let problems: Vec<(&str, &str, &str)> = s
        .problems
        .iter()
        .map(|p| (p.kind, p.path.as_str(), p.detail.as_str()))
        .collect();
    let detail = format!(
        "manifest {size} bytes, object at least {}: larger than listed, not read further",
        size + (1 << 20)
    );
    assert_eq!(problems, [("size", victim.as_str(), detail.as_str())]);
    let downloads: BTreeSet<String> = since(&rig, calls)
        .into_iter()
        .filter(|c| c.op == Op::GetToFile)
        .map(|c| c.key)
        .collect();
    // One capped request each; the victim's was refused by its announced length (the whole
    // size in the detail), so its body was never read.
    assert_eq!(downloads, listed.iter().cloned().collect());
}

/// A listed size is the lake writer's to choose: verify measures its work dir before it
/// downloads anything, so an entry claiming a petabyte fails the schema with one line instead
/// of filling the disk (docs/hazards.md S2).
#[tokio::test]
async fn verify_refuses_a_listed_size_its_work_dir_cannot_hold() {
    let rig = flushed_rig(LakeKind::S3, 20).await;
    let mut m = manifest_json(&rig).await;
    let victim = m["files"][0]["path"].as_str().unwrap().to_string();
    m["files"][0]["size_bytes"] = json!(1i64 << 50);
    put_manifest(&rig, &m).await;
    let calls = rig.store.calls().len();
    let report = lakecdc::verify::run(&rig.job_context(), &verify_opts(&rig))
        .await
        .unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, lakecdc::verify::Outcome::Failed, "{s:?}");
    let e = s.error.as_deref().unwrap();
    assert!(
        e.contains("verify (the listed objects it downloads at once) needs 2251799813685248"),
        "{e}"
    );
    assert!(e.contains("--work-dir"), "{e}");
    let fetched: Vec<Call> = since(&rig, calls)
        .into_iter()
        .filter(|c| c.op == Op::GetToFile && c.key == victim)
        .collect();
    assert!(fetched.is_empty(), "{fetched:?}");
}

#[tokio::test]
async fn another_tools_document_at_the_manifest_key_is_refused_never_claimed() {
    // docs/hazards.md L102: every manifest field defaults, so any JSON object parsed as an
    // empty manifest: verify called it intact and init claimed it and overwrote it.
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(5);
    rig.seed(20, &mut r).await;
    let foreign = json!({"format": "delta", "tables": ["precious"]});
    put_manifest(&rig, &foreign).await;
    let calls = rig.store.calls().len();
    let opts = lakecdc::init::InitOptions {
        schemas: vec!["customer".into()],
        work_dir: rig.opts.work_dir.clone(),
        ..Default::default()
    };
    let init = lakecdc::init::run(&rig.ctx, &opts).await.unwrap();
    assert_ne!(init.exit_code(), 0, "{init:?}");
    let reason = init.schemas[0].reason.as_deref().unwrap_or_default();
    assert!(reason.contains("is not a lakecdc manifest"), "{reason}");
    let verify = lakecdc::verify::run(&rig.ctx, &verify_opts(&rig))
        .await
        .unwrap();
    assert_ne!(verify.schemas[0].outcome, lakecdc::verify::Outcome::Intact);
    assert_ne!(verify.exit_code(), 0);
    let flush = rig.flush().await;
    assert!(flush.failed(), "{flush:?}");
    assert!(since(&rig, calls).iter().all(|c| !c.op.is_write()));
    assert_eq!(manifest_json(&rig).await, foreign);
    // A manifest with an empty list is still one.
    put_manifest(&rig, &json!({"schema_id": 100, "version": 1, "files": []})).await;
    let verify = lakecdc::verify::run(&rig.ctx, &verify_opts(&rig))
        .await
        .unwrap();
    assert_eq!(verify.exit_code(), 0, "{verify:?}");
}
