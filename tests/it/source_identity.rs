//! Source identity (docs/design.md §10): the first writer records the database in the
//! manifest; flush, init, compact and gc from another database refuse the lake with one line
//! naming both, writing nothing and leaving the rows dirty; `--adopt-source` takes it over.

use lakecdc::config::Tables;
use lakecdc::job::Context;
use lakecdc::store::ObjectStore;

use crate::support::harness::{self, TestDb};
use crate::support::oracle;
use crate::support::rig::{LakeKind, rig};
use crate::support::writer::{Customer, Rng, Writer};

const MANIFEST: &str = "manifest/100.json";

#[tokio::test]
async fn a_lake_refuses_writers_of_another_database_unless_adopted() {
    let mut a = rig(LakeKind::S3).await;
    let mut r = Rng::new(5);
    a.seed(30, &mut r).await;
    assert!(!a.flush().await.failed());
    let m = oracle::manifest_json(a.store.as_ref(), MANIFEST)
        .await
        .unwrap();
    let db_a = a.db.url.rsplit_once('/').unwrap().1.to_string();
    assert_eq!(m["source"]["database"], db_a.as_str(), "{m}");
    assert!(
        m["source"]["system_identifier"]
            .as_str()
            .unwrap()
            .parse::<i64>()
            .is_ok(),
        "{m}"
    );

    // Database B: a fresh one with the same schema and rows to flush.
    let b = TestDb::new().await;
    lakecdc::init_db::run(
        &b.connector(),
        &Tables::default(),
        Some(&harness::examples_dir()),
        false,
    )
    .await
    .unwrap();
    let mut wb = Writer::new(b.client().await, 100).await;
    for _ in 0..7 {
        wb.create(r.uuid(), Customer::random(&mut r)).await;
    }
    let db_b = b.url.rsplit_once('/').unwrap().1.to_string();
    let ctx_b = Context {
        connector: b.connector(),
        ..a.ctx.clone()
    };
    let writes = a.store.writes().len();
    let before = a.store.get_bytes(MANIFEST).await.unwrap().bytes;

    // flush: fails naming both, writes nothing, rows stay dirty.
    let report = lakecdc::flush::run(&ctx_b, &a.opts).await.unwrap();
    assert!(report.failed(), "{report:?}");
    let reason = report.schemas[0].reason.clone().unwrap();
    assert!(
        reason.contains(&db_a) && reason.contains(&db_b) && reason.contains("--adopt-source"),
        "{reason}"
    );
    assert_eq!(oracle::dirty(&wb).await.len(), 7);
    // compact and init refuse too; gc refuses the prefix.
    let compact = lakecdc::compact::run(
        &ctx_b,
        &lakecdc::compact::CompactOptions {
            schemas: vec!["customer".into()],
            work_dir: a.opts.work_dir.clone(),
            max_deltas: 0,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let c = &compact.schemas[0];
    assert_eq!(c.outcome, lakecdc::compact::Outcome::Failed, "{c:?}");
    assert!(c.error.as_ref().unwrap().contains(&db_b), "{c:?}");
    let init = lakecdc::init::run(
        &ctx_b,
        &lakecdc::init::InitOptions {
            schemas: vec!["customer".into()],
            replace_delta: true,
            work_dir: a.opts.work_dir.clone(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_ne!(init.exit_code(), 0, "{init:?}");
    let gc = lakecdc::gc::run(
        &ctx_b,
        &lakecdc::gc::GcOptions {
            schemas: vec!["customer".into()],
            grace: std::time::Duration::from_secs(900),
            dry_run: false,
            repair: false,
            settle_rows: lakecdc::gc::SETTLE_ROWS,
        },
    )
    .await
    .unwrap();
    assert_eq!(
        gc.schemas[0].outcome,
        Some(lakecdc::gc::Outcome::Refused),
        "{gc:?}"
    );
    assert_eq!(gc.exit_code(), 3);
    // inspect says so, and shows no plan the jobs would refuse (docs/hazards.md L108).
    let inspected =
        crate::support::rig::inspect_in(&ctx_b, &a.opts, &["customer".to_string()]).await;
    let s = &inspected.schemas[0];
    let refused = s.refused.as_deref().unwrap_or_default();
    assert!(refused.contains(&db_a) && refused.contains(&db_b), "{s:?}");
    assert!(
        !s.flush_would_run && s.flush_reason.starts_with("refused: "),
        "{s:?}"
    );
    assert!(s.compaction.is_none(), "{s:?}");
    assert!(inspected.to_text().contains("REFUSED"));
    assert_eq!(
        a.store.writes().len(),
        writes,
        "nothing written to the lake"
    );
    assert_eq!(a.store.get_bytes(MANIFEST).await.unwrap().bytes, before);

    // Adopted: the flush proceeds and the manifest names B from now on.
    let adopted = Context {
        adopt_source: true,
        ..ctx_b.clone()
    };
    let report = lakecdc::flush::run(&adopted, &a.opts).await.unwrap();
    assert!(!report.failed(), "{report:?}");
    assert_eq!(report.schemas[0].rows_marked, 7);
    assert!(oracle::dirty(&wb).await.is_empty());
    let m = oracle::manifest_json(a.store.as_ref(), MANIFEST)
        .await
        .unwrap();
    assert_eq!(m["source"]["database"], db_b.as_str(), "{m}");
    // And A is now the foreign one.
    a.writer.create(r.uuid(), Customer::random(&mut r)).await;
    let report = a.flush().await;
    assert!(report.failed(), "{report:?}");
    assert!(
        report.schemas[0]
            .reason
            .as_ref()
            .unwrap()
            .contains("--adopt-source")
    );
}
