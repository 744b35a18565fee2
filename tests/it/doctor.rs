//! `lakecdc doctor` on the real services: every check passes on a healthy setup, each broken
//! piece fails exactly its own check (with a fix, exit 1), and no run leaves anything under
//! `_doctor/`.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use lakecdc::clock::SystemClock;
use lakecdc::config::Tables;
use lakecdc::doctor::{DoctorInputs, DoctorReport, Kind, Status};
use lakecdc::lake::Lake;
use lakecdc::source::Connector;
use lakecdc::store::fault::{Action, Op};
use lakecdc::store::s3::S3Store;
use lakecdc::store::{
    Download, GetResult, ObjectMeta, ObjectStore, PutMode, PutResult, StoreError,
};

use crate::support::harness;
use crate::support::rig::{LakeKind, Rig, rig};
use crate::support::writer::Rng;

/// A test-only store that ignores create-if-absent: `PutMode::Create` overwrites, as a store
/// without `If-None-Match` support does. Everything else goes to the inner store.
#[derive(Debug)]
struct CreateIgnoringStore(Arc<dyn ObjectStore>);

#[async_trait]
impl ObjectStore for CreateIgnoringStore {
    fn describe(&self) -> String {
        self.0.describe()
    }

    async fn put_file(&self, key: &str, path: &Path) -> Result<PutResult, StoreError> {
        self.0.put_file(key, path).await
    }

    async fn put_parts(
        &self,
        key: &str,
        parts: lakecdc::store::stream::Parts,
    ) -> Result<PutResult, StoreError> {
        self.0.put_parts(key, parts).await
    }

    async fn put_bytes(
        &self,
        key: &str,
        body: Bytes,
        mode: PutMode,
    ) -> Result<PutResult, StoreError> {
        let mode = match mode {
            PutMode::Create => PutMode::Overwrite,
            m => m,
        };
        self.0.put_bytes(key, body, mode).await
    }

    async fn get_bytes_within(&self, key: &str, limit: u64) -> Result<GetResult, StoreError> {
        self.0.get_bytes_within(key, limit).await
    }

    async fn get_to_file_within(
        &self,
        key: &str,
        path: &Path,
        limit: u64,
    ) -> Result<Download, StoreError> {
        self.0.get_to_file_within(key, path, limit).await
    }

    async fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Bytes, StoreError> {
        self.0.get_range(key, offset, len).await
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        self.0.head(key).await
    }

