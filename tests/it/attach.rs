//! Table sources' change capture (docs/design.md §12): `attach` installs statement-level
//! triggers that record every touched row's dirty slot in the touch log — live or tombstone,
//! versions above every recorded one, a primary-key update as a delete plus an insert — and a
//! TRUNCATE marker; attaching twice changes nothing, detach stops the capture, a table without
//! a primary key is refused creating nothing, and `--print-sql` applied by psql gives the same
//! objects.

use std::collections::BTreeMap;

use lakecdc::config::Tables;
use uuid::Uuid;

use crate::support::harness::{self, TestDb};

/// Runs the binary against `db`; (exit code, stdout, stderr).
fn lakecdc(db: &TestDb, args: &[&str]) -> (i32, String, String) {
    let out = harness::bin()
        .args(args)
        .args(["--pg-url", &db.url])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn attach_json(db: &TestDb, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["attach"];
    all.extend_from_slice(args);
    all.push("--json");
    let (code, out, err) = lakecdc(db, &all);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap()
}

/// The one number `sql` returns.
async fn count(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap().get(0)
}

/// The touch log: row id → [(seq, touched_at, deleted)], oldest touch first.
type Touches = BTreeMap<Uuid, Vec<(i64, i64, bool)>>;

async fn touches(client: &tokio_postgres::Client) -> Touches {
    let mut out: BTreeMap<Uuid, Vec<_>> = BTreeMap::new();
    for r in client
        .query(
            "SELECT row_id, seq, touched_at, deleted FROM lakecdc_touch ORDER BY row_id, seq",
            &[],
        )
        .await
        .unwrap()
    {
        out.entry(r.get(0))
            .or_default()
            .push((r.get(1), r.get(2), r.get(3)));
    }
    out
}

/// The row id of bigint key `id` of source `source_id`: the source id, then the key with its
/// sign bit flipped (docs/design.md §9).
fn row_id(source_id: i16, id: i64) -> Uuid {
    let flipped = (id as u64) ^ (1 << 63);
    Uuid::from_u128((u128::from(source_id as u16) << 112) | u128::from(flipped))
}

/// The latest touch of a row: (seq, deleted).
fn latest(t: &Touches, id: Uuid) -> (i64, bool) {
    let last = t[&id].last().unwrap();
    (last.0, last.2)
}

#[tokio::test]
async fn statements_append_one_touch_per_touched_row_and_a_key_update_moves_it() {
    let db = harness::examples_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE orders (id bigint PRIMARY KEY, note text, amount numeric(12,2));
             INSERT INTO orders VALUES (1, 'before attach', 1.00);",
        )
        .await
        .unwrap();
    let report = attach_json(&db, &["orders"]);
    assert_eq!(report["source"], "orders");
    assert_eq!(
        report["source_id"], 102,
        "after the two example schemas: {report}"
    );
    assert_eq!(report["row_id"], "integer");
    assert_eq!(report["key"], serde_json::json!(["id"]));
    assert_eq!(report["unchanged"], false);
    assert!(touches(&client).await.is_empty(), "nothing before a write");

    let r: Vec<Uuid> = (1..=4).map(|i| row_id(102, i)).collect();
    // One multi-row INSERT: one live touch per row, all with the statement's number and time.
    client
        .batch_execute("INSERT INTO orders SELECT g, 'n', g FROM generate_series(2, 4) g")
        .await
        .unwrap();
    let t = touches(&client).await;
    assert_eq!(t.len(), 3);
    let first = t[&r[1]][0];
    for id in &r[1..] {
        assert_eq!(t[id], vec![first], "{t:?}");
    }
    assert!(!first.2 && first.1 > 1_700_000_000_000, "{first:?}");
    // Two updates of the same rows in one transaction: one touch each, in statement order.
    client
        .batch_execute(
            "BEGIN; UPDATE orders SET note = 'a' WHERE id IN (1, 3); UPDATE orders SET note = 'b' WHERE id = 3; COMMIT;",
        )
        .await
        .unwrap();
    let t = touches(&client).await;
    let seqs: Vec<i64> = t[&r[2]].iter().map(|x| x.0).collect();
    assert_eq!(seqs.len(), 3, "{t:?}");
    assert!(seqs[0] < seqs[1] && seqs[1] < seqs[2], "{seqs:?}");
    assert_eq!(t[&r[0]].len(), 1, "a row from before attach, updated");
    assert_eq!(t[&r[0]][0].0, seqs[1], "one number per statement");
    // An update that changes nothing still touches its rows; one that matches none, none.
    client
        .batch_execute("UPDATE orders SET note = note WHERE id = 4; UPDATE orders SET note = 'x' WHERE id = 99")
        .await
        .unwrap();
    let t = touches(&client).await;
    assert_eq!(t[&r[3]].len(), 2);
    assert_eq!(t.values().map(Vec::len).sum::<usize>(), 7, "{t:?}");
    // A primary-key update: the old key's touch says gone, the new key's live.
    client
        .batch_execute("UPDATE orders SET id = 40 WHERE id = 4")
        .await
        .unwrap();
    let moved = row_id(102, 40);
    let t = touches(&client).await;
    let (gone_seq, gone) = latest(&t, r[3]);
    assert!(gone, "{:?}", t[&r[3]]);
    assert_eq!(latest(&t, moved), (gone_seq, false));
    // A DELETE: gone.
    client
        .batch_execute("DELETE FROM orders WHERE id IN (2, 3)")
        .await
        .unwrap();
    let t = touches(&client).await;
    assert!(latest(&t, r[1]).1 && latest(&t, r[2]).1);
    assert!(!latest(&t, r[0]).1);
    // TRUNCATE records that the source needs init.
    async fn needs(c: &tokio_postgres::Client) -> Option<i64> {
        c.query_one(
            "SELECT needs_init_at FROM lakecdc_sources WHERE source_id = 102",
            &[],
        )
        .await
        .unwrap()
        .get(0)
    }
    // Attached holding a row: the lake needs an init before a flush (docs/hazards.md L89).
    assert!(needs(&client).await.is_some());
    client
        .batch_execute("UPDATE lakecdc_sources SET needs_init_at = NULL WHERE source_id = 102")
        .await
        .unwrap();
    client.batch_execute("TRUNCATE orders").await.unwrap();
    assert!(needs(&client).await.is_some());
    // Each mark is above the last, whatever the clock: init clears only the value its
    // snapshot read, and a TRUNCATE after it must not write that value again.
    let ahead = 9_999_999_999_999i64;
    client
        .execute(
            "UPDATE lakecdc_sources SET needs_init_at = $1 WHERE source_id = 102",
            &[&ahead],
        )
        .await
        .unwrap();
    client.batch_execute("TRUNCATE orders").await.unwrap();
    assert_eq!(needs(&client).await, Some(ahead + 1));
}

