//! Shared test rig: one fresh PostgreSQL database and one fresh S3 bucket per test.

use std::sync::Arc;

use lakecdc::source::{Connector, PgSettings};
use lakecdc::store::ObjectStore;
use lakecdc::store::s3::{S3Options, S3Store};

/// The value of a variable the services' env file sets. Without it the whole run stops at once
/// with one line saying how to start the services (written past libtest's capture), instead
/// of every test failing on its own.
fn required_env(name: &str) -> String {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v,
        _ => {
            use std::io::Write;
            let line = format!(
                "{name} is not set: the integration tests need PostgreSQL and S3; run scripts/test.sh, or `scripts/services.sh start` and source the env file it prints\n"
            );
            let _ = std::io::stderr().write_all(line.as_bytes());
            std::process::exit(2);
        }
    }
}

/// The admin URL of the test cluster.
pub fn pg_admin_url() -> String {
    required_env("LAKECDC_TEST_PG_URL")
}

/// The S3 endpoint of the test server.
pub fn s3_endpoint() -> String {
    required_env("LAKECDC_TEST_S3_ENDPOINT")
}

/// Settings for `url` with test defaults.
pub fn pg_settings(url: &str) -> PgSettings {
    PgSettings {
        conninfo: Some(url.to_string()),
        env: Default::default(),
        application_name: "lakecdc-test".into(),
        connect_timeout: std::time::Duration::from_secs(10),
        statement_timeout: std::time::Duration::from_secs(60),
    }
}

/// A fresh database on the test cluster, dropped when the test ends.
pub struct TestDb {
    /// URL of the new database.
    pub url: String,
    name: String,
}

/// Runs `work` to completion on a runtime of its own, on a thread of its own: cleanup runs in
/// `Drop`, where the test's runtime may be busy or shutting down.
fn on_own_runtime<F: std::future::Future<Output = ()> + Send + 'static>(
    work: impl FnOnce() -> F + Send + 'static,
) {
    let _ = std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            rt.block_on(work());
        }
    })
    .join();
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let (admin, name) = (pg_admin_url(), self.name.clone());
        on_own_runtime(move || async move {
            let Ok(connector) = Connector::new(&pg_settings(&admin)) else {
                return;
            };
            if let Ok(client) = connector.connect().await {
                // FORCE ends the sessions a test left open (a child process, a held lock).
                let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                if let Err(e) = client.batch_execute(&sql).await {
                    eprintln!("test cleanup: could not drop database {name}: {e}");
                }
            }
        });
    }
}

impl TestDb {
    pub async fn new() -> Self {
        let admin = pg_admin_url();
        let name = format!("t_{}", uuid::Uuid::new_v4().simple());
        let client = Connector::new(&pg_settings(&admin))
            .unwrap()
            .connect()
            .await
            .unwrap();
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let base = admin.rsplit_once('/').unwrap().0;
        Self {
            url: format!("{base}/{name}"),
            name,
        }
    }

    /// A database the test created itself at `url`, dropped like a fresh one.
    pub fn adopt(url: String) -> Self {
        let name = url.rsplit_once('/').map(|(_, n)| n.to_string());
        Self {
            name: name.unwrap_or_default(),
            url,
        }
    }

    pub fn connector(&self) -> Connector {
        Connector::new(&pg_settings(&self.url)).unwrap()
    }

    pub async fn client(&self) -> tokio_postgres::Client {
        self.connector().connect().await.unwrap()
    }
}

/// S3 options for the test server.
pub fn s3_options(bucket: &str) -> S3Options {
    let mut opts = S3Options::new(bucket);
    opts.endpoint = Some(s3_endpoint());
    opts.path_style = true;
    opts.region = Some("us-east-1".into());
    opts
}

/// A fresh bucket on the test server, emptied and deleted when the test ends.
pub struct TestBucket(Arc<S3Store>);

impl std::ops::Deref for TestBucket {
    type Target = Arc<S3Store>;

    fn deref(&self) -> &Arc<S3Store> {
        &self.0
    }
}

impl Drop for TestBucket {
    fn drop(&mut self) {
        let bucket = self.0.bucket().to_string();
        on_own_runtime(move || async move {
            let store = S3Store::connect(&s3_options(&bucket)).await;
            if let Ok(objects) = store.list("").await {
                for o in objects {
                    let _ = store.delete(&o.key).await;
                }
            }
            if let Err(e) = store.client().delete_bucket().bucket(&bucket).send().await {
                eprintln!("test cleanup: could not delete bucket {bucket}: {e}");
            }
        });
    }
}

/// A fresh bucket on the test server.
pub async fn s3_bucket() -> TestBucket {
    let bucket = format!("t-{}", &uuid::Uuid::new_v4().simple().to_string()[..20]);
    let store = S3Store::connect(&s3_options(&bucket)).await;
    store
        .client()
        .create_bucket()
        .bucket(&bucket)
        .send()
        .await
        .unwrap();
    TestBucket(Arc::new(store))
}

/// The same bucket behind a second client (an independent reader).
pub async fn s3_reader(bucket: &str) -> Arc<dyn ObjectStore> {
    Arc::new(S3Store::connect(&s3_options(bucket)).await)
}

/// Path of the built `lakecdc` binary.
pub fn bin() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_lakecdc"))
}

