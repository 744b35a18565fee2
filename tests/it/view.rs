//! `lakecdc view`: the statements it prints, run in DuckDB, read the same current state as the
//! test's own reader of the lake (which the oracle checks against PostgreSQL), over a base and
//! deltas with deletes, a delete then recreate, and soft deletes.

use std::collections::BTreeMap;

use lakecdc::compact::CompactOptions;
use lakecdc::store::ObjectStore;
use lakecdc::view::{RULE, ViewOptions, ViewReport};
use uuid::Uuid;

use crate::support::harness;
use crate::support::oracle;
use crate::support::rig::{LakeKind, Rig, rig};
use crate::support::writer::{Customer, Rng};

const MANIFEST: &str = "manifest/100.json";

async fn lake_with_base_and_deltas() -> Rig {
    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(819);
    rig.seed(150, &mut r).await;
    rig.flush().await;
    let promote = CompactOptions {
        schemas: vec!["customer".into()],
        work_dir: rig.opts.work_dir.clone(),
        max_deltas: 0,
        ..CompactOptions::default()
    };
    lakecdc::compact::run(&rig.job_context(), &promote)
        .await
        .unwrap();
    for _ in 0..2 {
        for _ in 0..40 {
            rig.writer.random_op(&mut r).await;
        }
        let ids: Vec<_> = rig.writer.rows.keys().copied().take(2).collect();
        rig.writer.hard_delete(ids[0]).await;
        rig.writer.hard_delete(ids[1]).await;
        rig.writer.create(ids[1], Customer::random(&mut r)).await;
        rig.flush().await;
    }
    rig
}

