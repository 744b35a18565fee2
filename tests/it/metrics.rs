//! Prometheus metrics of every job (docs/operations.md, "Metrics"): each job's metrics file
//! parses with the `prometheus_client` text parser and holds what the job's `--json` report
//! said; a failed run moves last-run but not last-success; a Pushgateway receives the same body
//! (`PUT` for a success, `POST` without the success time for a failure).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::support::harness;
use crate::support::http::{Request, recording_server};
use crate::support::rig::{LakeKind, Rig, rig};
use crate::support::writer::{Customer, Rng};

/// An address where a connection attempt fails at once.
const UNREACHABLE: &str = "host=127.0.0.1 port=1 user=u dbname=d sslmode=disable connect_timeout=1";

/// Metric name → [(labels, value)], as `prometheus_client`'s text parser reads `text`.
type Parsed = BTreeMap<String, Vec<(BTreeMap<String, String>, f64)>>;

fn parse(text: &str) -> Parsed {
    const SCRIPT: &str = r#"import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = {}
for fam in text_string_to_metric_families(sys.stdin.read()):
    assert fam.type == 'gauge', (fam.name, fam.type)
    assert fam.documentation, fam.name
    for s in fam.samples:
        out.setdefault(s.name, []).append([s.labels, s.value])
print(json.dumps(out))
"#;
    let out = harness::run_python(SCRIPT, text.as_bytes());
    assert!(
        out.status.success(),
        "the text parser refused:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The one value of `name` whose labels include `labels`.
fn value(p: &Parsed, name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<f64> = p
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {p:?}"))
        .iter()
        .filter(|(l, _)| {
            labels
                .iter()
                .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(found.len(), 1, "{name} {labels:?}: {found:?}");
    found[0]
}

struct Cli<'a> {
    rig: &'a Rig,
    metrics: PathBuf,
}

impl Cli<'_> {
    fn lake(&self) -> PathBuf {
        self.rig.work.path().join("lake")
    }

    /// Runs `args` with the metrics file template; (exit code, stdout, stderr).
    fn run(&self, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
        let mut cmd = harness::bin();
        cmd.args(args).arg("--json");
        if !args.contains(&"--pg-url") {
            cmd.args(["--pg-url", &self.rig.db.url]);
        }
        cmd.arg("--lake")
            .arg(self.lake())
            .arg("--schema-dir")
            .arg(harness::examples_dir())
            .env("LAKECDC_WORK_DIR", self.rig.work.path())
            .arg("--metrics-file")
            .arg(&self.metrics)
            .env_remove("LAKECDC_PUSHGATEWAY");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Runs a job that must succeed; its JSON report and its parsed metrics file.
    fn job(&self, args: &[&str]) -> (Value, Parsed) {
        let (code, out, err) = self.run(args, &[]);
        assert_eq!(code, 0, "{args:?}: {err}");
        let file = self.file(args[0]);
        (serde_json::from_str(&out).unwrap(), parse(&file))
    }

    fn file(&self, job: &str) -> String {
        let path = self.metrics.to_string_lossy().replace("{job}", job);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }
}

/// The per-schema state metrics equal what `inspect --json` says now.
fn assert_state_is_inspects(cli: &Cli<'_>, job: &str, p: &Parsed) {
    let (code, out, err) = cli.run(&["inspect"], &[]);
    assert_eq!(code, 0, "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let s = &report["schemas"][0];
    let l = |extra: &[(&'static str, &'static str)]| {
        let mut v = vec![("command", job), ("schema_id", "100")];
        v.extend_from_slice(extra);
        v
    };
    let n = |v: &Value| v.as_f64().unwrap();
    assert_eq!(
        value(p, "lakecdc_dirty_rows", &l(&[])),
        n(&s["dirty_rows"]),
        "{job}"
    );
    // inspect measures the age a moment later, in whole seconds.
    let age = value(p, "lakecdc_oldest_dirty_age_seconds", &l(&[]));
    let inspected = n(&s["oldest_dirty_age_s"]);
    if n(&s["dirty_rows"]) == 0.0 {
        assert_eq!(age, 0.0, "{job}");
    } else {
        assert!(
            age > 0.0 && (age - inspected).abs() <= 5.0,
            "{job}: {age} vs {inspected}"
        );
    }
    assert_eq!(
        value(p, "lakecdc_manifest_version", &l(&[])),
        n(&s["manifest_version"]),
        "{job}"
    );
    for tier in ["base", "delta"] {
        let t = [("tier", tier)];
        assert_eq!(
            value(p, "lakecdc_lake_files", &l(&t)),
            n(&s[tier]["files"]),
            "{job} {tier}"
        );
        assert_eq!(
            value(p, "lakecdc_lake_bytes", &l(&t)),
            n(&s[tier]["bytes"]),
            "{job} {tier}"
        );
    }
}

/// The run-level metrics of a successful run.
fn assert_succeeded(job: &str, p: &Parsed) {
    let c = [("command", job)];
    let ran = value(p, "lakecdc_last_run_timestamp_seconds", &c);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        (now - ran).abs() < 120.0,
        "{job}: last run {ran}, now {now}"
    );
    assert_eq!(value(p, "lakecdc_last_success_timestamp_seconds", &c), ran);
    assert!(value(p, "lakecdc_run_duration_seconds", &c) > 0.0);
    assert_eq!(value(p, "lakecdc_run_exit_code", &c), 0.0);
    assert_eq!(
        value(
            p,
            "lakecdc_run_outcome",
            &[("command", job), ("outcome", "done")]
        ),
        1.0
    );
    assert_eq!(
        value(
            p,
            "lakecdc_run_outcome",
            &[("command", job), ("outcome", "failed")]
        ),
        0.0
    );
}

fn written(p: &Parsed, job: &str) -> (f64, f64, f64) {
    let l = [
        ("command", job),
        ("schema", "customer"),
        ("schema_id", "100"),
    ];
    (
        value(p, "lakecdc_schema_rows_exported", &l),
        value(p, "lakecdc_schema_files_written", &l),
        value(p, "lakecdc_schema_bytes_written", &l),
    )
}

fn files_of(v: &Value) -> f64 {
    v.as_array().unwrap().len() as f64
}

async fn prepared() -> (Rig, tempfile::TempDir) {
    let mut rig = rig(LakeKind::Local).await;
    std::fs::create_dir_all(rig.work.path().join("lake")).unwrap();
    let mut r = Rng::new(2301);
    rig.seed(200, &mut r).await;
    (rig, tempfile::tempdir().unwrap())
}

async fn change_some(rig: &mut Rig, r: &mut Rng, n: usize) {
    let ids: Vec<_> = rig.writer.rows.keys().copied().take(n).collect();
    for id in ids {
        rig.writer.update(id, Customer::random(r)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_job_writes_metrics_holding_its_reports_values() {
    let (mut rig, dir) = prepared().await;
    let mut r = Rng::new(2302);
    // init, a flush of changes made after it, a compaction, gc and verify.
    let metrics = dir.path().join("lakecdc_{job}.prom");
    let cli = Cli { rig: &rig, metrics };
    let (report, p) = cli.job(&["init"]);
    let s = &report["schemas"][0];
    assert_succeeded("init", &p);
    assert_eq!(
        written(&p, "init"),
        (
            s["rows"].as_f64().unwrap(),
            files_of(&s["files"]),
            s["bytes"].as_f64().unwrap()
        )
    );
    assert!(s["rows"].as_u64().unwrap() >= 200, "{s}");
    assert_state_is_inspects(&cli, "init", &p);

    drop(cli);
    change_some(&mut rig, &mut r, 40).await;
    let cli = Cli {
        rig: &rig,
        metrics: dir.path().join("lakecdc_{job}.prom"),
    };
    let (report, p) = cli.job(&["flush", "--force"]);
    let s = &report["schemas"][0];
    assert_succeeded("flush", &p);
    assert_eq!(
        written(&p, "flush"),
        (
            s["rows_exported"].as_f64().unwrap(),
            files_of(&s["files"]),
            s["bytes"].as_f64().unwrap()
        )
    );
    // The seeded rows and the 40 changed since (the same ids): all 200 were dirty.
    assert_eq!(s["rows_exported"].as_u64(), Some(200), "{s}");
    assert_state_is_inspects(&cli, "flush", &p);
    // An idle flush reports no schema, but its metrics keep every schema's series: nothing
    // written, the state as inspect sees it.
    let (report, p) = cli.job(&["flush"]);
    assert_eq!(
        report["schemas"].as_array().map(Vec::len),
        Some(0),
        "{report}"
    );
    assert_succeeded("flush", &p);
    assert_eq!(written(&p, "flush"), (0.0, 0.0, 0.0));
    assert_state_is_inspects(&cli, "flush", &p);

    let (report, p) = cli.job(&["compact", "--max-deltas", "0", "--dirty-ratio", "0"]);
    let s = &report["schemas"][0];
    assert_succeeded("compact", &p);
    assert_eq!(
        written(&p, "compact"),
        (
            s["rows_out"].as_f64().unwrap(),
            s["files_out"].as_f64().unwrap(),
            s["bytes_out"].as_f64().unwrap()
        )
    );
    assert!(s["files_out"].as_u64().unwrap() >= 1, "{s}");
    assert_state_is_inspects(&cli, "compact", &p);

    let (report, p) = cli.job(&["gc"]);
    let s = &report["schemas"][0];
    assert_succeeded("gc", &p);
    let l = [("command", "gc"), ("schema_id", "100")];
    assert_eq!(
        value(&p, "lakecdc_gc_objects_deleted", &l),
        files_of(&s["deleted"])
    );
    assert_eq!(value(&p, "lakecdc_gc_lost_deltas", &l), 0.0);
    assert_state_is_inspects(&cli, "gc", &p);

    let (report, p) = cli.job(&["verify"]);
    assert_eq!(report["schemas"][0]["outcome"], "intact", "{report}");
    assert_succeeded("verify", &p);
    assert_eq!(
        value(
            &p,
            "lakecdc_verify_divergences",
            &[("command", "verify"), ("schema_id", "100")]
        ),
        0.0
    );
    assert_state_is_inspects(&cli, "verify", &p);

    // Each job wrote its own file; no temporary file is left beside them.
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let expected: Vec<String> = ["compact", "flush", "gc", "init", "inspect", "verify"]
        .iter()
        .map(|j| format!("lakecdc_{j}.prom"))
        .collect();
    assert_eq!(names, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_run_moves_last_run_but_not_last_success() {
    let (rig, dir) = prepared().await;
    let cli = Cli {
        rig: &rig,
        metrics: dir.path().join("flush.prom"),
    };
    let (_, before) = cli.job(&["flush", "--force"]);
    let c = [("command", "flush")];
    let success = value(&before, "lakecdc_last_success_timestamp_seconds", &c);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let (code, _, err) = cli.run(&["flush", "--force", "--pg-url", UNREACHABLE], &[]);
    assert_eq!(code, 1, "{err}");
    let after = parse(&cli.file("flush"));
    assert!(value(&after, "lakecdc_last_run_timestamp_seconds", &c) > success + 1.0);
    assert_eq!(
        value(&after, "lakecdc_last_success_timestamp_seconds", &c),
        success
    );
    assert_eq!(value(&after, "lakecdc_run_exit_code", &c), 1.0);
    assert_eq!(
        value(
            &after,
            "lakecdc_run_outcome",
            &[("command", "flush"), ("outcome", "failed")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &after,
            "lakecdc_run_outcome",
            &[("command", "flush"), ("outcome", "done")]
        ),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_that_cannot_be_read_leaves_out_its_lake_samples_not_the_backlog() {
    // docs/hazards.md L97: one unreadable manifest dropped every schema's dirty-row samples,
    // so the alert on a growing backlog could not fire while flush was failing.
    let (mut rig, dir) = prepared().await;
    let cli = Cli {
        rig: &rig,
        metrics: dir.path().join("flush.prom"),
    };
    cli.job(&["flush", "--force"]);
    let manifest = cli.lake().join("manifest/100.json");
    std::fs::write(&manifest, b"{ not a manifest").unwrap();
    let mut r = Rng::new(7011);
    change_some(&mut rig, &mut r, 5).await;
    let cli = Cli {
        rig: &rig,
        metrics: dir.path().join("flush.prom"),
    };
    let (code, _, err) = cli.run(&["flush", "--force"], &[]);
    assert_ne!(code, 0, "{err}");
    let p = parse(&cli.file("flush"));
    let customer = [("schema", "customer")];
    assert!(value(&p, "lakecdc_dirty_rows", &customer) >= 5.0, "{p:?}");
    assert!(value(&p, "lakecdc_oldest_dirty_age_seconds", &customer) >= 0.0);
    let lake_files = p.get("lakecdc_lake_files").cloned().unwrap_or_default();
    assert!(
        !lake_files
            .iter()
            .any(|(l, _)| l.get("schema").map(String::as_str) == Some("customer")),
        "{lake_files:?}"
    );
}

/// A test Pushgateway on a local port: records each request and answers `status`.
fn pushgateway(status: u16) -> (String, Arc<Mutex<Vec<Request>>>) {
    recording_server(format!(
        "HTTP/1.1 {status} X\r\ncontent-length: 4\r\nconnection: close\r\n\r\nnope"
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushgateway_receives_the_same_metrics() {
    let (rig, dir) = prepared().await;
    let (url, got) = pushgateway(200);
    let cli = Cli {
        rig: &rig,
        metrics: dir.path().join("{job}.prom"),
    };
    let env = [("LAKECDC_PUSHGATEWAY", url.as_str())];
    let (code, _, err) = cli.run(&["flush", "--force", "--metrics-instance", "host-1"], &env);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = cli.run(
        &[
            "flush",
            "--force",
            "--metrics-instance",
            "host-1",
            "--pg-url",
            UNREACHABLE,
        ],
        &env,
    );
    assert_eq!(code, 1, "{err}");
    let got = got.lock().unwrap().clone();
    assert_eq!(got.len(), 2, "{got:?}");
    let path = "/metrics/job/lakecdc_flush/instance/host-1";
    assert_eq!(
        (got[0].method.as_str(), got[0].path.as_str()),
        ("PUT", path)
    );
    assert!(
        got[0]
            .header("content-type")
            .unwrap_or_default()
            .starts_with("text/plain; version=0.0.4"),
        "{:?}",
        got[0]
    );
    let pushed = parse(std::str::from_utf8(&got[0].body).unwrap());
    let c = [("command", "flush")];
    assert_eq!(value(&pushed, "lakecdc_run_exit_code", &c), 0.0);
    assert_eq!(
        value(
            &pushed,
            "lakecdc_schema_rows_exported",
            &[("schema_id", "100")]
        ),
        200.0
    );
    assert!(pushed.contains_key("lakecdc_last_success_timestamp_seconds"));
    // The failure only updates what it sends: the Pushgateway keeps the last success.
    assert_eq!(
        (got[1].method.as_str(), got[1].path.as_str()),
        ("POST", path)
    );
    let failed = parse(std::str::from_utf8(&got[1].body).unwrap());
    assert_eq!(value(&failed, "lakecdc_run_exit_code", &c), 1.0);
    assert!(
        !failed.contains_key("lakecdc_last_success_timestamp_seconds"),
        "{failed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushgateway_error_is_logged_and_the_jobs_exit_code_stands() {
    let (rig, dir) = prepared().await;
    let (url, got) = pushgateway(500);
    let cli = Cli {
        rig: &rig,
        metrics: dir.path().join("{job}.prom"),
    };
    let (code, out, err) = cli.run(&["flush", "--force"], &[("LAKECDC_PUSHGATEWAY", &url)]);
    assert_eq!(code, 0, "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["schemas"][0]["rows_exported"], 200);
    assert_eq!(got.lock().unwrap().len(), 1);
    assert!(err.contains("500") && err.contains("push metrics"), "{err}");
    // The file was still written.
    let p = parse(&cli.file("flush"));
    assert_eq!(
        value(&p, "lakecdc_run_exit_code", &[("command", "flush")]),
        0.0
    );
}

#[test]
fn metrics_settings_are_checked_before_anything_runs() {
    use std::os::unix::fs::FileTypeExt;
    let run = |args: &[&str]| {
        let out = harness::bin()
            .args(args)
            .args(["--pg-url", UNREACHABLE])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["flush", "--metrics-file", "/nonexistent-dir/x/{job}.prom"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--metrics-file") && err.contains("/nonexistent-dir/x"),
        "{err}"
    );
    // `/dev/null` (a natural "no metrics") and a directory would be replaced by the rename.
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("d.prom");
    std::fs::create_dir(&sub).unwrap();
    for (path, kind) in [
        ("/dev/null", "a device"),
        (sub.to_str().unwrap(), "a directory"),
    ] {
        let (code, err) = run(&["inspect", "--metrics-file", path]);
        assert_eq!(code, Some(2), "{err}");
        assert!(
            err.contains("--metrics-file") && err.contains(path) && err.contains(kind),
            "{err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    assert!(
        std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device()
    );
    assert!(sub.is_dir());
    let (code, err) = run(&["flush", "--pushgateway", "http://user:s3cret@pgw:9091"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--pushgateway") && err.contains("LAKECDC_PUSHGATEWAY"),
        "{err}"
    );
    assert!(!err.contains("s3cret"), "{err}");
    let (code, err) = run(&["flush", "--pushgateway", "pgw:9091"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--pushgateway"), "{err}");
    let (code, err) = run(&[
        "flush",
        "--pushgateway",
        "http://pgw:9091",
        "--metrics-instance",
        "a/b",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--metrics-instance"), "{err}");
}