    async fn copy(&self, from: &str, to: &str) -> Result<(), StoreError> {
        self.0.copy(from, to).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.0.delete(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StoreError> {
        self.0.list(prefix).await
    }
}

/// A rig with the example schemas registered and one flush done (so the customer schema has a
/// manifest naming this database and a claimed data prefix).
async fn flushed_rig() -> Rig {
    let mut rig = rig(LakeKind::S3).await;
    rig.seed(20, &mut Rng::new(41)).await;
    rig.flush().await;
    rig
}

/// Doctor's inputs over the rig, with `connector` and `store`.
fn inputs(rig: &Rig, connector: Connector, store: Arc<dyn ObjectStore>) -> DoctorInputs {
    DoctorInputs {
        connector,
        tables: Tables::default(),
        schema_dir: Some(harness::examples_dir()),
        schemas: Vec::new(),
        lake: Ok(Lake {
            store,
            layout: rig.ctx.lake.layout.clone(),
        }),
        clock: Arc::new(SystemClock),
        adopt_source: false,
    }
}

async fn doctor(inputs: &DoctorInputs) -> DoctorReport {
    lakecdc::doctor::run(inputs).await
}

/// Every check is `ok` but those in `expected`, which have the status given; a check that is
/// not ok has a fix when it warns or fails; the exit code follows.
fn assert_checks(report: &DoctorReport, expected: &[(Kind, Status)]) {
    let text = report.to_text();
    assert_eq!(report.checks.len(), Kind::ALL.len(), "{text}");
    for (c, kind) in report.checks.iter().zip(Kind::ALL) {
        assert_eq!(c.kind, kind, "{text}");
        let want = expected
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(Status::Ok, |(_, s)| *s);
        assert_eq!(c.status, want, "{}: {text}", kind.title());
        if matches!(c.status, Status::Warn | Status::Fail) {
            assert!(!c.fix.is_empty(), "{} has no fix: {text}", kind.title());
        }
    }
    let failed = expected.iter().any(|(_, s)| *s == Status::Fail);
    assert_eq!(report.exit_code(), i32::from(failed), "{text}");
}

/// Nothing is left under the probe prefix of the rig's bucket.
async fn assert_no_probe_left(rig: &Rig) {
    let left = rig.store.list("_doctor/").await.unwrap();
    assert!(left.is_empty(), "left under _doctor/: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_check_passes_on_a_healthy_setup_library_and_cli() {
    let rig = flushed_rig().await;
    let report = doctor(&inputs(&rig, rig.db.connector(), rig.store.clone())).await;
    assert_checks(&report, &[]);
    let ownership = report.get(Kind::Ownership).unwrap();
    assert!(
        ownership.detail.contains("2 schemas"),
        "{}",
        ownership.detail
    );
    assert_no_probe_left(&rig).await;
    // The probe wrote, read and deleted only under _doctor/.
    let keys: Vec<String> = rig.store.calls().into_iter().map(|c| c.key).collect();
    let probe_writes: Vec<_> = rig
        .store
        .writes()
        .into_iter()
        .filter(|c| c.key.starts_with("_doctor/"))
        .collect();
    assert!(probe_writes.len() >= 5, "{keys:?}");

    // Once through the binary: exit 0, every line ok.
    let bucket = rig.store.describe().trim_start_matches("s3://").to_string();
    let url = rig.db.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        harness::bin()
            .args(["doctor", "--json", "--pg-url", &url])
            .args(["--lake", &format!("s3://{bucket}")])
            .args(["--s3-path-style", "--s3-endpoint", &harness::s3_endpoint()])
            .arg("--schema-dir")
            .arg(harness::examples_dir())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let checks = json["checks"].as_array().unwrap();
    assert_eq!(checks.len(), Kind::ALL.len(), "{stdout}");
    for (c, kind) in checks.iter().zip(Kind::ALL) {
        assert_eq!(c["check"], kind.title(), "{stdout}");
        assert_eq!(c["status"], "ok", "{stdout}");
        assert!(c["detail"].as_str().is_some_and(|d| !d.is_empty()), "{c}");
    }
    assert_no_probe_left(&rig).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_update_on_change_log_fails_the_privileges_check() {
    let rig = flushed_rig().await;
    let role = format!(
        "t_doctor_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let admin = harness::pg_client(&harness::pg_admin_url()).await;
    admin
        .batch_execute(&format!("CREATE ROLE {role} LOGIN"))
        .await
        .unwrap();
    let db = rig.db.client().await;
    db.batch_execute(&format!(
        "GRANT SELECT ON schema_registry, entity_main, eav_data, change_log TO {role}"
    ))
    .await
    .unwrap();
    let url = rig.db.url.replacen("postgres@", &format!("{role}@"), 1);
    assert_ne!(url, rig.db.url, "the test URL names the postgres user");
    let connector = Connector::new(&harness::pg_settings(&url)).unwrap();
    let report = doctor(&inputs(&rig, connector, rig.store.clone())).await;
    assert_checks(&report, &[(Kind::Privileges, Status::Fail)]);
    let c = report.get(Kind::Privileges).unwrap();
    assert!(
        c.detail.contains("no UPDATE on \"change_log\""),
        "{}",
        c.detail
    );
    assert!(
        c.fix
            .contains(&format!("GRANT UPDATE ON \"change_log\" TO \"{role}\"")),
        "{}",
        c.fix
    );
    assert_no_probe_left(&rig).await;
    drop(report);
    // With what the jobs need, a role that cannot repair is warned about (its repairs would
    // fail only after their whole comparison); with that too, all is ok.
    db.batch_execute(&format!("GRANT UPDATE ON change_log TO {role}"))
        .await
        .unwrap();
    let connector = Connector::new(&harness::pg_settings(&url)).unwrap();
    let report = doctor(&inputs(&rig, connector, rig.store.clone())).await;
    assert_checks(&report, &[(Kind::Privileges, Status::Warn)]);
    let c = report.get(Kind::Privileges).unwrap();
    assert!(
        c.detail.contains("requeue")
            && c.detail.contains("no UPDATE on \"entity_main\"")
            && c.detail.contains("no INSERT on \"change_log\""),
        "{}",
        c.detail
    );
    db.batch_execute(&format!(
        "GRANT UPDATE ON entity_main TO {role}; GRANT INSERT ON change_log TO {role}"
    ))
    .await
    .unwrap();
    let connector = Connector::new(&harness::pg_settings(&url)).unwrap();
    let report = doctor(&inputs(&rig, connector, rig.store.clone())).await;
    assert_checks(&report, &[]);
    drop(report);
    db.batch_execute(&format!("DROP OWNED BY {role}"))
        .await
        .unwrap();
    if let Err(e) = admin.batch_execute(&format!("DROP ROLE {role}")).await {
        eprintln!("test cleanup: could not drop role {role}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_change_log_index_fails_its_check() {
    let rig = flushed_rig().await;
    rig.db
        .client()
        .await
        .batch_execute("DROP INDEX change_log_dirty_idx")
        .await
        .unwrap();
    let report = doctor(&inputs(&rig, rig.db.connector(), rig.store.clone())).await;
    assert_checks(&report, &[(Kind::ChangeLogIndex, Status::Fail)]);
    let c = report.get(Kind::ChangeLogIndex).unwrap();
    assert!(c.fix.contains("init-db"), "{}", c.fix);
    assert!(c.fix.contains("CREATE INDEX"), "{}", c.fix);
    assert_no_probe_left(&rig).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_of_every_slot_warns_with_its_migration_and_a_foreign_predicate_fails() {
    // docs/hazards.md L70: an index without `WHERE flushed_at = 0` serves flush but grows
    // with every flushed slot; one with another predicate cannot serve flush at all.
    let rig = flushed_rig().await;
    let client = rig.db.client().await;
    client
        .batch_execute(
            "DROP INDEX change_log_dirty_idx; \
             CREATE INDEX old_cl_idx ON change_log (schema_id, flushed_at, changed_at)",
        )
        .await
        .unwrap();
    let report = doctor(&inputs(&rig, rig.db.connector(), rig.store.clone())).await;
    assert_checks(&report, &[(Kind::ChangeLogIndex, Status::Warn)]);
    let c = report.get(Kind::ChangeLogIndex).unwrap();
    assert!(c.detail.contains("public.old_cl_idx "), "{}", c.detail);
    assert_eq!(
        c.fix,
        "index the dirty slots only, without blocking writers: CREATE INDEX CONCURRENTLY \
         \"change_log_dirty_slots_idx\" ON \"change_log\" (schema_id, flushed_at, changed_at) \
         WHERE flushed_at = 0; DROP INDEX CONCURRENTLY public.old_cl_idx;"
    );
    // The fix, run as printed, gives a passing check.
    for statement in c.fix.split_once(": ").unwrap().1.split(';') {
        if !statement.trim().is_empty() {
            client.batch_execute(statement).await.unwrap();
        }
    }
    let report = doctor(&inputs(&rig, rig.db.connector(), rig.store.clone())).await;
    assert_checks(&report, &[]);

    client
        .batch_execute(
            "DROP INDEX change_log_dirty_slots_idx; \
             CREATE INDEX odd_idx ON change_log (schema_id, flushed_at) WHERE flushed_at > 0",
        )
        .await
        .unwrap();
    let report = doctor(&inputs(&rig, rig.db.connector(), rig.store.clone())).await;
    assert_checks(&report, &[(Kind::ChangeLogIndex, Status::Fail)]);
    assert_no_probe_left(&rig).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registered_schema_without_metadata_fails_the_schema_dir_check() {
    let rig = flushed_rig().await;
    rig.db
        .client()
        .await
        .batch_execute("INSERT INTO schema_registry (schema_name, schema_id) VALUES ('ghost', 900)")
        .await
        .unwrap();
    let report = doctor(&inputs(&rig, rig.db.connector(), rig.store.clone())).await;
    assert_checks(&report, &[(Kind::SchemaDir, Status::Fail)]);
    let c = report.get(Kind::SchemaDir).unwrap();
    assert!(c.detail.contains("\"ghost\""), "{}", c.detail);
    assert!(c.detail.contains("ghost_attributes.json"), "{}", c.detail);
    assert!(c.fix.contains("_attributes.json"), "{}", c.fix);

    // Without --schema-dir the check cannot run: a warning, exit 0.
    let mut no_dir = inputs(&rig, rig.db.connector(), rig.store.clone());
    no_dir.schema_dir = None;
    let report = doctor(&no_dir).await;
    assert_checks(&report, &[(Kind::SchemaDir, Status::Warn)]);
    assert_no_probe_left(&rig).await;
}

/// docs/hazards.md R7: two registered schemas whose reader views would be one (names that
/// differ only in case) are a warning: the writers serve both, `query` and `view` refuse them
/// together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemas_one_view_name_apart_warn_in_the_schema_dir_check() {
    let rig = flushed_rig().await;
    rig.db
        .client()
        .await
        .batch_execute(
            "INSERT INTO schema_registry (schema_name, schema_id) VALUES ('CUSTOMER', 901)",
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(harness::examples_dir()).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), dir.path().join(f.file_name())).unwrap();
    }
    std::fs::copy(
        harness::examples_dir().join("customer_attributes.json"),
        dir.path().join("CUSTOMER_attributes.json"),
    )
    .unwrap();
    let mut with_dir = inputs(&rig, rig.db.connector(), rig.store.clone());
    with_dir.schema_dir = Some(dir.path().to_path_buf());
    let report = doctor(&with_dir).await;
    assert_checks(&report, &[(Kind::SchemaDir, Status::Warn)]);
    let c = report.get(Kind::SchemaDir).unwrap();
    assert!(
        c.detail.contains("\"customer\" (id 100)") && c.detail.contains("\"CUSTOMER\" (id 901)"),
        "{}",
        c.detail
    );
    assert!(c.fix.contains("rename"), "{}", c.fix);
    assert_no_probe_left(&rig).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_accepting_create_over_an_existing_key_fails_the_conditional_writes_check() {
    let rig = flushed_rig().await;
    let check = |report: &DoctorReport| {
        assert_checks(report, &[(Kind::ConditionalWrites, Status::Fail)]);
        let c = report.get(Kind::ConditionalWrites).unwrap().clone();
        assert!(
            c.detail
                .contains("create-if-absent (If-None-Match) over an existing object was accepted"),
            "{}",
            c.detail
        );
        assert!(c.fix.contains("ignores conditional writes"), "{}", c.fix);
    };
    // The fault decorator: the probe's third put (its create-if-absent) loses its condition.
    rig.store
        .arm(Op::PutBytes, Some("_doctor/"), 3, Action::IgnoreCondition);
    check(&doctor(&inputs(&rig, rig.db.connector(), rig.store.clone())).await);
    assert_no_probe_left(&rig).await;

    // A store that never honours create-if-absent.
    let ignoring = Arc::new(CreateIgnoringStore(rig.store.clone()));
    check(&doctor(&inputs(&rig, rig.db.connector(), ignoring)).await);
    assert_no_probe_left(&rig).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lake_whose_unfinished_uploads_cannot_be_listed_warns_in_the_round_trip() {
    let rig = flushed_rig().await;
    rig.store
        .arm(Op::ListUnfinished, Some("_doctor/"), 1, Action::Fail);
    let report = doctor(&inputs(&rig, rig.db.connector(), rig.store.clone())).await;
    assert_checks(&report, &[(Kind::RoundTrip, Status::Warn)]);
    let c = report.get(Kind::RoundTrip).unwrap();
    assert!(c.detail.contains("unfinished uploads"), "{}", c.detail);
    assert!(c.fix.contains("s3:ListBucketMultipartUploads"), "{}", c.fix);
    assert!(c.fix.contains("lifecycle rule"), "{}", c.fix);
    assert_no_probe_left(&rig).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bucket_fails_the_lake_check_and_skips_what_needs_the_lake() {
    let rig = flushed_rig().await;
    let bucket = format!(
        "t-missing-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let missing = Arc::new(S3Store::connect(&harness::s3_options(&bucket)).await);
    let report = doctor(&inputs(&rig, rig.db.connector(), missing)).await;
    assert_checks(
        &report,
        &[
            (Kind::LakeReachable, Status::Fail),
            (Kind::RoundTrip, Status::Skip),
            (Kind::ConditionalWrites, Status::Skip),
            (Kind::Ownership, Status::Skip),
        ],
    );
    let c = report.get(Kind::LakeReachable).unwrap();
    assert!(c.detail.contains(&bucket), "{}", c.detail);
    assert!(
        c.fix.contains(&format!("create bucket \"{bucket}\"")),
        "{}",
        c.fix
    );
    // PostgreSQL's clock was still compared.
    let skew = report.get(Kind::ClockSkew).unwrap();
    assert!(skew.detail.contains("store not checked"), "{}", skew.detail);
    assert_no_probe_left(&rig).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lake_written_from_another_database_fails_ownership_unless_adopting() {
    let rig = flushed_rig().await;
    let other = harness::TestDb::new().await;
    lakecdc::init_db::run(
        &other.connector(),
        &Tables::default(),
        Some(&harness::examples_dir()),
        false,
    )
    .await
    .unwrap();
    let mut foreign = inputs(&rig, other.connector(), rig.store.clone());
    let report = doctor(&foreign).await;
    assert_checks(&report, &[(Kind::Ownership, Status::Fail)]);
    let c = report.get(Kind::Ownership).unwrap();
    assert!(c.detail.contains("manifest/100.json"), "{}", c.detail);
    assert!(c.fix.contains("--adopt-source"), "{}", c.fix);
    foreign.adopt_source = true;
    let report = doctor(&foreign).await;
    assert_checks(&report, &[(Kind::Ownership, Status::Warn)]);
    assert_no_probe_left(&rig).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn base_files_without_their_manifest_are_warned_about() {
    // docs/hazards.md L100: a lost manifest under a claimed prefix holding bases passed the
    // ownership check as ok ("claimed by their manifest").
    let rig = flushed_rig().await;
    let init = lakecdc::init::InitOptions {
        schemas: vec!["customer".into()],
        replace_delta: true,
        work_dir: rig.opts.work_dir.clone(),
        ..lakecdc::init::InitOptions::default()
    };
    lakecdc::init::run(&rig.ctx, &init).await.unwrap();
    let report = doctor(&inputs(&rig, rig.db.connector(), rig.store.clone())).await;
    assert_checks(&report, &[]);
    rig.store.delete("manifest/100.json").await.unwrap();
    let report = doctor(&inputs(&rig, rig.db.connector(), rig.store.clone())).await;
    assert_checks(&report, &[(Kind::Ownership, Status::Warn)]);
    let c = report.get(Kind::Ownership).unwrap();
    assert!(
        c.detail
            .contains("base files but manifest manifest/100.json does not exist"),
        "{}",
        c.detail
    );
    assert!(c.fix.contains("history"), "{}", c.fix);
    assert_no_probe_left(&rig).await;
    // inspect no longer calls the schema "never exported".
    let report = rig.inspect().await;
    let text = report.to_text();
    assert!(
        text.contains("manifest          none, but the data prefix holds"),
        "{text}"
    );
}