/// `view` of the `schemas` selected (all when empty).
async fn view_of(rig: &Rig, schemas: &[&str]) -> ViewReport {
    let opts = ViewOptions {
        schemas: schemas.iter().map(|s| s.to_string()).collect(),
    };
    lakecdc::view::run(&rig.job_context(), &opts).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_printed_views_read_the_current_state_in_duckdb() {
    let rig = lake_with_base_and_deltas().await;
    let (compared, dirty) = rig.assert_oracle().await;
    assert!(compared > 100 && dirty == 0, "{compared} {dirty}");
    let report = view_of(&rig, &["customer"]).await;
    assert_eq!(report.exit_code(), 0);
    let s = &report.schemas[0];
    let manifest = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
        .await
        .unwrap();
    let listed = manifest["files"].as_array().unwrap();
    assert!(listed.len() >= 3, "a base and deltas: {listed:?}");
    assert_eq!(s.version, manifest["version"].as_i64());
    assert_eq!(s.rule, RULE);
    assert_eq!(s.files.len(), listed.len());
    for (f, l) in s.files.iter().zip(listed) {
        let path = l["path"].as_str().unwrap();
        assert!(f.uri.starts_with('/') && f.uri.ends_with(path), "{}", f.uri);
        assert_eq!(Some(f.rows), l["row_count"].as_i64());
        assert_eq!(f.checksum.as_deref(), l["checksum"].as_str());
    }
    let text = report.to_text();
    assert!(
        text.starts_with(&format!(
            "-- customer (schema id 100): manifest {} version {}, {} files\n",
            s.manifest,
            s.version.unwrap(),
            listed.len()
        )),
        "{text}"
    );

    // The statements, in a DuckDB of their own.
    let sql = s.sql.clone().unwrap();
    let conn = duckdb::Connection::open_in_memory().unwrap();
    conn.execute_batch(&sql).unwrap();
    let mut stmt = conn
        .prepare("SELECT row_id::VARCHAR, changed_at FROM customer")
        .unwrap();
    let read: BTreeMap<Uuid, i64> = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
        .unwrap()
        .map(|r| {
            let (id, at) = r.unwrap();
            (Uuid::parse_str(&id).unwrap(), at)
        })
        .collect();
    let want: BTreeMap<Uuid, i64> = oracle::lake_state(rig.store.as_ref(), MANIFEST)
        .await
        .into_iter()
        .filter(|(_, row)| row.deleted_at == 0)
        .map(|(id, row)| (id, row.changed_at))
        .collect();
    assert_eq!(read.len(), compared);
    assert_eq!(read, want);
    let copies: i64 = conn
        .query_row("SELECT count(*) FROM customer__history", [], |r| r.get(0))
        .unwrap();
    assert_eq!(copies, s.files.iter().map(|f| f.rows).sum::<i64>());

    // The binary prints the same statements.
    let out = harness::bin()
        .args(["view", "--pg-url", &rig.db.url, "--lake"])
        .arg(rig.work.path().join("lake"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let printed = String::from_utf8(out.stdout).unwrap();
    assert!(printed.contains(&sql), "{printed}");
}

#[tokio::test]
async fn a_foreign_path_gets_no_statement() {
    let rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(820);
    let mut rig = rig;
    rig.seed(10, &mut r).await;
    rig.flush().await;
    let mut m = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
        .await
        .unwrap();
    m["files"][0]["path"] = serde_json::json!("data/101/elsewhere.parquet");
    rig.store
        .put_bytes(
            MANIFEST,
            bytes::Bytes::from(serde_json::to_vec(&m).unwrap()),
            lakecdc::store::PutMode::Overwrite,
        )
        .await
        .unwrap();
    let report = view_of(&rig, &[]).await;
    let s = &report.schemas[0];
    assert_eq!(report.exit_code(), 3);
    assert!(s.sql.is_none() && s.files.is_empty(), "{s:?}");
    assert!(
        s.problem
            .as_deref()
            .unwrap()
            .contains("data/101/elsewhere.parquet")
    );
    assert!(!report.to_text().contains("CREATE"), "{}", report.to_text());
}

/// docs/hazards.md R7: two schemas whose views DuckDB would take for one (names differing only
/// in case; a schema named like another's `__history`) get no statement from `view` (exit 3),
/// and a query that would make both views fails naming both (exit 2) instead of reading one
/// schema's rows as the other's. Each alone still reads.
#[tokio::test]
async fn schemas_one_view_name_apart_are_refused_not_mixed_up() {
    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(821);
    rig.seed(12, &mut r).await;
    rig.flush().await;
    let live = rig.writer.rows.len();
    let m = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
        .await
        .unwrap();
    let t = tempfile::tempdir().unwrap();
    for other in ["CUSTOMER", "customer__History"] {
        // Schema 101's manifest, naming itself `other`, listing no file.
        let mut m101 = m.clone();
        m101["schema_id"] = serde_json::json!(101);
        m101["schema_name"] = serde_json::json!(other);
        m101["files"] = serde_json::json!([]);
        rig.store
            .put_bytes(
                "manifest/101.json",
                bytes::Bytes::from(serde_json::to_vec(&m101).unwrap()),
                lakecdc::store::PutMode::Overwrite,
            )
            .await
            .unwrap();
        let report = view_of(&rig, &[]).await;
        assert_eq!(report.exit_code(), 3, "{other}");
        assert_eq!(report.schemas.len(), 2);
        for s in &report.schemas {
            assert!(s.sql.is_none() && s.files.is_empty(), "{other}: {s:?}");
            let p = s.problem.as_deref().unwrap();
            assert!(
                p.contains("\"customer\" (id 100)") && p.contains(&format!("\"{other}\" (id 101)")),
                "{p}"
            );
        }
        assert!(!report.to_text().contains("CREATE"), "{}", report.to_text());
        let alone = view_of(&rig, &["customer"]).await;
        assert_eq!(alone.exit_code(), 0);
        assert!(alone.schemas[0].sql.is_some());

        // The query naming the clashing view fails; with --schema customer it reads.
        let sql = format!("SELECT count(*) AS n FROM {other}");
        let out = t.path().join(format!("{other}.csv"));
        let opts = crate::query::options(
            &rig,
            &sql,
            lakecdc::query::Format::Csv,
            &out,
            &t.path().join("cache"),
        );
        let e = lakecdc::query::run(&rig.job_context(), &opts)
            .await
            .unwrap_err();
        assert_eq!(e.exit_code(), 2, "{e}");
        let text = e.to_string();
        assert!(
            text.contains("(id 100)") && text.contains("(id 101)") && text.contains("--schema"),
            "{text}"
        );
        assert!(!out.exists());
        let sql = if other == "CUSTOMER" {
            "SELECT count(*) AS n FROM customer"
        } else {
            "SELECT count(DISTINCT row_id) AS n FROM customer__history"
        };
        let opts = lakecdc::query::QueryOptions {
            sql: lakecdc::query::SqlSource::Text(sql.into()),
            schemas: vec!["customer".into()],
            ..opts
        };
        lakecdc::query::run(&rig.job_context(), &opts)
            .await
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            format!("n\n{live}\n"),
            "{other}"
        );
    }
}
