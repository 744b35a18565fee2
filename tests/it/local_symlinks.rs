//! A local lake holding symbolic links (docs/hazards.md L27): whoever can write the lake
//! directory must not make a job read, write or delete anything outside it. Each job runs on a
//! local lake where (a) the customer schema's data prefix `data/100` was replaced by a link to
//! a directory outside the lake holding what it held, or (b) one key the job reads was replaced
//! by a link to a byte-identical copy outside. The job must fail naming the key and the link,
//! and the directory outside must be exactly as it was: no file read into a report, changed,
//! deleted or added.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use lakecdc::store::{ObjectStore, PutMode};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::support::harness;
use crate::support::oracle;
use crate::support::rig::{LakeKind, Rig, rig};
use crate::support::writer::Rng;

const MANIFEST: &str = "manifest/100.json";
const PREFIX: &str = "data/100";

/// A directory outside the lake, and everything it held before the job ran.
struct Outside {
    dir: tempfile::TempDir,
    before: BTreeMap<PathBuf, Option<Vec<u8>>>,
}

impl Outside {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            before: BTreeMap::new(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Records what lies outside now: the job must leave exactly this.
    fn seal(&mut self) {
        self.before = snapshot(self.path());
        assert!(self.before.values().any(Option::is_some), "nothing outside");
    }

    /// Nothing outside was deleted, changed or created.
    fn assert_untouched(&self) {
        assert_eq!(
            snapshot(self.path()),
            self.before,
            "the job changed files outside the lake"
        );
    }

    /// The SHA-256 (hex) of every file outside: none may appear in a report.
    fn hashes(&self) -> Vec<String> {
        self.before
            .values()
            .flatten()
            .map(|bytes| hex::encode(Sha256::digest(bytes)))
            .collect()
    }
}

/// Every path beneath `dir` (links not followed), with each file's bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(dir).unwrap().to_path_buf();
            if fs::symlink_metadata(&path).unwrap().is_dir() {
                todo.push(path);
                out.insert(rel, None);
            } else {
                out.insert(rel, Some(fs::read(&path).unwrap()));
            }
        }
    }
    out
}

fn lake_dir(rig: &Rig) -> PathBuf {
    rig.work.path().join("lake")
}

/// Copies the tree `from` to `to`.
fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let dest = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_tree(&path, &dest);
        } else {
            fs::copy(&path, &dest).unwrap();
        }
    }
}

/// Replaces the lake's `data/100` by a link to a directory outside holding what it held (or
/// holding only a stray file, when the prefix does not exist yet).
fn link_data_prefix(rig: &Rig, outside: &Outside) {
    let inside = lake_dir(rig).join(PREFIX);
    let target = outside.path().join("100");
    if inside.exists() {
        copy_tree(&inside, &target);
        fs::remove_dir_all(&inside).unwrap();
    } else {
        fs::create_dir_all(&target).unwrap();
        fs::write(target.join("notes.txt"), b"outside the lake").unwrap();
        fs::create_dir_all(inside.parent().unwrap()).unwrap();
    }
    symlink(&target, &inside).unwrap();
}

/// Replaces the lake's `key` by a link to a byte-identical copy outside.
fn link_key(rig: &Rig, outside: &Outside, key: &str) {
    let inside = lake_dir(rig).join(key);
    let target = outside.path().join(key.replace('/', "_"));
    fs::copy(&inside, &target).unwrap();
    fs::remove_file(&inside).unwrap();
    symlink(&target, &inside).unwrap();
}

/// The link is still in the lake: the job did not replace it either.
fn assert_still_a_link(rig: &Rig, path: &str) {
    let meta = fs::symlink_metadata(lake_dir(rig).join(path)).unwrap();
    assert!(meta.file_type().is_symlink(), "{path} was replaced");
}

/// `text` refuses a key under the linked data prefix.
fn assert_refuses_the_prefix(text: &str) {
    assert!(
        text.contains("lake key data/100/")
            && text.contains("crosses a symbolic link at data/100:"),
        "{text}"
    );
}

/// `text` refuses `key`, itself a link.
fn assert_refuses_the_key(text: &str, key: &str) {
    assert!(
        text.contains(&format!("lake key {key} crosses a symbolic link at {key}:")),
        "{text}"
    );
}

async fn manifest_bytes(rig: &Rig) -> Bytes {
    rig.store.get_bytes(MANIFEST).await.unwrap().bytes
}