#[tokio::test]
async fn a_uuid_key_is_the_row_id_and_composite_keys_are_hashed_apart() {
    let db = harness::examples_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE users (id uuid PRIMARY KEY, name text);
             CREATE TABLE lines (region text, n int, qty int, PRIMARY KEY (region, n));",
        )
        .await
        .unwrap();
    let users = attach_json(&db, &["users"]);
    assert_eq!(users["row_id"], "key");
    let lines = attach_json(&db, &["public.lines", "--name", "order_lines"]);
    assert_eq!(lines["source"], "order_lines");
    assert_eq!(lines["row_id"], "hashed");
    assert_ne!(users["source_id"], lines["source_id"]);
    let id = Uuid::new_v4();
    client
        .execute("INSERT INTO users VALUES ($1, 'x')", &[&id])
        .await
        .unwrap();
    // Keys whose naive concatenations collide ('a,1' || 2 vs 'a' || '1,2') stay apart.
    client
        .batch_execute("INSERT INTO lines VALUES ('a,1', 2, 0), ('a', 12, 0), ('a', 1, 0)")
        .await
        .unwrap();
    let t = touches(&client).await;
    assert_eq!(t.len(), 4, "{t:?}");
    assert!(t.contains_key(&id));
    // The touch log keeps a derived row id's key, typed, for the export to find its row by.
    let keys = |sql: &'static str| {
        let client = &client;
        async move {
            client
                .query(sql, &[])
                .await
                .unwrap()
                .iter()
                .map(|r| r.get::<_, Option<serde_json::Value>>(0))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        keys("SELECT key FROM lakecdc_touch WHERE row_id IN (SELECT id FROM users)").await,
        vec![None]
    );
    let mut lines_keys: Vec<String> = keys("SELECT key FROM lakecdc_touch WHERE key IS NOT NULL")
        .await
        .into_iter()
        .map(|k| k.unwrap().to_string())
        .collect();
    lines_keys.sort();
    assert_eq!(
        lines_keys,
        [
            r#"{"n":1,"region":"a"}"#,
            r#"{"n":12,"region":"a"}"#,
            r#"{"n":2,"region":"a,1"}"#
        ]
    );
}

