//! The rig most integration tests stand on: one fresh database with the example schemas and a
//! writer, a lake (S3 bucket or local directory) behind a fault-injecting store, and the job
//! context and flush options over them.

use std::sync::Arc;
use std::time::Duration;

use lakecdc::clock::SystemClock;
use lakecdc::config::Tables;
use lakecdc::flush::{Context, FlushHooks, FlushOptions, FlushReport};
use lakecdc::lake::{Lake, Layout};
use lakecdc::shutdown::Shutdown;
use lakecdc::store::ObjectStore;
use lakecdc::store::fault::FaultStore;
use lakecdc::store::local::LocalStore;

use super::harness::{self, TestDb};
use super::oracle;
use super::writer::{Customer, Rng, Writer};
use uuid::Uuid;

const CUSTOMER: i16 = 100;
const MANIFEST: &str = "manifest/100.json";

pub struct Rig {
    pub db: TestDb,
    pub writer: Writer,
    pub store: Arc<FaultStore>,
    pub ctx: Context,
    pub opts: FlushOptions,
    /// The work directory (local lakes and Parquet files live in it).
    pub work: tempfile::TempDir,
    /// The S3 bucket of an S3 lake, deleted when the rig is.
    _bucket: Option<harness::TestBucket>,
}

pub enum LakeKind {
    S3,
    Local,
}

pub async fn rig(kind: LakeKind) -> Rig {
    let db = harness::examples_db().await;
    let work = tempfile::tempdir().unwrap();
    let (inner, bucket): (Arc<dyn ObjectStore>, _) = match kind {
        LakeKind::S3 => {
            let bucket = harness::s3_bucket().await;
            (bucket.clone(), Some(bucket))
        }
        LakeKind::Local => {
            let local = LocalStore::open(work.path().join("lake")).unwrap();
            (Arc::new(local), None)
        }
    };
    let store = Arc::new(FaultStore::new(inner));
    let ctx = Context {
        connector: db.connector(),
        tables: Tables::default(),
        schema_dir: Some(harness::examples_dir()),
        lake: Lake {
            store: store.clone(),
            layout: Layout::new("", "data", "manifest/{schema_id}.json").unwrap(),
        },
        clock: Arc::new(SystemClock),
        shutdown: Shutdown::new(),
        adopt_source: false,
        lock_wait: std::time::Duration::ZERO,
    };
    let opts = FlushOptions {
        force: true,
        batch_size: 40,
        work_dir: work.path().to_path_buf(),
        ..FlushOptions::default()
    };
    let writer = Writer::new(db.client().await, CUSTOMER).await;
    Rig {
        db,
        writer,
        store,
        ctx,
        opts,
        work,
        _bucket: bucket,
    }
}

impl Rig {
    /// A second writer session on the rig's database with a copy of its model, for hooks that
    /// write while a job runs; [`Rig::take_model`] brings its writes back.
    pub async fn second_writer(&self) -> Arc<tokio::sync::Mutex<Writer>> {
        let mut w = Writer::new(self.db.client().await, self.writer.schema_id).await;
        w.rows = self.writer.rows.clone();
        Arc::new(tokio::sync::Mutex::new(w))
    }

    /// Takes the model (rows and hard deletes) of a [`Rig::second_writer`] after its writes.
    pub async fn take_model(&mut self, second: &tokio::sync::Mutex<Writer>) {
        let w = second.lock().await;
        self.writer.rows = w.rows.clone();
        self.writer.deleted = w.deleted.clone();
    }

    /// The context of the lake jobs (compact, gc, inspect, verify) over this rig.
    pub fn job_context(&self) -> lakecdc::job::Context {
        lakecdc::job::Context {
            shutdown: Default::default(),
            ..self.ctx.clone()
        }
    }

    /// `inspect` of every schema with the rig's flush thresholds and compact's defaults.
    pub async fn inspect(&self) -> lakecdc::inspect::InspectReport {
        inspect_in(&self.job_context(), &self.opts, &[]).await
    }