/// A local lake with the customer schema flushed once (`rows` rows, 40 per delta).
async fn flushed(rows: usize, seed: u64) -> (Rig, Rng) {
    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(seed);
    rig.seed(rows, &mut r).await;
    let report = rig.flush().await;
    assert!(!report.failed(), "{report:?}");
    (rig, r)
}

/// Sets the modification time of every file beneath `dir` to `ago` in the past.
fn age(dir: &Path, ago: Duration) {
    let then = SystemTime::now() - ago;
    for (rel, bytes) in snapshot(dir) {
        if bytes.is_some() {
            let file = fs::OpenOptions::new()
                .write(true)
                .open(dir.join(rel))
                .unwrap();
            file.set_modified(then).unwrap();
        }
    }
}

// ---- gc ----

/// Runs `lakecdc <job>` on the rig's local lake: its exit code and stdout + stderr.
fn run_bin(job: &str, rig: &Rig) -> (Option<i32>, String) {
    let out = harness::bin()
        .args([job, "--pg-url", &rig.db.url, "--lake"])
        .arg(lake_dir(rig))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[tokio::test]
async fn gc_deletes_nothing_through_a_linked_data_prefix() {
    // The security review's attack, through the binary: `data/100` replaced by a link to a
    // directory outside the lake that holds the prefix's files plus two files shaped like
    // gc's orphans (a staging file and a merged base), old enough for any grace, and a forged
    // `.gc-state` that sighted both at the epoch. gc used to delete both.
    let (rig, _) = flushed(30, 271).await;
    let layout = rig.ctx.lake.layout.clone();
    let victims = [
        layout.tmp_key(100, Uuid::new_v4()),
        layout.merged_base_key(100, Uuid::now_v7()),
    ];
    for (i, key) in victims.iter().enumerate() {
        let body = Bytes::from(format!("victim {i} outside the lake"));
        rig.store
            .put_bytes(key, body, PutMode::Overwrite)
            .await
            .unwrap();
    }
    let forged = serde_json::json!({
        "first_unlisted_ms": { victims[0].as_str(): 0, victims[1].as_str(): 0 }
    });
    rig.store
        .put_bytes(
            &layout.gc_state_key(100),
            Bytes::from(forged.to_string()),
            PutMode::Overwrite,
        )
        .await
        .unwrap();
    let mut outside = Outside::new();
    link_data_prefix(&rig, &outside);
    age(outside.path(), Duration::from_secs(2 * 86_400));
    outside.seal();
    for v in &victims {
        let moved = outside
            .path()
            .join("100")
            .join(v.strip_prefix("data/100/").unwrap());
        assert!(moved.is_file(), "{v} is not outside");
    }

    let (code, text) = run_bin("gc", &rig);
    assert_eq!(code, Some(1), "{text}");
    assert_refuses_the_prefix(&text);
    for v in &victims {
        assert!(!text.contains(&format!("deleted {v}")), "{text}");
    }
    outside.assert_untouched();
    assert_still_a_link(&rig, PREFIX);
}

#[tokio::test]
async fn gc_refuses_a_linked_gc_state() {
    // The sightings gc reads and rewrites: a link to a file outside is neither read nor
    // written through.
    let (rig, _) = flushed(30, 272).await;
    let layout = rig.ctx.lake.layout.clone();
    let state_key = layout.gc_state_key(100);
    let orphan = layout.tmp_key(100, Uuid::new_v4());
    rig.store
        .put_bytes(&orphan, Bytes::from_static(b"orphan"), PutMode::Overwrite)
        .await
        .unwrap();
    let forged = serde_json::json!({ "first_unlisted_ms": { orphan.as_str(): 0 } });
    rig.store
        .put_bytes(
            &state_key,
            Bytes::from(forged.to_string()),
            PutMode::Overwrite,
        )
        .await
        .unwrap();
    let mut outside = Outside::new();
    link_key(&rig, &outside, &state_key);
    outside.seal();

    let (clock, ctx, opts) = rig.gc_on_a_manual_clock();
    clock.advance(24 * 3_600_000);
    let report = lakecdc::gc::run(&ctx, &opts).await.unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, Some(lakecdc::gc::Outcome::Failed), "{s:?}");
    assert_refuses_the_key(&report.to_text(), &state_key);
    assert!(s.deleted.is_empty(), "{s:?}");
    rig.store.head(&orphan).await.unwrap();
    outside.assert_untouched();
    assert_still_a_link(&rig, &state_key);
}