/// The capture's objects: triggers (definition), the function (definition), the source row.
async fn objects(client: &tokio_postgres::Client) -> (Vec<String>, Vec<String>, Vec<String>) {
    let col = |rows: Vec<tokio_postgres::Row>| rows.iter().map(|r| r.get::<_, String>(0)).collect();
    let triggers = client
        .query(
            "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgname LIKE 'lakecdc%' ORDER BY tgname",
            &[],
        )
        .await
        .unwrap();
    let functions = client
        .query(
            "SELECT pg_get_functiondef(oid) FROM pg_proc WHERE proname LIKE 'lakecdc%' ORDER BY proname",
            &[],
        )
        .await
        .unwrap();
    let registered: bool = client
        .query_one("SELECT to_regclass('lakecdc_sources') IS NOT NULL", &[])
        .await
        .unwrap()
        .get(0);
    if !registered {
        return (col(triggers), col(functions), Vec::new());
    }
    let sources = client
        .query(
            "SELECT format('%s %s %s %s.%s %s %s', source_id, name, kind, table_schema, table_name, key_columns, excluded_columns) FROM lakecdc_sources ORDER BY source_id",
            &[],
        )
        .await
        .unwrap();
    (col(triggers), col(functions), col(sources))
}

#[tokio::test]
async fn attaching_twice_changes_nothing_and_detach_stops_the_capture() {
    let db = harness::examples_db().await;
    let client = db.client().await;
    client
        .batch_execute("CREATE TABLE orders (id bigint PRIMARY KEY, note text, secret text)")
        .await
        .unwrap();
    let first = attach_json(&db, &["orders", "--exclude-columns", "secret"]);
    assert_eq!(first["excluded"], serde_json::json!(["secret"]));
    let oids = || async {
        client
            .query(
                "SELECT oid::int8 FROM pg_trigger WHERE tgname LIKE 'lakecdc%' ORDER BY 1",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, i64>(0))
            .collect::<Vec<_>>()
    };
    let before = (oids().await, objects(&client).await);
    assert_eq!(before.0.len(), 4);
    let second = attach_json(&db, &["orders", "--exclude-columns", "secret"]);
    assert_eq!(second["unchanged"], true);
    assert_eq!(second["source_id"], first["source_id"]);
    assert_eq!((oids().await, objects(&client).await), before);

    let (code, out, err) = lakecdc(&db, &["detach", "orders"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("detached"), "{out}");
    client
        .batch_execute("INSERT INTO orders VALUES (1, 'after detach', 's')")
        .await
        .unwrap();
    assert!(touches(&client).await.is_empty(), "captured after detach");
    assert!(oids().await.is_empty());
    // The source stays registered; detaching again is an error naming the table.
    assert_eq!(objects(&client).await.2, before.1.2);
    let (code, _, err) = lakecdc(&db, &["detach", "orders"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("\"orders\"") && err.contains("not attached"),
        "{err}"
    );
    // Attaching again resumes under the same id.
    let again = attach_json(&db, &["orders", "--exclude-columns", "secret"]);
    assert_eq!(
        (again["source_id"].clone(), again["unchanged"].clone()),
        (first["source_id"].clone(), false.into())
    );
}

#[tokio::test]
async fn a_table_without_a_primary_key_is_refused_and_nothing_is_created() {
    let db = harness::examples_db().await;
    let client = db.client().await;
    client
        .batch_execute("CREATE TABLE events (at timestamptz, what text); CREATE TABLE stamped (at timestamptz PRIMARY KEY)")
        .await
        .unwrap();
    for (table, says) in [
        ("events", "no primary key"),
        ("stamped", "timestamp with time zone"),
    ] {
        let (code, _, err) = lakecdc(&db, &["attach", table]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(says) && err.lines().count() == 1, "{err}");
    }
    let (code, _, err) = lakecdc(&db, &["attach", "nope"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("does not exist"), "{err}");
    let (code, _, err) = lakecdc(&db, &["attach", "customer"]);
    assert_eq!(code, 2, "a missing table: {err}");
    let left: (bool, bool, i64) = {
        let r = client
            .query_one(
                "SELECT to_regclass('lakecdc_sources') IS NOT NULL, to_regclass('lakecdc_touch') IS NOT NULL,
                        (SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'lakecdc%')",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(left, (false, false, 0));
    // A name a schema holds is refused too.
    client
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY)")
        .await
        .unwrap();
    let (code, _, err) = lakecdc(&db, &["attach", "t", "--name", "customer"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--name") && err.contains("taken"), "{err}");
    // So is one a reader would take for its view or history view (R13), and nothing is
    // installed for it.
    for name in ["Customer", "customer__history", "CUSTOMER__History"] {
        let (code, _, err) = lakecdc(&db, &["attach", "t", "--name", name]);
        assert_eq!(code, 2, "{name}: {err}");
        assert!(
            err.contains("--name") && err.contains("same view as \"customer\""),
            "{name}: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
    let triggers: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'lakecdc%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(triggers, 0);
    let (code, out, err) = lakecdc(&db, &["attach", "t", "--name", "customers"]);
    assert_eq!(code, 0, "{out}{err}");
}

#[tokio::test]
async fn a_current_schema_that_is_not_a_plain_identifier_is_refused_before_any_ddl() {
    // The schema comes from the database (the role's search_path): quoted into DDL and a
    // dollar-quoted function body, a `"` or a `$` would end the name or the body early.
    let db = harness::examples_db().await;
    let client = db.client().await;
    client
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY)")
        .await
        .unwrap();
    let this: String = client
        .query_one("SELECT current_database()", &[])
        .await
        .unwrap()
        .get(0);
    for schema in ["a\"b", "x$lakecdc$y"] {
        let quoted = format!("\"{}\"", schema.replace('"', "\"\""));
        client
            .batch_execute(&format!(
                "CREATE SCHEMA {quoted}; ALTER DATABASE \"{this}\" SET search_path = {quoted}, public"
            ))
            .await
            .unwrap();
        let (code, _, err) = lakecdc(&db, &["attach", "public.t"]);
        client
            .batch_execute(&format!("ALTER DATABASE \"{this}\" RESET search_path"))
            .await
            .unwrap();
        assert_eq!(code, 2, "{schema}: {err}");
        assert!(
            err.contains("current schema")
                && err.contains("search_path")
                && err.lines().count() == 1,
            "{schema}: {err}"
        );
        let made: i64 = client
            .query_one(
                "SELECT (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1)
                      + (SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'lakecdc%')
                      + (SELECT count(*) FROM pg_proc WHERE proname LIKE 'lakecdc%')",
                &[&schema],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(made, 0, "{schema}");
    }
}

#[tokio::test]
async fn row_level_security_fails_the_read_instead_of_filtering_it() {
    // docs/hazards.md L85: a role a policy applies to saw half the table, and the hidden
    // half went out as deleted rows.
    let db = harness::examples_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE trls (id int PRIMARY KEY, tenant text, v int);
             INSERT INTO trls SELECT g, CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, g FROM generate_series(1, 10) g;
             ALTER TABLE trls ENABLE ROW LEVEL SECURITY;
             CREATE POLICY only_a ON trls USING (tenant = 'a')",
        )
        .await
        .unwrap();
    attach_json(&db, &["trls"]);
    let role = format!("t_rls_{}", &Uuid::new_v4().simple().to_string()[..12]);
    let admin = harness::pg_client(&harness::pg_admin_url()).await;
    admin
        .batch_execute(&format!("CREATE ROLE {role} LOGIN"))
        .await
        .unwrap();
    client
        .batch_execute(&format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role};
             GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}"
        ))
        .await
        .unwrap();
    let url = db.url.replacen("postgres@", &format!("{role}@"), 1);
    assert_ne!(url, db.url);
    let lake = tempfile::tempdir().unwrap();
    let init = |url: &str| {
        let out = harness::bin()
            .args(["init", "--json", "--schema", "trls", "--lake"])
            .arg(lake.path())
            .arg("--schema-dir")
            .arg(harness::examples_dir())
            .args(["--pg-url", url])
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            serde_json::from_slice::<serde_json::Value>(&out.stdout).ok(),
        )
    };
    let (code, err, _) = init(&url);
    assert_ne!(code, 0, "{err}");
    assert!(
        err.lines().any(|l| l.contains("ERROR")
            && l.contains(
                "query would be affected by row-level security policy for table \"trls\""
            )),
        "{err}"
    );
    assert!(
        !lake.path().join("manifest").exists(),
        "nothing is published"
    );
    // The owner's superuser session is not filtered: all ten rows.
    let (code, err, report) = init(&db.url);
    assert_eq!(code, 0, "{err}");
    let report = report.unwrap_or_default();
    assert_eq!(report["schemas"][0]["rows"], 10, "{report}");
    client
        .batch_execute(&format!("DROP OWNED BY {role}"))
        .await
        .unwrap();
    if let Err(e) = admin.batch_execute(&format!("DROP ROLE {role}")).await {
        eprintln!("test cleanup: could not drop role {role}: {e}");
    }
}

#[tokio::test]
async fn print_sql_applied_by_psql_gives_the_same_objects_and_ids_stay_shared() {
    let (a, b) = (harness::examples_db().await, harness::examples_db().await);
    for db in [&a, &b] {
        db.client()
            .await
            .batch_execute("CREATE TABLE orders (id bigint PRIMARY KEY, note text)")
            .await
            .unwrap();
    }
    attach_json(&a, &["orders"]);
    let (code, sql, err) = lakecdc(&b, &["attach", "orders", "--print-sql"]);
    assert_eq!(code, 0, "{err}");
    assert!(sql.contains("BEGIN;") && sql.contains("COMMIT;"), "{sql}");
    let client_b = b.client().await;
    assert!(
        objects(&client_b).await.0.is_empty(),
        "--print-sql changed the database"
    );
    harness::apply_with_psql(&b.url, &sql);
    assert_eq!(objects(&a.client().await).await, objects(&client_b).await);
    // Applied by psql, attach sees it as done.
    assert_eq!(attach_json(&b, &["orders"])["unchanged"], true);
    // init-db gives a new schema the next id after the source's.
    let mut client = b.client().await;
    let (_, regs) = lakecdc::source::ddl::apply(
        &mut client,
        &Tables::default(),
        &["customer".into(), "order".into(), "zeta".into()],
        false,
    )
    .await
    .unwrap();
    let zeta = regs.iter().find(|r| r.name == "zeta").unwrap();
    assert_eq!(zeta.id, 103, "{regs:?}");
}

#[tokio::test]
async fn integer_keys_are_read_back_from_row_ids_that_sort_as_the_keys() {
    let db = harness::examples_db().await;
    let client = db.client().await;
    client
        .batch_execute("CREATE TABLE big (id bigint PRIMARY KEY); CREATE TABLE small (id smallint PRIMARY KEY)")
        .await
        .unwrap();
    let big = attach_json(&db, &["big"])["source_id"].as_i64().unwrap() as i16;
    let small = attach_json(&db, &["small"])["source_id"].as_i64().unwrap() as i16;
    let keys = [i64::MIN, -5, 0, 7, i64::MAX];
    for k in keys {
        client
            .execute("INSERT INTO big VALUES ($1)", &[&k])
            .await
            .unwrap();
    }
    client
        .batch_execute("INSERT INTO small VALUES (-32768), (-1), (0), (32767)")
        .await
        .unwrap();
    let ids = |source: i16| {
        let client = &client;
        async move {
            client
                .query(
                    "SELECT row_id FROM lakecdc_touch WHERE source_id = $1 ORDER BY row_id",
                    &[&source],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| r.get::<_, Uuid>(0))
                .collect::<Vec<_>>()
        }
    };
    // Sorted by row id (as PostgreSQL and the lake compare UUIDs) is sorted by key.
    assert_eq!(ids(big).await, keys.map(|k| row_id(big, k)).to_vec());
    assert_eq!(
        ids(small).await,
        [-32768, -1, 0, 32767].map(|k| row_id(small, k)).to_vec()
    );
    // No key JSON is kept: the row id holds the key.
    let kept = count(
        &client,
        "SELECT count(*) FROM lakecdc_touch WHERE key IS NOT NULL",
    )
    .await;
    assert_eq!(kept, 0);
}

#[tokio::test]
async fn every_column_gets_its_lake_type_recorded_with_the_source() {
    let db = harness::examples_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TYPE mood AS ENUM ('ok', 'sad');
             CREATE DOMAIN cents AS numeric(12,2);
             CREATE TABLE every (
                 id bigint PRIMARY KEY, s smallint, i integer, r real, d double precision,
                 n numeric(12,2), nn numeric, c cents, b boolean, t text, v varchar(10),
                 e mood, dt date, ts timestamp, tz timestamptz, u uuid, j json, jb jsonb,
                 by bytea, ia integer[], ta text[], other inet, secret text)",
        )
        .await
        .unwrap();
    let report = attach_json(&db, &["every", "--exclude-columns", "secret"]);
    let types: Vec<(String, String)> = report["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["lake_type"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected = [
        ("id", "INT64"),
        ("s", "INT16"),
        ("i", "INT32"),
        ("r", "FLOAT"),
        ("d", "DOUBLE"),
        ("n", "DECIMAL(12,2)"),
        ("nn", "DOUBLE"),
        ("c", "DECIMAL(12,2)"),
        ("b", "BOOLEAN"),
        ("t", "UTF8"),
        ("v", "UTF8"),
        ("e", "UTF8"),
        ("dt", "DATE"),
        ("ts", "TIMESTAMP(µs)"),
        ("tz", "TIMESTAMP(µs, UTC)"),
        ("u", "UUID"),
        ("j", "JSON"),
        ("jb", "JSON"),
        ("by", "BINARY"),
        ("ia", "LIST<INT32>"),
        ("ta", "LIST<UTF8>"),
        ("other", "UTF8"),
    ]
    .map(|(n, t)| (n.to_string(), t.to_string()));
    assert_eq!(types, expected);
    // The same list is recorded with the source, for the export to check types against.
    let recorded: serde_json::Value = client
        .query_one(
            "SELECT columns::text FROM lakecdc_sources WHERE name = 'every'",
            &[],
        )
        .await
        .unwrap()
        .get::<_, String>(0)
        .parse()
        .unwrap();
    assert_eq!(recorded, report["columns"]);
}

#[tokio::test]
async fn the_capture_cannot_be_misused_or_outlive_a_detach() {
    let db = harness::examples_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE prices (id numeric PRIMARY KEY, v int);
             CREATE TABLE parted (id int PRIMARY KEY) PARTITION BY RANGE (id);
             CREATE TABLE parted_low PARTITION OF parted FOR VALUES FROM (0) TO (100);
             CREATE TABLE animal (id int PRIMARY KEY);
             CREATE TABLE dog (id int PRIMARY KEY, bark text) INHERITS (animal);",
        )
        .await
        .unwrap();
    let source = attach_json(&db, &["prices"])["source_id"].as_i64().unwrap();
    // Fired from another table, the function refuses (and PUBLIC may not execute it).
    let e = client
        .batch_execute(&format!(
            "CREATE TEMP TABLE decoy (id numeric);
             CREATE TRIGGER decoy AFTER INSERT ON decoy REFERENCING NEW TABLE AS lakecdc_new
               FOR EACH STATEMENT EXECUTE FUNCTION public.lakecdc_capture_{source}();
             INSERT INTO decoy VALUES (1);"
        ))
        .await
        .unwrap_err();
    assert!(format!("{e:?}").contains("fired by another table"), "{e:?}");
    let public: bool = client
        .query_one(
            &format!("SELECT has_function_privilege('public', 'public.lakecdc_capture_{source}()', 'EXECUTE')"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!public);
    // A key update that changes only the key's text (a numeric's scale) moves the row id.
    client
        .batch_execute(
            "INSERT INTO prices VALUES (1.0, 1); UPDATE prices SET id = 1.00 WHERE id = 1.0",
        )
        .await
        .unwrap();
    let slots: Vec<(Uuid, bool)> = client
        .query(
            "SELECT row_id, deleted FROM lakecdc_touch WHERE seq = (SELECT max(seq) FROM lakecdc_touch)",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(slots.len(), 2, "{slots:?}");
    assert_eq!(slots.iter().filter(|(_, d)| *d).count(), 1, "{slots:?}");
    // Partitioned tables are refused (writes to a partition would bypass the triggers).
    let (code, _, err) = lakecdc(&db, &["attach", "parted"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("partition"), "{err}");
    // So are a partition, an inheritance child and a parent (docs/hazards.md L72): writes
    // through the parent, or to the children, would fire no trigger of the attached table.
    for (table, why) in [
        ("parted_low", "is a partition or inheritance child"),
        ("dog", "is a partition or inheritance child"),
        ("animal", "has inheritance children"),
    ] {
        let (code, _, err) = lakecdc(&db, &["attach", table]);
        assert_eq!(code, 2, "{table}: {err}");
        assert!(
            err.contains(why) && err.contains("would not be captured"),
            "{table}: {err}"
        );
    }
    let none = count(&client, "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'lakecdc%' AND tgrelid <> 'prices'::regclass").await;
    assert_eq!(none, 0);
    // A capture missing a trigger is still detached whole.
    client
        .batch_execute("DROP TRIGGER lakecdc_capture_insert ON prices")
        .await
        .unwrap();
    let (code, _, err) = lakecdc(&db, &["detach", "prices"]);
    assert_eq!(code, 0, "{err}");
    let left = count(
        &client,
        "SELECT (SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'lakecdc%') \
                  + (SELECT count(*) FROM pg_proc WHERE proname LIKE 'lakecdc_capture%')",
    )
    .await;
    assert_eq!(left, 0);
}

#[tokio::test]
async fn a_printed_script_whose_id_was_taken_since_stops_without_a_change() {
    let db = harness::examples_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE a (id bigint PRIMARY KEY); CREATE TABLE b (id bigint PRIMARY KEY)",
        )
        .await
        .unwrap();
    // Both scripts are printed before either is applied: both name id 102.
    let (_, script_a, _) = lakecdc(&db, &["attach", "a", "--print-sql"]);
    let (_, script_b, _) = lakecdc(&db, &["attach", "b", "--print-sql"]);
    assert!(script_a.contains("(id 102)") && script_b.contains("(id 102)"));
    harness::apply_with_psql(&db.url, &script_a);
    let out = std::process::Command::new(harness::psql())
        .args([
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            &db.url,
            "-c",
            &script_b,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("was taken since this script was printed"),
        "{err}"
    );
    let triggers_on_b = count(
        &client,
        "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'b'::regclass",
    )
    .await;
    assert_eq!(triggers_on_b, 0);
    // Printed again, it takes the next id.
    let (_, again, _) = lakecdc(&db, &["attach", "b", "--print-sql"]);
    assert!(again.contains("(id 103)"), "{again}");
    harness::apply_with_psql(&db.url, &again);
}

#[tokio::test]
async fn a_source_keeps_its_key_columns_and_name_against_later_changes() {
    let db = harness::examples_db().await;
    let client = db.client().await;
    client
        .batch_execute("CREATE TABLE orders (id bigint PRIMARY KEY, note text, secret text)")
        .await
        .unwrap();
    attach_json(&db, &["orders", "--exclude-columns", "secret"]);
    // Other excluded columns: refused, whether attached or detached since.
    for detached in [false, true] {
        if detached {
            let (code, _, err) = lakecdc(&db, &["detach", "orders"]);
            assert_eq!(code, 0, "{err}");
        }
        let (code, _, err) = lakecdc(&db, &["attach", "orders"]);
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains("--exclude-columns") && err.contains("secret"),
            "{err}"
        );
    }
    // A changed key: refused, naming both keys.
    client
        .batch_execute(
            "ALTER TABLE orders DROP CONSTRAINT orders_pkey; ALTER TABLE orders ADD PRIMARY KEY (id, note)",
        )
        .await
        .unwrap();
    let (code, _, err) = lakecdc(&db, &["attach", "orders", "--exclude-columns", "secret"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("(id)") && err.contains("(id, note)"), "{err}");
    // init-db does not register a schema under a source's name.
    let mut client = db.client().await;
    let e = lakecdc::source::ddl::apply(
        &mut client,
        &Tables::default(),
        &["customer".into(), "orders".into()],
        false,
    )
    .await
    .unwrap_err();
    assert!(
        e.to_string().contains("a table source has that name"),
        "{e}"
    );
}

#[tokio::test]
async fn a_renamed_table_keeps_its_writes_and_every_session_reads_the_capture_alike() {
    // docs/hazards.md S16: the capture must never break the application's writes: not after
    // a rename, not in a session with standard_conforming_strings off (a key named with a
    // backslash was then an escape in the function's quoted names). attach replaces a
    // capture another build installed.
    let db = harness::examples_db().await;
    let client = db.client().await;
    client
        .batch_execute(r#"CREATE TABLE slashed ("k\" text PRIMARY KEY, v int)"#)
        .await
        .unwrap();
    let source = attach_json(&db, &["slashed"])["source_id"]
        .as_i64()
        .unwrap();
    let other = db.client().await;
    other
        .batch_execute(
            r#"SET standard_conforming_strings = off;
               INSERT INTO slashed VALUES ('one', 1);
               ALTER TABLE slashed RENAME TO slashed_old;
               INSERT INTO slashed_old VALUES ('two', 2);"#,
        )
        .await
        .unwrap();
    let keys: Vec<String> = client
        .query(
            "SELECT key ->> 'k\\' FROM lakecdc_touch WHERE source_id = $1 ORDER BY seq",
            &[&(source as i16)],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(keys, ["one", "two"]);
    client
        .batch_execute("ALTER TABLE slashed_old RENAME TO slashed")
        .await
        .unwrap();
    // A capture whose function differs from this build's is replaced by attach.
    let function = format!("public.lakecdc_capture_{source}()");
    client
        .batch_execute(&format!(
            "ALTER FUNCTION {function} RESET standard_conforming_strings"
        ))
        .await
        .unwrap();
    let again = attach_json(&db, &["slashed"]);
    assert_eq!(again["unchanged"], false, "{again}");
    let settings: Vec<String> = client
        .query_one(
            &format!("SELECT proconfig FROM pg_proc WHERE oid = '{function}'::regprocedure"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        settings,
        [
            "search_path=pg_catalog, pg_temp",
            "standard_conforming_strings=on"
        ]
    );
    assert_eq!(attach_json(&db, &["slashed"])["unchanged"], true);
}

#[tokio::test]
async fn a_touch_log_made_first_with_code_of_its_own_is_refused() {
    // docs/hazards.md S18: `CREATE TABLE IF NOT EXISTS` adopts a touch log another role made
    // first; a trigger on it would run as the capture function's owner on every write.
    let db = harness::examples_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE t (id bigint PRIMARY KEY);
             CREATE TABLE lakecdc_touch (source_id SMALLINT NOT NULL, seq BIGINT NOT NULL,
               touched_at BIGINT NOT NULL, row_id UUID NOT NULL, deleted BOOLEAN NOT NULL, key JSONB);
             CREATE TABLE planted (who text);
             CREATE FUNCTION plant() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN INSERT INTO planted VALUES (current_user); RETURN NULL; END $$;
             CREATE TRIGGER plant AFTER INSERT ON lakecdc_touch
               FOR EACH STATEMENT EXECUTE FUNCTION plant();",
        )
        .await
        .unwrap();
    let (code, _, err) = lakecdc(&db, &["attach", "t"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("\"public\".\"lakecdc_touch\" has triggers or rules lakecdc did not make"),
        "{err}"
    );
    // Nothing was installed; the application's writes run no capture.
    client
        .batch_execute("INSERT INTO t VALUES (1)")
        .await
        .unwrap();
    assert_eq!(count(&client, "SELECT count(*) FROM planted").await, 0);
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM pg_proc WHERE proname LIKE 'lakecdc_capture%'"
        )
        .await,
        0
    );
    // A view in its place is refused too.
    client
        .batch_execute(
            "DROP TABLE lakecdc_touch; CREATE VIEW lakecdc_touch AS SELECT 1::smallint AS source_id",
        )
        .await
        .unwrap();
    let (code, _, err) = lakecdc(&db, &["attach", "t"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("lakecdc_touch"), "{err}");
    // The printed script stops on it too, creating nothing.
    let (code, script, err) = lakecdc(&db, &["attach", "t", "--print-sql"]);
    assert_eq!(code, 0, "{err}");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &script).unwrap();
    let out = std::process::Command::new(harness::psql())
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", &db.url, "-f"])
        .arg(file.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("\"public\".\"lakecdc_touch\" is not a plain table"),
        "{err}"
    );
    assert_eq!(
        count(
            &client,
            "SELECT count(*) FROM pg_proc WHERE proname LIKE 'lakecdc_capture%'"
        )
        .await,
        0
    );
}
