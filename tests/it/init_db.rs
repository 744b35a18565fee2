//! `lakecdc init-db` against a real PostgreSQL: creation, idempotence, registration ids, and
//! refusal of broken metadata with no side effect.

use lakecdc::config::Tables;

use crate::support::harness::{self, TestDb};

async fn table_columns(db: &TestDb, table: &str) -> Vec<(String, String)> {
    db.client()
        .await
        .query(
            "SELECT column_name::text, data_type::text FROM information_schema.columns WHERE table_name = $1 ORDER BY ordinal_position",
            &[&table],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

async fn registry(db: &TestDb) -> Vec<(String, i16)> {
    db.client()
        .await
        .query(
            "SELECT schema_name, schema_id FROM schema_registry ORDER BY schema_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test]
async fn creates_everything_registers_examples_and_is_idempotent() {
    let db = TestDb::new().await;
    let tables = Tables::default();
    let dir = harness::examples_dir();
    let first = lakecdc::init_db::run(&db.connector(), &tables, Some(&dir), false)
        .await
        .unwrap();
    assert!(first.objects.iter().all(|o| o.created), "{first:?}");
    assert_eq!(first.objects.len(), 5);
    let regs: Vec<(String, i16, bool)> = first
        .schemas
        .iter()
        .map(|s| (s.name.clone(), s.id, s.created))
        .collect();
    assert_eq!(
        regs,
        [("customer".into(), 100, true), ("order".into(), 101, true)]
    );

    let cl = table_columns(&db, "change_log").await;
    let names: Vec<&str> = cl.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "schema_id",
            "row_id",
            "flushed_at",
            "changed_at",
            "deleted_at"
        ]
    );
    let main = table_columns(&db, "entity_main").await;
    assert_eq!(main.len(), 2 + 24 + 6);
    assert!(main.contains(&("uuid_02".into(), "uuid".into())));
    assert!(main.contains(&("double_03".into(), "double precision".into())));
    let client = db.client().await;
    assert!(
        lakecdc::source::ddl::change_log_index_exists(&client, &tables)
            .await
            .unwrap()
    );
    // The index holds the dirty slots only (docs/hazards.md L70).
    let def: String = client
        .query_one(
            "SELECT pg_get_indexdef('change_log_dirty_idx'::regclass)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        def.ends_with("(schema_id, flushed_at, changed_at) WHERE (flushed_at = 0)"),
        "{def}"
    );
    assert_eq!(
        lakecdc::source::ddl::change_log_dirty_index(&client, &tables)
            .await
            .unwrap(),
        lakecdc::source::ddl::DirtyIndex::DirtyOnly
    );

    let second = lakecdc::init_db::run(&db.connector(), &tables, Some(&dir), false)
        .await
        .unwrap();
    assert!(second.objects.iter().all(|o| !o.created), "{second:?}");
    assert!(second.schemas.iter().all(|s| !s.created));
    assert_eq!(
        registry(&db).await,
        [("customer".into(), 100), ("order".into(), 101)]
    );
}

#[tokio::test]
async fn a_dry_run_reports_the_plan_and_changes_nothing() {
    let db = TestDb::new().await;
    let tables = Tables::default();
    let dir = harness::examples_dir();
    let plan = |r: &lakecdc::init_db::InitDbReport| {
        (
            r.objects
                .iter()
                .map(|o| (o.name.clone(), o.created))
                .collect::<Vec<_>>(),
            r.schemas
                .iter()
                .map(|s| (s.name.clone(), s.id, s.created))
                .collect::<Vec<_>>(),
        )
    };
    let dry = lakecdc::init_db::run(&db.connector(), &tables, Some(&dir), true)
        .await
        .unwrap();
    assert!(dry.dry_run);
    assert!(dry.to_text().contains("would create"), "{}", dry.to_text());
    // Nothing was created.
    let client = db.client().await;
    let tables_now: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables_now, 0);
    // The real run follows the plan exactly.
    let real = lakecdc::init_db::run(&db.connector(), &tables, Some(&dir), false)
        .await
        .unwrap();
    assert_eq!(plan(&real), plan(&dry));
    // A new schema on an existing registry: the dry run names its id, registers nothing.
    client
        .batch_execute("INSERT INTO schema_registry VALUES ('legacy', 105)")
        .await
        .unwrap();
    let more = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(&dir).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, more.path().join(f.file_name().unwrap())).unwrap();
    }
    for (from, to) in [("customer", "zeta")] {
        for suffix in [".json", "_attributes.json"] {
            std::fs::copy(
                dir.join(format!("{from}{suffix}")),
                more.path().join(format!("{to}{suffix}")),
            )
            .unwrap();
        }
    }
    let dry = lakecdc::init_db::run(&db.connector(), &tables, Some(more.path()), true)
        .await
        .unwrap();
    assert!(dry.objects.iter().all(|o| !o.created));
    assert_eq!(
        dry.schemas
            .iter()
            .map(|s| (s.name.as_str(), s.id, s.created))
            .collect::<Vec<_>>(),
        [
            ("customer", 100, false),
            ("order", 101, false),
            ("zeta", 106, true)
        ]
    );
    assert_eq!(
        registry(&db).await,
        [
            ("customer".into(), 100),
            ("order".into(), 101),
            ("legacy".into(), 105)
        ]
    );
}