// ---- verify ----

#[tokio::test]
async fn verify_reads_nothing_through_a_linked_data_prefix() {
    let (rig, _) = flushed(120, 273).await;
    let mut outside = Outside::new();
    link_data_prefix(&rig, &outside);
    outside.seal();

    let opts = lakecdc::verify::VerifyOptions {
        schemas: vec!["customer".into()],
        parallelism: 3,
        work_dir: rig.opts.work_dir.clone(),
        source: None,
        engine: Default::default(),
    };
    let report = lakecdc::verify::run(&rig.job_context(), &opts)
        .await
        .unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, lakecdc::verify::Outcome::Failed, "{s:?}");
    assert_eq!(s.bytes, 0, "{s:?}");
    let text = report.to_text();
    assert_refuses_the_prefix(&text);
    for h in outside.hashes() {
        assert!(!text.contains(&h), "{text}");
    }
    outside.assert_untouched();
    assert_still_a_link(&rig, PREFIX);
}

#[tokio::test]
async fn verify_reads_nothing_through_a_linked_key() {
    // The review's second finding, through the binary: a listed key linked to a file outside
    // the lake was downloaded, and its size and SHA-256 printed.
    let (rig, _) = flushed(120, 274).await;
    let victim = rig.listed().await[0].clone();
    let mut outside = Outside::new();
    link_key(&rig, &outside, &victim);
    outside.seal();

    let opts = lakecdc::verify::VerifyOptions {
        schemas: vec!["customer".into()],
        parallelism: 1,
        work_dir: rig.opts.work_dir.clone(),
        source: None,
        engine: Default::default(),
    };
    let report = lakecdc::verify::run(&rig.job_context(), &opts)
        .await
        .unwrap();
    assert_eq!(
        report.schemas[0].outcome,
        lakecdc::verify::Outcome::Failed,
        "{report:?}"
    );
    assert_refuses_the_key(&report.to_text(), &victim);

    let (code, text) = run_bin("verify", &rig);
    assert_eq!(code, Some(1), "{text}");
    assert_refuses_the_key(&text, &victim);
    for h in outside.hashes() {
        assert!(!text.contains(&h), "{text}");
    }
    outside.assert_untouched();
    assert_still_a_link(&rig, &victim);
}

// ---- compact ----

/// A local lake with a base tier (three promoted deltas) and a delta over it, so that
/// compaction rewrites: it downloads every listed file and writes a new base.
async fn lake_to_rewrite(seed: u64) -> Rig {
    let (mut rig, mut r) = flushed(120, seed).await;
    let promote = lakecdc::compact::CompactOptions {
        max_deltas: 0,
        ..crate::compact::opts(&rig)
    };
    let report = lakecdc::compact::run(&rig.job_context(), &promote)
        .await
        .unwrap();
    assert_eq!(report.schemas[0].outcome, lakecdc::compact::Outcome::Done);
    rig.seed(20, &mut r).await;
    assert!(!rig.flush().await.failed());
    rig
}

async fn compact(rig: &Rig) -> lakecdc::compact::SchemaCompact {
    let report = lakecdc::compact::run(&rig.job_context(), &crate::compact::opts(rig))
        .await
        .unwrap();
    let s = report.schemas.into_iter().next().unwrap();
    // The plan reads the deltas' row ids: a refusal may come before it is made.
    let decision = s.plan.as_ref().map(|p| p.decision);
    let failed = s.outcome == lakecdc::compact::Outcome::Failed;
    assert!(
        decision == Some(lakecdc::compact::Decision::Rewrite) || (failed && decision.is_none()),
        "{s:?}"
    );
    s
}

#[tokio::test]
async fn compact_writes_nothing_through_a_linked_data_prefix() {
    let rig = lake_to_rewrite(275).await;
    let manifest = manifest_bytes(&rig).await;
    let mut outside = Outside::new();
    link_data_prefix(&rig, &outside);
    outside.seal();

    let s = compact(&rig).await;
    assert_eq!(s.outcome, lakecdc::compact::Outcome::Failed, "{s:?}");
    assert_refuses_the_prefix(s.error.as_deref().unwrap_or_default());
    assert_eq!(s.new_base, None);
    assert_eq!(manifest_bytes(&rig).await, manifest, "the manifest changed");
    outside.assert_untouched();
    assert_still_a_link(&rig, PREFIX);
}