/// The Python with DuckDB and prometheus_client that `scripts/test.sh` installs.
pub fn python() -> std::path::PathBuf {
    std::env::var_os("LAKECDC_TEST_PYTHON").map_or_else(
        || std::path::PathBuf::from("/var/tmp/lakecdc-bench-venv/bin/python"),
        std::path::PathBuf::from,
    )
}

/// Runs the Python `script` with `stdin` as its standard input; its output.
pub fn run_python(script: &str, stdin: &[u8]) -> std::process::Output {
    use std::io::Write;
    let mut child = std::process::Command::new(python())
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e} (scripts/test.sh installs it)", python().display()));
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// psql from the PostgreSQL installation `scripts/services.sh` uses (or the one on PATH).
pub fn psql() -> std::path::PathBuf {
    let installed = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin/psql"))
        .find(|p| p.exists());
    installed.unwrap_or_else(|| "psql".into())
}

/// Applies the SQL script `sql` to the database at `url` with psql, as a migration would;
/// panics with psql's message when it fails.
pub fn apply_with_psql(url: &str, sql: &str) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), sql).unwrap();
    let out = std::process::Command::new(psql())
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f"])
        .arg(file.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "psql: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fresh database with the source tables and the example schemas registered (ids 100, 101).
pub async fn examples_db() -> TestDb {
    let db = TestDb::new().await;
    lakecdc::init_db::run(
        &db.connector(),
        &lakecdc::config::Tables::default(),
        Some(&examples_dir()),
        false,
    )
    .await
    .unwrap();
    db
}

/// The example schema directory.
pub fn examples_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/schemas")
}

/// A connection of `connector` that reads everything through tokio-postgres (no COPY tap),
/// to compare with a tapped one.
pub async fn untapped(connector: &Connector) -> lakecdc::source::connect::TappedClient {
    lakecdc::source::connect::TappedClient {
        client: connector.connect().await.unwrap(),
        tap: lakecdc::source::copy_tap::CopyTap::default(),
    }
}

/// A connection to `url`.
pub async fn pg_client(url: &str) -> tokio_postgres::Client {
    Connector::new(&pg_settings(url))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Ends the session holding schema `schema_id`'s lock on the database of `url`, as an
/// administrator would (`pg_terminate_backend`), and returns its pid once the server has let it
/// go and a moment has passed for the run's client to see its connection close.
pub async fn end_lock_session(url: &str, schema_id: i16) -> i32 {
    let admin = pg_client(url).await;
    let pid: i32 = admin
        .query_one(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND objsubid = 2 AND objid = $1::int4::oid AND database = \
             (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[&i32::from(schema_id)],
        )
        .await
        .unwrap()
        .get(0);
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    while admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
        > 0
    {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    pid
}

/// Runs `job` with its first `op` on a key holding `key` paused, ends the session holding
/// schema `schema_id`'s lock meanwhile ([`end_lock_session`]), then lets it go on: a job that
/// made its plan under the lock and is about to act on it.
pub async fn with_lock_session_ended<T: Send + 'static>(
    store: &lakecdc::store::fault::FaultStore,
    url: &str,
    schema_id: i16,
    (op, key): (lakecdc::store::fault::Op, &str),
    job: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    use lakecdc::store::fault::{Action, Gate};
    let gate = Gate::new();
    store.arm(op, Some(key), 1, Action::Pause(gate.clone()));
    let run = tokio::spawn(job);
    tokio::time::timeout(std::time::Duration::from_secs(30), gate.wait_reached())
        .await
        .unwrap_or_else(|_| panic!("the job never reached its {op:?} of {key}"));
    end_lock_session(url, schema_id).await;
    gate.release();
    run.await.unwrap()
}

/// Asserts that a schema's failure `reason` names its lost lock.
pub fn assert_lock_lost(reason: Option<&str>, schema_id: i16) {
    let want = format!("the lock of schema {schema_id} was lost");
    assert!(
        reason.is_some_and(|r| r.contains(&want)),
        "{reason:?} does not say {want:?}"
    );
}

/// The TLS and authentication fixtures of the test cluster (see `scripts/services.sh`).
pub struct PgFixtures {
    /// Loopback address the server listens on.
    pub host: String,
    /// Its port.
    pub port: u16,
    /// The CA that signed the server certificate (valid for DNS:localhost only).
    pub ca: String,
    /// A CA unrelated to the server certificate.
    pub other_ca: String,
    /// A superuser that must authenticate with `password` (SCRAM).
    pub password_user: String,
    /// Its password (contains a space, a single quote and a backslash).
    pub password: String,
    /// A role the server refuses without TLS.
    pub tls_user: String,
}

/// The fixtures of the test cluster.
pub fn pg_fixtures() -> PgFixtures {
    PgFixtures {
        host: required_env("LAKECDC_TEST_PG_HOST"),
        port: required_env("LAKECDC_TEST_PG_PORT").parse().unwrap(),
        ca: required_env("LAKECDC_TEST_PG_CA"),
        other_ca: required_env("LAKECDC_TEST_PG_OTHER_CA"),
        password_user: required_env("LAKECDC_TEST_PG_PASSWORD_USER"),
        password: required_env("LAKECDC_TEST_PG_PASSWORD"),
        tls_user: required_env("LAKECDC_TEST_PG_TLS_USER"),
    }
}

/// Settings with no connection string: only the given `PG*` variables.
pub fn pg_env_settings(env: &[(&str, &str)]) -> PgSettings {
    PgSettings {
        conninfo: None,
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..pg_settings("")
    }
}