#[tokio::test]
async fn new_schemas_get_ids_above_every_existing_one() {
    let db = TestDb::new().await;
    let tables = Tables::default();
    lakecdc::init_db::run(&db.connector(), &tables, None, false)
        .await
        .unwrap();
    db.client()
        .await
        .batch_execute("INSERT INTO schema_registry VALUES ('legacy', 105)")
        .await
        .unwrap();
    let report = lakecdc::init_db::run(
        &db.connector(),
        &tables,
        Some(&harness::examples_dir()),
        false,
    )
    .await
    .unwrap();
    let ids: Vec<i16> = report.schemas.iter().map(|s| s.id).collect();
    assert_eq!(ids, [106, 107], "gaps below the maximum are never reused");
}

#[test]
fn broken_metadata_exits_2_naming_file_and_attribute_and_changes_nothing() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let db = rt.block_on(TestDb::new());
    let dir = tempfile::tempdir().unwrap();
    for f in ["customer.json", "customer_attributes.json", "order.json"] {
        std::fs::copy(harness::examples_dir().join(f), dir.path().join(f)).unwrap();
    }
    std::fs::write(
        dir.path().join("order_attributes.json"),
        r#"{"status": {"attributeID": 1, "valueType": "text"}, "shipping.fee": {"attributeID": 2, "valueType": "numeric", "column_binding": {"col_name": "text_01"}}}"#,
    )
    .unwrap();
    let out = harness::bin()
        .args(["init-db", "--pg-url", &db.url, "--schema-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("order_attributes.json"), "{stderr}");
    assert!(stderr.contains("\"shipping.fee\""), "{stderr}");
    // Nothing was created.
    let exists: bool = rt.block_on(async {
        db.client()
            .await
            .query_one("SELECT to_regclass('schema_registry') IS NOT NULL", &[])
            .await
            .unwrap()
            .get(0)
    });
    assert!(!exists);
}

#[test]
fn binary_reports_json_and_text() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let db = rt.block_on(TestDb::new());
    let run = |json: bool| {
        let mut cmd = harness::bin();
        cmd.args(["init-db", "--pg-url", &db.url, "--schema-dir"])
            .arg(harness::examples_dir());
        if json {
            cmd.arg("--json");
        }
        cmd.output().unwrap()
    };
    let out = run(true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["schemas"][0]["name"], "customer");
    assert_eq!(report["schemas"][0]["id"], 100);
    assert_eq!(report["schemas"][1]["created"], true);
    let out = run(false);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("\"change_log\"") && text.contains("exists"),
        "{text}"
    );
    assert!(text.contains("order") && text.contains("kept"), "{text}");
}

#[tokio::test]
async fn printed_sql_applied_by_a_migration_tool_leaves_init_db_nothing_to_create() {
    // The DDL comes out without any connection (an unreachable server is never dialled).
    let out = harness::bin()
        .args(["init-db", "--print-sql", "--pg-url"])
        .arg("host=127.0.0.1 port=1 user=u dbname=d sslmode=disable connect_timeout=1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sql = String::from_utf8(out.stdout).unwrap();
    assert!(sql.contains("CREATE INDEX IF NOT EXISTS"), "{sql}");
    // Asked for JSON, the same script as one JSON string.
    let out = harness::bin()
        .args(["init-db", "--print-sql", "--json", "--pg-url"])
        .arg("host=127.0.0.1 port=1 user=u dbname=d sslmode=disable connect_timeout=1")
        .output()
        .unwrap();
    assert!(out.status.success());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["sql"].as_str(), Some(sql.as_str()), "{json}");
    // Applied by psql to an empty database, as a migration would, twice: it is idempotent.
    let db = TestDb::new().await;
    for _ in 0..2 {
        harness::apply_with_psql(&db.url, &sql);
    }
    let report = lakecdc::init_db::run(&db.connector(), &Tables::default(), None, true)
        .await
        .unwrap();
    assert_eq!(report.objects.len(), 5, "{report:?}");
    assert!(
        report.objects.iter().all(|o| !o.created),
        "init-db would still create: {report:?}"
    );
    // And the tables are init-db's own: a real run registers the examples into them.
    let real = lakecdc::init_db::run(
        &db.connector(),
        &Tables::default(),
        Some(&harness::examples_dir()),
        false,
    )
    .await
    .unwrap();
    assert!(real.objects.iter().all(|o| !o.created));
    assert_eq!(registry(&db).await.len(), 2);
}