#[tokio::test]
async fn compact_reads_nothing_through_a_linked_key() {
    let rig = lake_to_rewrite(276).await;
    let manifest = manifest_bytes(&rig).await;
    let victim = rig.listed().await[1].clone();
    let mut outside = Outside::new();
    link_key(&rig, &outside, &victim);
    outside.seal();

    let s = compact(&rig).await;
    assert_eq!(s.outcome, lakecdc::compact::Outcome::Failed, "{s:?}");
    assert_refuses_the_key(s.error.as_deref().unwrap_or_default(), &victim);
    assert_eq!(s.new_base, None);
    assert_eq!(manifest_bytes(&rig).await, manifest, "the manifest changed");
    outside.assert_untouched();
    assert_still_a_link(&rig, &victim);
}

// ---- flush ----

#[tokio::test]
async fn flush_writes_nothing_through_a_linked_data_prefix() {
    let (mut rig, mut r) = flushed(30, 277).await;
    let manifest = manifest_bytes(&rig).await;
    let mut outside = Outside::new();
    link_data_prefix(&rig, &outside);
    outside.seal();
    let new_rows = rig.seed(10, &mut r).await;

    let report = rig.flush().await;
    assert!(report.failed(), "{report:?}");
    assert_refuses_the_prefix(&report.to_text());
    assert_eq!(manifest_bytes(&rig).await, manifest, "the manifest changed");
    assert_eq!(
        oracle::dirty(&rig.writer).await,
        new_rows.into_iter().collect::<BTreeSet<_>>(),
        "rows were marked flushed"
    );
    outside.assert_untouched();
    assert_still_a_link(&rig, PREFIX);
}

#[tokio::test]
async fn flush_reads_nothing_through_a_linked_manifest() {
    let (mut rig, mut r) = flushed(30, 278).await;
    let mut outside = Outside::new();
    link_key(&rig, &outside, MANIFEST);
    outside.seal();
    let new_rows = rig.seed(10, &mut r).await;

    let report = rig.flush().await;
    assert!(report.failed(), "{report:?}");
    assert_refuses_the_key(&report.to_text(), MANIFEST);
    assert_eq!(
        oracle::dirty(&rig.writer).await,
        new_rows.into_iter().collect::<BTreeSet<_>>(),
        "rows were marked flushed"
    );
    outside.assert_untouched();
    assert_still_a_link(&rig, MANIFEST);
}

// ---- init ----

fn init_opts(rig: &Rig) -> lakecdc::init::InitOptions {
    lakecdc::init::InitOptions {
        schemas: vec!["customer".into()],
        work_dir: rig.opts.work_dir.clone(),
        page_rows: 25,
        max_file_rows: 60,
        ..lakecdc::init::InitOptions::default()
    }
}

#[tokio::test]
async fn init_writes_nothing_through_a_linked_data_prefix() {
    // A never-exported schema whose data prefix someone made a link beforehand.
    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(279);
    rig.seed(30, &mut r).await;
    let mut outside = Outside::new();
    link_data_prefix(&rig, &outside);
    outside.seal();

    let report = lakecdc::init::run(&rig.ctx, &init_opts(&rig))
        .await
        .unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, lakecdc::init::Outcome::Failed, "{s:?}");
    assert_refuses_the_prefix(&report.to_text());
    assert!(
        rig.store.head(MANIFEST).await.unwrap_err().is_not_found(),
        "a manifest was published"
    );
    outside.assert_untouched();
    assert_still_a_link(&rig, PREFIX);
}

#[tokio::test]
async fn init_reads_nothing_through_a_linked_manifest() {
    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(280);
    rig.seed(30, &mut r).await;
    let first = lakecdc::init::run(&rig.ctx, &init_opts(&rig))
        .await
        .unwrap();
    assert_eq!(first.exit_code(), 0, "{first:?}");
    let mut outside = Outside::new();
    link_key(&rig, &outside, MANIFEST);
    outside.seal();

    let report = lakecdc::init::run(&rig.ctx, &init_opts(&rig))
        .await
        .unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, lakecdc::init::Outcome::Failed, "{s:?}");
    assert_refuses_the_key(&report.to_text(), MANIFEST);
    outside.assert_untouched();
    assert_still_a_link(&rig, MANIFEST);
}