    /// gc over the customer schema with a 15-minute grace, on a manual clock the test moves,
    /// keeping no manifest history: its grace alone decides when a retired file goes
    /// (tests/it/history.rs covers the retention, with
    /// [`Rig::gc_on_a_manual_clock_keeping_history`]).
    pub fn gc_on_a_manual_clock(
        &self,
    ) -> (
        Arc<lakecdc::clock::ManualClock>,
        lakecdc::job::Context,
        lakecdc::gc::GcOptions,
    ) {
        self.gc_on_a_manual_clock_keeping_history(Duration::ZERO)
    }

    /// As [`Rig::gc_on_a_manual_clock`], keeping manifest history for `retention`.
    pub fn gc_on_a_manual_clock_keeping_history(
        &self,
        retention: Duration,
    ) -> (
        Arc<lakecdc::clock::ManualClock>,
        lakecdc::job::Context,
        lakecdc::gc::GcOptions,
    ) {
        use lakecdc::clock::Clock;
        let clock = Arc::new(lakecdc::clock::ManualClock::new(SystemClock.now_ms()));
        let mut ctx = lakecdc::job::Context {
            clock: clock.clone(),
            ..self.job_context()
        };
        ctx.lake.layout = ctx.lake.layout.with_history_retention(retention);
        let opts = lakecdc::gc::GcOptions {
            schemas: vec!["customer".into()],
            grace: Duration::from_secs(900),
            dry_run: false,
            repair: false,
            settle_rows: lakecdc::gc::SETTLE_ROWS,
        };
        (clock, ctx, opts)
    }

    pub async fn flush(&self) -> FlushReport {
        lakecdc::flush::run(&self.ctx, &self.opts).await.unwrap()
    }

    pub async fn flush_with(&self, hooks: &FlushHooks) -> FlushReport {
        lakecdc::flush::run_with_hooks(&self.ctx, &self.opts, hooks)
            .await
            .unwrap()
    }

    pub async fn seed(&mut self, n: usize, r: &mut Rng) -> Vec<Uuid> {
        let mut ids = Vec::new();
        for _ in 0..n {
            let id = r.uuid();
            self.writer.create(id, Customer::random(r)).await;
            ids.push(id);
        }
        ids
    }

    pub async fn assert_oracle(&self) -> (usize, usize) {
        oracle::assert_matches(&self.writer, self.store.as_ref(), MANIFEST).await
    }

    pub async fn change_log(&self) -> Vec<(Uuid, i64, i64, Option<i64>)> {
        self.writer
            .client
            .query(
                "SELECT row_id, flushed_at, changed_at, deleted_at FROM change_log ORDER BY 1, 2",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect()
    }

    pub async fn keys(&self, prefix: &str) -> Vec<String> {
        self.store
            .list(prefix)
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.key)
            .collect()
    }

    pub async fn listed(&self) -> Vec<String> {
        match oracle::manifest_json(self.store.as_ref(), MANIFEST).await {
            None => Vec::new(),
            Some(m) => m["files"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["path"].as_str().unwrap().to_string())
                .collect(),
        }
    }

    pub fn hook(
        f: impl Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync + 'static,
    ) -> lakecdc::flush::Hook {
        Arc::new(move |_, _| f())
    }
}

/// A schema directory where `customer` has gained the EAV text attribute `nickname` (id 90): a
/// column added between generations of the schema.
pub fn schema_dir_with_nickname() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(harness::examples_dir()).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let attrs = dir.path().join("customer_attributes.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&attrs).unwrap()).unwrap();
    json["nickname"] = serde_json::json!({"attributeID": 90, "valueType": "text"});
    std::fs::write(&attrs, json.to_string()).unwrap();
    dir
}

/// `inspect` of `schemas` (all when empty) in `ctx`, with `opts`' flush thresholds and
/// compact's defaults.
pub async fn inspect_in(
    ctx: &lakecdc::job::Context,
    opts: &FlushOptions,
    schemas: &[String],
) -> lakecdc::inspect::InspectReport {
    lakecdc::inspect::run(
        ctx,
        schemas,
        &opts.thresholds(),
        &lakecdc::compact::CompactOptions::default().thresholds(),
    )
    .await
    .unwrap()
}
