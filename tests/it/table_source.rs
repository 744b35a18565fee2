//! Exporting table sources (docs/design.md §9.2): flush, init, compaction and query of attached
//! tables with a uuid key, a bigint key and a composite (text, int) key, over every mapped type
//! (NULLs, arrays, jsonb, numeric(12,2), timestamptz, …), checked against the table with values
//! compared typed; a primary-key update moves the row; TRUNCATE stops flush until init; a
//! writer committing after a batch was selected, or writing between the commit and the mark,
//! keeps its row dirty for the next flush.

use std::collections::BTreeMap;
use std::path::Path;

use arrow::array::{Array, AsArray};
use arrow::datatypes::DataType;
use lakecdc::compact::CompactOptions;
use lakecdc::flush::{FlushHooks, Outcome};
use lakecdc::init::InitOptions;
use lakecdc::query::Format;

use crate::query::options;
use crate::support::harness;
use crate::support::rig::{LakeKind, Rig, rig};
use crate::support::writer::Rng;

/// A value compared typed: integers widened, floats by bits, decimals at their scale, JSON
/// parsed, times as µs or days since 1970.
#[derive(Debug, Clone, PartialEq)]
enum V {
    Null,
    Int(i64),
    Float(u64),
    Bool(bool),
    Text(String),
    Json(serde_json::Value),
    Bytes(Vec<u8>),
    List(Vec<V>),
}

/// The payload columns every test table has, after its key: (name, type, how PostgreSQL
/// renders it for the comparison).
const COLUMNS: &[(&str, &str, &str)] = &[
    ("i2", "smallint", "i2::int8"),
    ("i4", "integer", "i4::int8"),
    ("i8", "bigint", "i8"),
    ("f4", "real", "f4::float8"),
    ("f8", "double precision", "f8"),
    ("amount", "numeric(12,2)", "amount::text"),
    ("flag", "boolean", "flag"),
    ("note", "text", "note"),
    ("code", "varchar(20)", "code::text"),
    ("doc", "jsonb", "doc::text"),
    ("day", "date", "(day - date '1970-01-01')::int8"),
    (
        "at",
        "timestamp",
        "(extract(epoch FROM at) * 1000000)::int8",
    ),
    (
        "at_tz",
        "timestamptz",
        "(extract(epoch FROM at_tz) * 1000000)::int8",
    ),
    ("ref", "uuid", "ref::text"),
    ("raw", "bytea", "raw"),
    ("tags", "text[]", "tags"),
    ("nums", "integer[]", "nums"),
    ("deleted_at", "bigint", "deleted_at"),
];

/// A random payload as SQL expressions (NULL one time in five per column), `g` being a
/// `generate_series` number or any integer expression.
fn payload_sql(r: &mut Rng, g: &str) -> String {
    payload_exprs(r, g).join(", ")
}

/// [`payload_sql`]'s expressions, one per column of [`COLUMNS`].
fn payload_exprs(r: &mut Rng, g: &str) -> Vec<String> {
    let exprs = [
        format!("({g} % 30000)::smallint"),
        format!("({g} * 7)::int"),
        format!("{g}::int8 * 1000003"),
        format!("({g} / 3.0)::real"),
        format!("{g} / 7.0::float8"),
        format!("round(({g} * 1.37)::numeric, 2)"),
        format!("{g} % 2 = 0"),
        format!("'note ' || {g} || ' é\"''\\n'"),
        format!("'c' || ({g} % 100)"),
        format!(
            "jsonb_build_object('g', {g}, 'tags', jsonb_build_array('a', {g}), 'nested', jsonb_build_object('x', null))"
        ),
        format!("date '2024-02-29' + ({g} % 1000)"),
        format!("timestamp '2001-02-03 04:05:06.789012' + {g} * interval '1 second 1 microsecond'"),
        format!("timestamptz '1999-12-31 23:59:59.999999+05' + {g} * interval '1 minute'"),
        format!("md5({g}::text)::uuid"),
        format!("decode(md5({g}::text), 'hex')"),
        format!("ARRAY['x' || {g}, NULL, 'y']"),
        format!("ARRAY[{g}, NULL, -{g}]::int[]"),
        format!("{g} * 11"),
    ];
    exprs
        .into_iter()
        .map(|e| if r.chance(20) { "NULL".to_string() } else { e })
        .collect()
}

/// A test table: its name, key columns and the SQL of a new key from an integer `g`.
pub(crate) struct Table {
    pub(crate) name: &'static str,
    key_ddl: &'static str,
    key: &'static [&'static str],
    pub(crate) new_key: fn(&str) -> String,
}

pub(crate) const TABLES: [Table; 3] = [
    Table {
        name: "t_uuid",
        key_ddl: "id uuid PRIMARY KEY",
        key: &["id"],
        new_key: |g| format!("md5('k' || {g})::uuid"),
    },
    Table {
        name: "t_big",
        key_ddl: "id bigint PRIMARY KEY",
        key: &["id"],
        new_key: |g| format!("{g}::int8 * 3 - 5000"),
    },
    Table {
        name: "t_comp",
        key_ddl: "region text, n int, PRIMARY KEY (region, n)",
        key: &["region", "n"],
        new_key: |g| format!("'r,' || ({g} % 7), {g}"),
    },
];

pub(crate) fn create_sql(t: &Table) -> String {
    let cols: Vec<String> = COLUMNS
        .iter()
        .map(|(n, ty, _)| format!("{n} {ty}"))
        .collect();
    format!(
        "CREATE TABLE {} ({}, {})",
        t.name,
        t.key_ddl,
        cols.join(", ")
    )
}

/// The insert of rows `from..=to` of `t` in one statement: the key `key` and the payload
/// computed from the row number `g`.
pub(crate) fn insert_sql(t: &Table, key: &str, from: i64, to: i64, seed: u64) -> String {
    let cols: Vec<&str> = COLUMNS.iter().map(|c| c.0).collect();
    format!(
        "INSERT INTO {} ({}, {}) SELECT {key}, {} FROM generate_series({from}, {to}) g",
        t.name,
        t.key.join(", "),
        cols.join(", "),
        payload_sql(&mut Rng::new(seed), "g")
    )
}

/// Ends a transaction of writes made behind the capture's back: the touches its triggers
/// appended (in the same transaction) are deleted before it commits, as if nothing had
/// recorded them (the triggers fire `ALWAYS`, so no session setting can keep them quiet).
const BEHIND: &str = "DELETE FROM lakecdc_touch WHERE xmin = pg_current_xact_id()::xid; COMMIT";

/// Runs the binary on the rig's database and local lake.
fn run_bin(rig: &Rig, args: &[&str]) -> std::process::Output {
    let lake = rig.work.path().join("lake");
    harness::bin()
        .args(args)
        .args(["--pg-url", &rig.db.url])
        .arg("--lake")
        .arg(&lake)
        .output()
        .unwrap()
}

pub(crate) fn attach(rig: &Rig, table: &str) {
    let out = harness::bin()
        .args(["attach", table, "--pg-url", &rig.db.url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The table's rows as the comparison sees them: key text → values.
async fn pg_state(rig: &Rig, t: &Table) -> BTreeMap<String, Vec<V>> {
    let client = rig.db.client().await;
    let key = t
        .key
        .iter()
        .map(|k| format!("{k}::text"))
        .collect::<Vec<_>>()
        .join(" || '|' || ");
    let cols: Vec<&str> = COLUMNS.iter().map(|c| c.2).collect();
    let sql = format!("SELECT {key}, {} FROM {}", cols.join(", "), t.name);
    let mut out = BTreeMap::new();
    for row in client.query(&sql, &[]).await.unwrap() {
        let mut values = Vec::new();
        for (i, (name, _, _)) in COLUMNS.iter().enumerate() {
            let i = i + 1;
            let v = match *name {
                "f4" | "f8" => row
                    .get::<_, Option<f64>>(i)
                    .map_or(V::Null, |f| V::Float(f.to_bits())),
                "flag" => row.get::<_, Option<bool>>(i).map_or(V::Null, V::Bool),
                "amount" | "note" | "code" | "ref" => {
                    row.get::<_, Option<String>>(i).map_or(V::Null, V::Text)
                }
                "doc" => row
                    .get::<_, Option<String>>(i)
                    .map_or(V::Null, |s| V::Json(serde_json::from_str(&s).unwrap())),
                "raw" => row.get::<_, Option<Vec<u8>>>(i).map_or(V::Null, V::Bytes),
                "tags" => row
                    .get::<_, Option<Vec<Option<String>>>>(i)
                    .map_or(V::Null, |l| {
                        V::List(l.into_iter().map(|e| e.map_or(V::Null, V::Text)).collect())
                    }),
                "nums" => row
                    .get::<_, Option<Vec<Option<i32>>>>(i)
                    .map_or(V::Null, |l| {
                        V::List(
                            l.into_iter()
                                .map(|e| e.map_or(V::Null, |x| V::Int(x.into())))
                                .collect(),
                        )
                    }),
                _ => row.get::<_, Option<i64>>(i).map_or(V::Null, V::Int),
            };
            values.push(v);
        }
        out.insert(row.get::<_, String>(0), values);
    }
    out
}

/// One Arrow value as the comparison sees it.
fn value(a: &dyn Array, i: usize, name: &str) -> V {
    if a.is_null(i) {
        return V::Null;
    }
    match a.data_type() {
        DataType::Int16 => V::Int(
            a.as_primitive::<arrow::datatypes::Int16Type>()
                .value(i)
                .into(),
        ),
        DataType::Int32 => V::Int(
            a.as_primitive::<arrow::datatypes::Int32Type>()
                .value(i)
                .into(),
        ),
        DataType::Int64 => V::Int(a.as_primitive::<arrow::datatypes::Int64Type>().value(i)),
        DataType::Date32 => V::Int(
            a.as_primitive::<arrow::datatypes::Date32Type>()
                .value(i)
                .into(),
        ),
        DataType::Timestamp(_, _) => V::Int(
            a.as_primitive::<arrow::datatypes::TimestampMicrosecondType>()
                .value(i),
        ),
        DataType::Float32 => V::Float(
            f64::from(a.as_primitive::<arrow::datatypes::Float32Type>().value(i)).to_bits(),
        ),
        DataType::Float64 => V::Float(
            a.as_primitive::<arrow::datatypes::Float64Type>()
                .value(i)
                .to_bits(),
        ),
        DataType::Boolean => V::Bool(a.as_boolean().value(i)),
        DataType::Decimal128(_, _) | DataType::Decimal64(_, _) => {
            V::Text(arrow::util::display::array_value_to_string(a, i).unwrap())
        }
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            let s = arrow::util::display::array_value_to_string(a, i).unwrap();
            if name == "doc" {
                V::Json(serde_json::from_str(&s).unwrap())
            } else {
                V::Text(s)
            }
        }
        DataType::FixedSizeBinary(16) => V::Text(
            uuid::Uuid::from_slice(a.as_fixed_size_binary().value(i))
                .unwrap()
                .to_string(),
        ),
        DataType::Binary => V::Bytes(a.as_binary::<i32>().value(i).to_vec()),
        DataType::LargeBinary => V::Bytes(a.as_binary::<i64>().value(i).to_vec()),
        DataType::List(_) => {
            let l = a.as_list::<i32>().value(i);
            V::List((0..l.len()).map(|j| value(l.as_ref(), j, name)).collect())
        }
        t => panic!("column {name}: unexpected type {t}"),
    }
}

/// The lake's current state of source `t` read through `lakecdc query`.
async fn lake_state(rig: &Rig, t: &Table) -> BTreeMap<String, Vec<V>> {
    let out = rig.work.path().join(format!("{}.parquet", t.name));
    let cache = rig.work.path().join("cache");
    let key = t
        .key
        .iter()
        .map(|k| format!("CAST(\"{k}\" AS VARCHAR)"))
        .collect::<Vec<_>>()
        .join(" || '|' || ");
    let cols: Vec<String> = COLUMNS
        .iter()
        .map(|c| match c.0 {
            // A column named like a system column is exported as pg_<name>.
            "deleted_at" => "\"pg_deleted_at\"".to_string(),
            n => format!("\"{n}\""),
        })
        .collect();
    let sql = format!("SELECT {key} AS k, {} FROM {}", cols.join(", "), t.name);
    let opts = options(rig, &sql, Format::Parquet, &out, &cache);
    lakecdc::query::run(&rig.job_context(), &opts)
        .await
        .unwrap();
    read_rows(&out)
}

/// Every batch of the Parquet file at `path`.
fn parquet_batches(path: &Path) -> Vec<arrow::record_batch::RecordBatch> {
    let file = std::fs::File::open(path).unwrap();
    parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn read_rows(path: &Path) -> BTreeMap<String, Vec<V>> {
    let mut out = BTreeMap::new();
    for batch in parquet_batches(path) {
        for i in 0..batch.num_rows() {
            let k = batch.column(0).as_string::<i32>().value(i).to_string();
            let values: Vec<V> = COLUMNS
                .iter()
                .enumerate()
                .map(|(c, (name, _, _))| value(batch.column(c + 1).as_ref(), i, name))
                .collect();
            assert!(
                out.insert(k.clone(), values).is_none(),
                "one row per key: {k}"
            );
        }
    }
    out
}

pub(crate) async fn assert_equal(rig: &Rig, t: &Table, when: &str) -> usize {
    let pg = pg_state(rig, t).await;
    let lake = lake_state(rig, t).await;
    let missing: Vec<&String> = pg.keys().filter(|k| !lake.contains_key(*k)).collect();
    let extra: Vec<&String> = lake.keys().filter(|k| !pg.contains_key(*k)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{} {when}: missing from the lake {missing:?}, only in the lake {extra:?}",
        t.name
    );
    for (k, v) in &pg {
        for ((name, _, _), (want, got)) in COLUMNS.iter().zip(v.iter().zip(&lake[k])) {
            assert_eq!(got, want, "{} {when}: row {k} column {name}", t.name);
        }
    }
    pg.len()
}

/// One random statement on `t`: single-row or bulk insert, multi-row update, a key update,
/// delete.
pub(crate) async fn random_statement(
    client: &tokio_postgres::Client,
    t: &Table,
    r: &mut Rng,
    next: &mut i64,
) {
    let cols: Vec<&str> = COLUMNS.iter().map(|c| c.0).collect();
    let key_cols = t.key.join(", ");
    let sql = match r.below(6) {
        0 => {
            *next += 1;
            format!(
                "INSERT INTO {} ({key_cols}, {}) VALUES ({}, {})",
                t.name,
                cols.join(", "),
                (t.new_key)(&next.to_string()),
                payload_sql(r, &next.to_string())
            )
        }
        1 => {
            let from = *next + 1;
            *next += 1 + r.below(40) as i64;
            format!(
                "INSERT INTO {} ({key_cols}, {}) SELECT {}, {} FROM generate_series({from}, {next}) g",
                t.name,
                cols.join(", "),
                (t.new_key)("g"),
                payload_sql(r, "g")
            )
        }
        2 | 3 => {
            let m = 2 + r.below(5);
            let set: Vec<String> = cols
                .iter()
                .zip(payload_exprs(r, "(i4 + 1)"))
                .filter(|(c, _)| {
                    matches!(
                        **c,
                        "note" | "amount" | "at_tz" | "tags" | "doc" | "f4" | "raw"
                    )
                })
                .map(|(c, e)| format!("{c} = {e}"))
                .collect();
            format!(
                "UPDATE {} SET {} WHERE abs(hashtext({}::text)) % {m} = {}",
                t.name,
                set.join(", "),
                t.key[t.key.len() - 1],
                r.below(m)
            )
        }
        4 => {
            // A key update: the old key is a delete, the new one an insert.
            *next += 1;
            let last = t.key[t.key.len() - 1];
            match t.name {
                "t_uuid" => format!(
                    "UPDATE {0} SET id = md5('moved' || {next})::uuid WHERE id = (SELECT id FROM {0} ORDER BY id LIMIT 1)",
                    t.name
                ),
                _ => format!(
                    "UPDATE {0} SET {last} = {last} + 1000000 WHERE {last} = (SELECT min({last}) FROM {0} WHERE {last} < 1000000)",
                    t.name
                ),
            }
        }
        _ => format!(
            "DELETE FROM {} WHERE abs(hashtext({}::text)) % 9 = {}",
            t.name,
            t.key[t.key.len() - 1],
            r.below(9)
        ),
    };
    client
        .batch_execute(&sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn flush(rig: &Rig, name: &str) -> lakecdc::flush::SchemaReport {
    let opts = lakecdc::flush::FlushOptions {
        schemas: vec![name.into()],
        ..rig.opts.clone()
    };
    let report = lakecdc::flush::run(&rig.ctx, &opts).await.unwrap();
    report.schemas.into_iter().next().unwrap()
}

/// A flush of source `name` whose `before_mark` hook runs `sql` on another connection (a
/// write racing the mark, or a fault planted for it).
async fn flush_running_before_mark(
    rig: &Rig,
    name: &str,
    sql: &'static str,
) -> lakecdc::flush::FlushReport {
    let other = std::sync::Arc::new(rig.db.client().await);
    let hooks = FlushHooks {
        before_mark: Some(std::sync::Arc::new(move |_, _| {
            let other = other.clone();
            Box::pin(async move { other.batch_execute(sql).await.unwrap() })
        })),
        ..FlushHooks::default()
    };
    let opts = lakecdc::flush::FlushOptions {
        schemas: vec![name.into()],
        ..rig.opts.clone()
    };
    lakecdc::flush::run_with_hooks(&rig.ctx, &opts, &hooks)
        .await
        .unwrap()
}

/// An init of source `name` that must succeed.
async fn init_source(rig: &Rig, name: &str) {
    let init = lakecdc::init::run(&rig.job_context(), &init_opts(rig, name))
        .await
        .unwrap();
    assert_eq!(init.exit_code(), 0, "{init:?}");
}

/// Asserts that flush report `f` failed with a reason saying each of `says`.
fn refused(f: &lakecdc::flush::SchemaReport, says: &[&str]) {
    assert_eq!(f.outcome, Outcome::Failed, "{f:?}");
    let reason = f.reason.clone().unwrap_or_default();
    assert!(says.iter().all(|s| reason.contains(s)), "{reason}");
}

fn init_opts(rig: &Rig, name: &str) -> InitOptions {
    InitOptions {
        schemas: vec![name.into()],
        replace_delta: true,
        max_file_rows: 10,
        page_rows: 17,
        work_dir: rig.opts.work_dir.clone(),
        ..InitOptions::default()
    }
}

/// LAKECDC_TABLE_SEED replays another sequence of statements, to hunt by hand.
#[tokio::test]
async fn oracle_random_statements_flush_init_compact_equal_the_tables_typed() {
    let rig = rig(LakeKind::S3).await;
    let client = rig.db.client().await;
    let seed = std::env::var("LAKECDC_TABLE_SEED").map_or(24, |s| s.parse().unwrap());
    let mut r = Rng::new(seed);
    for t in &TABLES {
        client.batch_execute(&create_sql(t)).await.unwrap();
        // Rows from before the attach: only init exports them.
        client
            .batch_execute(&insert_sql(t, &(t.new_key)("g"), 1, 30, r.next()))
            .await
            .unwrap();
        attach(&rig, t.name);
    }
    for t in &TABLES {
        let init = lakecdc::init::run(&rig.job_context(), &init_opts(&rig, t.name))
            .await
            .unwrap();
        assert_eq!(init.schemas[0].rows, 30, "{init:?}");
        assert_eq!(init.schemas[0].files.len(), 3, "10 rows a file: {init:?}");
        // Base files in row-id order with disjoint ranges (the base-tier invariant).
        let id = init.schemas[0].schema_id;
        let m = crate::support::oracle::manifest_json(
            rig.store.as_ref(),
            &format!("manifest/{id}.json"),
        )
        .await
        .unwrap();
        let mut ranges: Vec<(String, String)> = m["files"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["tier"] == "base")
            .map(|f| {
                (
                    f["row_id_min"].as_str().unwrap().to_string(),
                    f["row_id_max"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        ranges.sort();
        assert_eq!(ranges.len(), 3);
        for w in ranges.windows(2) {
            assert!(
                w[0].0 <= w[0].1 && w[0].1 < w[1].0,
                "{} ranges overlap: {ranges:?}",
                t.name
            );
        }
        assert_equal(&rig, t, "after the first init").await;
    }
    let mut next = 100;
    for round in 0..6 {
        for t in &TABLES {
            for _ in 0..8 {
                random_statement(&client, t, &mut r, &mut next).await;
            }
            let f = flush(&rig, t.name).await;
            assert_eq!(f.outcome, Outcome::Flushed, "{f:?}");
            assert_eq!(f.rows_left_dirty, 0, "{f:?}");
            let n = assert_equal(&rig, t, &format!("after flush {round}")).await;
            assert!(n > 0);
            if round == 2 {
                let init = lakecdc::init::run(&rig.job_context(), &init_opts(&rig, t.name))
                    .await
                    .unwrap();
                assert_eq!(init.exit_code(), 0, "{init:?}");
                assert_equal(&rig, t, "after init").await;
            }
            if round == 4 {
                let c = lakecdc::compact::run(
                    &rig.job_context(),
                    &CompactOptions {
                        schemas: vec![t.name.into()],
                        work_dir: rig.opts.work_dir.clone(),
                        ..CompactOptions::default()
                    },
                )
                .await
                .unwrap();
                assert_eq!(c.exit_code(), 0, "{c:?}");
                assert_equal(&rig, t, "after compaction").await;
            }
        }
    }
    // Nothing is left dirty, and every table's lake equals it.
    assert_eq!(touches_pending(&client).await, 0);
}

/// A rig whose `t_big` is attached and holds rows 1..=5, flushed.
async fn five_rows_flushed() -> (Rig, tokio_postgres::Client) {
    let rig = rig(LakeKind::Local).await;
    let client = rig.db.client().await;
    let t = &TABLES[1];
    client.batch_execute(&create_sql(t)).await.unwrap();
    attach(&rig, t.name);
    client
        .batch_execute(&insert_sql(t, "g", 1, 5, 1))
        .await
        .unwrap();
    assert_eq!(flush(&rig, "t_big").await.rows_exported, 5);
    (rig, client)
}

#[tokio::test]
async fn a_key_update_moves_the_row_and_truncate_stops_flush_until_init() {
    let (rig, client) = five_rows_flushed().await;
    let t = &TABLES[1];
    client
        .batch_execute("UPDATE t_big SET id = 50 WHERE id = 2")
        .await
        .unwrap();
    let f = flush(&rig, "t_big").await;
    assert_eq!(f.rows_exported, 2, "a tombstone and a new row: {f:?}");
    let lake = lake_state(&rig, t).await;
    assert!(
        !lake.contains_key("2") && lake.contains_key("50"),
        "{:?}",
        lake.keys()
    );
    assert_equal(&rig, t, "after the key update").await;

    client.batch_execute("TRUNCATE t_big").await.unwrap();
    // Nothing is dirty after a TRUNCATE, yet a flush of every source says the lake is behind.
    let all = lakecdc::flush::run(&rig.ctx, &rig.opts).await.unwrap();
    let f = all.schemas.iter().find(|s| s.schema == "t_big").unwrap();
    assert_eq!((f.outcome, f.dirty_rows), (Outcome::Failed, 0), "{f:?}");
    let inspect = run_bin(&rig, &["inspect", "--json", "--schema", "t_big"]);
    let text = String::from_utf8_lossy(&inspect.stdout);
    assert!(
        text.contains("refused: ") && text.contains("truncated"),
        "{text}"
    );
    client
        .batch_execute(&insert_sql(t, "g", 7, 9, 2))
        .await
        .unwrap();
    let f = flush(&rig, "t_big").await;
    assert_eq!(f.outcome, Outcome::Failed, "{f:?}");
    let reason = f.reason.unwrap();
    assert!(
        reason.contains("truncated") && reason.contains("lakecdc init --schema t_big"),
        "{reason}"
    );
    // Through the binary: exit 1 and the instruction on stderr.
    let out = run_bin(&rig, &["flush", "--schema", "t_big", "--force"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("lakecdc init --schema t_big"), "{err}");
    let init = lakecdc::init::run(&rig.job_context(), &init_opts(&rig, "t_big"))
        .await
        .unwrap();
    assert_eq!(init.exit_code(), 0, "{init:?}");
    assert_eq!(init.schemas[0].rows, 3);
    // The slots written before the truncate point at rows that are gone: tombstones.
    let f = flush(&rig, "t_big").await;
    assert_ne!(f.outcome, Outcome::Failed, "{f:?}");
    assert_eq!(assert_equal(&rig, t, "after init and flush").await, 3);
    client
        .batch_execute("UPDATE t_big SET note = 'after' WHERE id = 8")
        .await
        .unwrap();
    flush(&rig, "t_big").await;
    assert_equal(&rig, t, "after a write following the init").await;
}

/// docs/hazards.md L86: every write is recorded or the flush refuses. Writes under
/// `session_replication_role = replica` are captured; writes while the capture was detached,
/// disabled or gone with its table (dropped and made again) make flush refuse until the
/// capture is attached again and an init rebuilds the lake.
#[tokio::test]
async fn writes_the_capture_did_not_record_stop_flush_until_attach_and_init() {
    let (rig, client) = five_rows_flushed().await;
    let t = &TABLES[1];
    // A subscription's apply or `pg_restore --disable-triggers` writes as a replica.
    client
        .batch_execute(
            "SET session_replication_role = replica; UPDATE t_big SET note = 'replica' WHERE id = 1; RESET session_replication_role",
        )
        .await
        .unwrap();
    assert_eq!(flush(&rig, "t_big").await.rows_exported, 1);
    assert_equal(&rig, t, "after a replica's write").await;

    // Detached, written, attached again: the writes in between were never recorded.
    let out = run_bin(&rig, &["detach", "t_big"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    client
        .batch_execute(
            "UPDATE t_big SET note = 'unseen' WHERE id <= 2; DELETE FROM t_big WHERE id = 5",
        )
        .await
        .unwrap();
    attach(&rig, "t_big");
    client
        .batch_execute("UPDATE t_big SET note = 'seen' WHERE id = 3")
        .await
        .unwrap();
    refused(
        &flush(&rig, "t_big").await,
        &[
            "went unrecorded",
            "lakecdc init --schema t_big --replace-delta",
        ],
    );
    init_source(&rig, "t_big").await;
    flush(&rig, "t_big").await;
    assert_equal(&rig, t, "after attach and init").await;

    // A trigger disabled: refused naming the fix; attached again (re-armed), then an init.
    client
        .batch_execute("ALTER TABLE t_big DISABLE TRIGGER lakecdc_capture_update; UPDATE t_big SET note = 'off' WHERE id = 4")
        .await
        .unwrap();
    refused(
        &flush(&rig, "t_big").await,
        &[
            "1 of the 4 capture triggers",
            "missing or disabled",
            "lakecdc attach",
        ],
    );
    attach(&rig, "t_big");
    refused(&flush(&rig, "t_big").await, &["went unrecorded"]);
    init_source(&rig, "t_big").await;
    flush(&rig, "t_big").await;
    assert_equal(&rig, t, "after the disabled trigger").await;

    // The table dropped and made again: its triggers went with it, the function stayed.
    client
        .batch_execute(&format!("DROP TABLE t_big; {}", create_sql(t)))
        .await
        .unwrap();
    client
        .batch_execute(&insert_sql(t, "g", 1, 3, 9))
        .await
        .unwrap();
    refused(
        &flush(&rig, "t_big").await,
        &["4 of the 4 capture triggers", "lakecdc attach"],
    );
    attach(&rig, "t_big");
    init_source(&rig, "t_big").await;
    assert_eq!(flush(&rig, "t_big").await.outcome, Outcome::NothingToDo);
    assert_equal(&rig, t, "after the table was made again").await;
}

/// docs/hazards.md L89: a table attached holding rows is not in the lake until an init; a
/// flush alone would publish the touched rows only, a lake that looks whole and is not. A
/// table attached empty needs no init: every row it will hold is touched.
#[tokio::test]
async fn a_table_attached_with_rows_is_flushed_only_after_an_init() {
    let rig = rig(LakeKind::Local).await;
    let client = rig.db.client().await;
    client
        .batch_execute(
            "CREATE TABLE tfull (id int PRIMARY KEY, v int);
             INSERT INTO tfull SELECT g, g FROM generate_series(1, 10) g;
             CREATE TABLE tempty (id int PRIMARY KEY, v int)",
        )
        .await
        .unwrap();
    attach(&rig, "tfull");
    attach(&rig, "tempty");
    client
        .batch_execute("UPDATE tfull SET v = 100 WHERE id = 1; INSERT INTO tempty VALUES (1, 1)")
        .await
        .unwrap();
    refused(
        &flush(&rig, "tfull").await,
        &[
            "attached holding rows no init has exported yet",
            "lakecdc init --schema tfull",
        ],
    );
    assert_eq!(flush(&rig, "tempty").await.rows_exported, 1);
    init_source(&rig, "tfull").await;
    assert_ne!(flush(&rig, "tfull").await.outcome, Outcome::Failed);
    assert_eq!(
        lake_csv(&rig, "SELECT count(*) AS n, sum(v) AS s FROM tfull").await,
        "n,s\n10,154\n"
    );
}

/// docs/hazards.md L87: a hashed row id is the key's text, which a type change of the key can
/// change while its lake type stays (`char(5)` pads, `text` does not): flush refuses until an
/// init rewrites the lake with the new ids, instead of leaving the old copies live.
#[tokio::test]
async fn a_key_type_change_that_keeps_the_lake_type_waits_for_init() {
    let rig = rig(LakeKind::Local).await;
    let client = rig.db.client().await;
    client
        .batch_execute(
            "CREATE TABLE tchar (k char(5) PRIMARY KEY, v int);
             INSERT INTO tchar VALUES ('c1', 1), ('c2', 2), ('c3', 3)",
        )
        .await
        .unwrap();
    attach(&rig, "tchar");
    init_source(&rig, "tchar").await;
    client
        .batch_execute("ALTER TABLE tchar ALTER COLUMN k TYPE text; UPDATE tchar SET v = v + 10 WHERE k = 'c1'")
        .await
        .unwrap();
    refused(
        &flush(&rig, "tchar").await,
        &[
            "k (a key column): character(5) → text",
            "lakecdc init --schema tchar --replace-delta",
        ],
    );
    init_source(&rig, "tchar").await;
    flush(&rig, "tchar").await;
    assert_eq!(
        lake_csv(&rig, "SELECT k, v FROM tchar ORDER BY k").await,
        "k,v\nc1,11\nc2,2\nc3,3\n"
    );
}

/// docs/hazards.md L88: a column added with a default (or generated) fills every row without
/// a touch, and a renamed one leaves its values under the old name: flush refuses until an
/// init rewrites the lake, where a plain nullable column simply starts in new files.
#[tokio::test]
async fn a_column_added_with_a_default_or_renamed_waits_for_init() {
    let rig = rig(LakeKind::Local).await;
    let client = rig.db.client().await;
    client
        .batch_execute(
            "CREATE TABLE tdef (id int PRIMARY KEY, v int, w text);
             INSERT INTO tdef SELECT g, g, 'w' || g FROM generate_series(1, 4) g",
        )
        .await
        .unwrap();
    attach(&rig, "tdef");
    init_source(&rig, "tdef").await;
    let says = |what: &'static str| [what, "lakecdc init --schema tdef --replace-delta"];
    client
        .batch_execute("ALTER TABLE tdef ADD COLUMN d int NOT NULL DEFAULT 5; UPDATE tdef SET v = 10 WHERE id = 1")
        .await
        .unwrap();
    refused(
        &flush(&rig, "tdef").await,
        &says("column d was added with a default or as generated"),
    );
    init_source(&rig, "tdef").await;
    flush(&rig, "tdef").await;
    assert_eq!(
        lake_csv(&rig, "SELECT id, v, d FROM tdef ORDER BY id").await,
        "id,v,d\n1,10,5\n2,2,5\n3,3,5\n4,4,5\n"
    );
    client
        .batch_execute("ALTER TABLE tdef RENAME COLUMN w TO w2")
        .await
        .unwrap();
    refused(
        &flush(&rig, "tdef").await,
        &says("column w2 appeared while column w is gone"),
    );
    init_source(&rig, "tdef").await;
    flush(&rig, "tdef").await;
    assert_eq!(
        lake_csv(&rig, "SELECT id, w2 FROM tdef ORDER BY id").await,
        "id,w2\n1,w1\n2,w2\n3,w3\n4,w4\n"
    );
    // A plain nullable column starts in new files: no init.
    client
        .batch_execute("ALTER TABLE tdef ADD COLUMN n int; UPDATE tdef SET n = 7 WHERE id = 2")
        .await
        .unwrap();
    assert_eq!(flush(&rig, "tdef").await.outcome, Outcome::Flushed);
    assert_eq!(
        lake_csv(&rig, "SELECT id, n FROM tdef ORDER BY id").await,
        "id,n\n1,\n2,7\n3,\n4,\n"
    );
}

#[tokio::test]
async fn writes_racing_a_flush_stay_dirty_and_go_out_next_time() {
    let rig = rig(LakeKind::Local).await;
    let client = rig.db.client().await;
    let t = &TABLES[2];
    client.batch_execute(&create_sql(t)).await.unwrap();
    attach(&rig, t.name);
    let insert = |from: i64, to: i64| insert_sql(t, "'r', g", from, to, from as u64);
    client.batch_execute(&insert(1, 10)).await.unwrap();
    // A writer whose transaction is open while the flush selects: its rows are not seen.
    let late = rig.db.client().await;
    late.batch_execute(&format!("BEGIN; {}", insert(11, 12)))
        .await
        .unwrap();
    // A write between the manifest commit and the mark: its new version is not marked.
    let f = flush_running_before_mark(
        &rig,
        "t_comp",
        "UPDATE t_comp SET note = 'raced' WHERE n = 3",
    )
    .await;
    let f = &f.schemas[0];
    assert_eq!(f.rows_exported, 10, "{f:?}");
    // The mark deletes the touches the flush read; the raced write is a touch of its own.
    assert_eq!(f.rows_marked, 10, "{f:?}");
    late.batch_execute("COMMIT").await.unwrap();
    let dirty: i64 = client
        .query_one("SELECT count(DISTINCT row_id) FROM lakecdc_touch", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(dirty, 3, "the raced row and the late writer's two");
    let f = flush(&rig, "t_comp").await;
    assert_eq!(f.rows_exported, 3, "{f:?}");
    assert_eq!(f.rows_left_dirty, 0);
    assert_eq!(assert_equal(&rig, t, "after the second flush").await, 12);
}

#[tokio::test]
async fn verify_source_proves_a_table_source_and_finds_rows_changed_behind_the_capture() {
    use lakecdc::verify::{Outcome as Verified, SourceOptions, VerifyOptions};
    let rig = rig(LakeKind::Local).await;
    let client = rig.db.client().await;
    let t = &TABLES[2];
    client.batch_execute(&create_sql(t)).await.unwrap();
    let cols: Vec<&str> = COLUMNS.iter().map(|c| c.0).collect();
    client
        .batch_execute(&insert_sql(t, "'r', g", 1, 40, 5))
        .await
        .unwrap();
    attach(&rig, t.name);
    let init = lakecdc::init::run(&rig.job_context(), &init_opts(&rig, "t_comp"))
        .await
        .unwrap();
    assert_eq!(init.exit_code(), 0);
    client
        .batch_execute("UPDATE t_comp SET note = 'x' WHERE n <= 5; DELETE FROM t_comp WHERE n = 6")
        .await
        .unwrap();
    flush(&rig, "t_comp").await;
    // One more write, left dirty: not a divergence.
    client
        .batch_execute("UPDATE t_comp SET note = 'y' WHERE n = 7")
        .await
        .unwrap();
    let verify = |deep: bool| VerifyOptions {
        schemas: vec!["t_comp".into()],
        parallelism: 2,
        work_dir: rig.opts.work_dir.clone(),
        source: Some(SourceOptions {
            deep,
            repair: false,
            max_ids: 100,
            page_rows: 7,
            readers: 2,
        }),
        engine: Default::default(),
    };
    let v = lakecdc::verify::run(&rig.job_context(), &verify(false))
        .await
        .unwrap();
    let s = &v.schemas[0];
    assert_eq!(s.outcome, Verified::Intact, "{s:?}");
    let check = s.source.as_ref().unwrap();
    assert_eq!((check.source_rows, check.dirty_rows), (39, 1), "{check:?}");
    // Behind the capture's back (its touches deleted): a row deleted, one inserted.
    client
        .batch_execute(&format!(
            "BEGIN; DELETE FROM t_comp WHERE n = 10; \
             INSERT INTO t_comp (region, n, {}) SELECT 'r', 99, {}; {BEHIND}",
            cols.join(", "),
            payload_sql(&mut Rng::new(6), "99")
        ))
        .await
        .unwrap();
    let v = lakecdc::verify::run(&rig.job_context(), &verify(false))
        .await
        .unwrap();
    let s = &v.schemas[0];
    assert_eq!(s.outcome, Verified::Diverged, "{s:?}");
    let check = s.source.as_ref().unwrap();
    assert_eq!(
        (check.extra.count, check.missing.count),
        (1, 1),
        "{check:?}"
    );
    // --deep compares values too: the same two rows, and no value divergence.
    let v = lakecdc::verify::run(&rig.job_context(), &verify(true))
        .await
        .unwrap();
    let check = v.schemas[0].source.as_ref().unwrap();
    assert_eq!(
        (
            check.extra.count,
            check.missing.count,
            check.values.as_ref().unwrap().count
        ),
        (1, 1, 0),
        "{check:?}"
    );
}

#[tokio::test]
async fn a_new_column_appears_in_new_files_and_a_type_change_waits_for_init() {
    let rig = rig(LakeKind::Local).await;
    let client = rig.db.client().await;
    client
        .batch_execute(
            "CREATE TABLE shapes (id bigint PRIMARY KEY, qty integer, secret text, \"Deleted_At\" bigint);
             INSERT INTO shapes SELECT g, g, 'pw' || g, g FROM generate_series(1, 4) g;",
        )
        .await
        .unwrap();
    // `attach shapes --exclude-columns <column>`.
    let attach_excluding = |column: &str| {
        harness::bin()
            .args([
                "attach",
                "shapes",
                "--exclude-columns",
                column,
                "--pg-url",
                &rig.db.url,
            ])
            .output()
            .unwrap()
    };
    let out = attach_excluding("secret");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let init = lakecdc::init::run(&rig.job_context(), &init_opts(&rig, "shapes"))
        .await
        .unwrap();
    assert_eq!(init.exit_code(), 0, "{init:?}");
    let query = |sql: &str| {
        let out = rig.work.path().join("q.parquet");
        let opts = options(
            &rig,
            sql,
            Format::Parquet,
            &out,
            &rig.work.path().join("cache"),
        );
        let ctx = rig.job_context();
        async move {
            lakecdc::query::run(&ctx, &opts).await.unwrap();
            let mut rows = Vec::new();
            for b in parquet_batches(&out) {
                for i in 0..b.num_rows() {
                    rows.push(
                        (0..b.num_columns())
                            .map(|c| {
                                arrow::util::display::array_value_to_string(b.column(c), i).unwrap()
                            })
                            .collect::<Vec<_>>()
                            .join(","),
                    );
                }
            }
            rows
        }
    };
    // The excluded column is not in the lake; a column named like a system column is pg_<name>.
    let columns = query(
        "SELECT string_agg(column_name, ' ' ORDER BY column_name) FROM (DESCRIBE SELECT * FROM shapes)",
    )
    .await;
    assert!(
        columns[0].contains("pg_Deleted_At")
            && columns[0].contains("qty")
            && !columns[0].contains("secret"),
        "{columns:?}"
    );
    // A registry made by an earlier build has no excluded_attnums: flush excludes by name, and
    // attaching again (the same column) adds and fills it.
    client
        .batch_execute(
            "ALTER TABLE lakecdc_sources DROP COLUMN excluded_attnums;
             UPDATE shapes SET qty = qty WHERE id = 4",
        )
        .await
        .unwrap();
    assert_eq!(flush(&rig, "shapes").await.outcome, Outcome::Flushed);
    assert!(attach_excluding("secret").status.success());
    let attnums: String = client
        .query_one(
            "SELECT excluded_attnums::text FROM lakecdc_sources WHERE name = 'shapes'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(attnums, "{3}");
    // A column added later appears in new files; older rows read it as NULL.
    client
        .batch_execute("ALTER TABLE shapes ADD COLUMN label text; UPDATE shapes SET label = 'new' WHERE id = 2")
        .await
        .unwrap();
    assert_eq!(flush(&rig, "shapes").await.outcome, Outcome::Flushed);
    let rows = query("SELECT id, label FROM shapes ORDER BY id").await;
    assert_eq!(rows, vec!["1,", "2,new", "3,", "4,"]);
    // An excluded column renamed stays excluded (docs/hazards.md L77): neither its new name
    // nor its values reach the lake.
    client
        .batch_execute(
            "ALTER TABLE shapes RENAME COLUMN secret TO passcode;
             UPDATE shapes SET passcode = 'pw-new', label = 'renamed' WHERE id = 1",
        )
        .await
        .unwrap();
    assert_eq!(flush(&rig, "shapes").await.outcome, Outcome::Flushed);
    let columns = query(
        "SELECT string_agg(column_name, ' ' ORDER BY column_name) FROM (DESCRIBE SELECT * FROM shapes)",
    )
    .await;
    assert!(
        !columns[0].contains("passcode") && !columns[0].contains("secret"),
        "{columns:?}"
    );
    let rows = query("SELECT id, label FROM shapes ORDER BY id").await;
    assert_eq!(rows, vec!["1,renamed", "2,new", "3,", "4,"]);
    // Attaching it again names the column by its new name; the old one is gone.
    assert!(!attach_excluding("secret").status.success());
    let out = attach_excluding("passcode");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let recorded: String = client
        .query_one(
            "SELECT excluded_columns::text || ' ' || excluded_attnums::text FROM lakecdc_sources WHERE name = 'shapes'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(recorded, "{passcode} {3}");
    // A type change is refused, naming the column, until init rewrites the lake.
    client
        .batch_execute("ALTER TABLE shapes ALTER COLUMN qty TYPE bigint; UPDATE shapes SET qty = 5000000000 WHERE id = 3")
        .await
        .unwrap();
    let f = flush(&rig, "shapes").await;
    assert_eq!(f.outcome, Outcome::Failed, "{f:?}");
    let reason = f.reason.unwrap();
    assert!(
        reason.contains("qty: INT32 → INT64") && reason.contains("init --schema shapes"),
        "{reason}"
    );
    let init = lakecdc::init::run(&rig.job_context(), &init_opts(&rig, "shapes"))
        .await
        .unwrap();
    assert_eq!(init.exit_code(), 0, "{init:?}");
    assert_eq!(flush(&rig, "shapes").await.rows_left_dirty, 0);
    let rows = query("SELECT id, qty, label FROM shapes ORDER BY id").await;
    assert_eq!(
        rows,
        vec!["1,1,renamed", "2,2,new", "3,5000000000,", "4,4,"]
    );
    let columns = query(
        "SELECT string_agg(column_name, ' ' ORDER BY column_name) FROM (DESCRIBE SELECT * FROM shapes)",
    )
    .await;
    assert!(!columns[0].contains("passcode"), "{columns:?}");
}

/// The lake's version of each row of `t_big`: id → `changed_at`.
async fn lake_versions(rig: &Rig) -> BTreeMap<i64, i64> {
    let out = rig.work.path().join("versions.parquet");
    let cache = rig.work.path().join("cache");
    let opts = options(
        rig,
        "SELECT \"id\", \"changed_at\" FROM t_big",
        Format::Parquet,
        &out,
        &cache,
    );
    lakecdc::query::run(&rig.job_context(), &opts)
        .await
        .unwrap();
    let mut versions = BTreeMap::new();
    for batch in parquet_batches(&out) {
        let ids = batch
            .column(0)
            .as_primitive::<arrow::datatypes::Int64Type>();
        let at = batch
            .column(1)
            .as_primitive::<arrow::datatypes::Int64Type>();
        for i in 0..batch.num_rows() {
            versions.insert(ids.value(i), at.value(i));
        }
    }
    versions
}

#[tokio::test]
async fn every_export_of_a_row_beats_the_last_even_when_the_clock_goes_back() {
    let (rig, client) = five_rows_flushed().await;
    let t = &TABLES[1];
    let first = lake_versions(&rig).await;
    assert_eq!(first.len(), 5);
    // Rows written again with touches dated an hour back (a clock that went back): their new
    // versions still beat the exported ones, or the lake would keep the old copies.
    let back = "UPDATE lakecdc_touch SET touched_at = touched_at - 3600000";
    client
        .batch_execute(&format!(
            "UPDATE t_big SET note = 'later' WHERE id <= 3; {back}"
        ))
        .await
        .unwrap();
    let f = flush(&rig, t.name).await;
    assert_eq!((f.rows_exported, f.rows_marked), (3, 3), "{f:?}");
    let second = lake_versions(&rig).await;
    for id in 1..=5 {
        if id <= 3 {
            assert!(second[&id] > first[&id], "row {id}: {second:?} {first:?}");
        } else {
            assert_eq!(second[&id], first[&id]);
        }
    }
    assert_equal(&rig, t, "after a flush of back-dated touches").await;
    // Init gives every row one version above all exported ones; a back-dated write after it
    // still beats it.
    let init = lakecdc::init::run(&rig.job_context(), &init_opts(&rig, t.name))
        .await
        .unwrap();
    assert_eq!(init.exit_code(), 0, "{init:?}");
    let third = lake_versions(&rig).await;
    let v = third[&1];
    assert!(third.values().all(|x| *x == v), "{third:?}");
    assert!(v > *second.values().max().unwrap());
    client
        .batch_execute(&format!("DELETE FROM t_big WHERE id = 5; {back}"))
        .await
        .unwrap();
    assert_eq!(flush(&rig, t.name).await.rows_exported, 1);
    let fourth = lake_versions(&rig).await;
    assert!(
        !fourth.contains_key(&5),
        "the tombstone beats the base: {fourth:?}"
    );
    assert_equal(&rig, t, "after a back-dated delete following init").await;
}

/// `sql` over the lake through `lakecdc query`, as CSV.
async fn lake_csv(rig: &Rig, sql: &str) -> String {
    let out = rig.work.path().join("out.csv");
    let cache = rig.work.path().join("cache");
    let opts = options(rig, sql, Format::Csv, &out, &cache);
    lakecdc::query::run(&rig.job_context(), &opts)
        .await
        .unwrap();
    std::fs::read_to_string(&out).unwrap()
}

#[tokio::test]
async fn the_snapshot_not_the_order_of_touches_decides_whether_a_row_is_live() {
    let rig = rig(LakeKind::Local).await;
    let client = rig.db.client().await;
    client
        .batch_execute(
            "CREATE TABLE d (id bigint PRIMARY KEY DEFERRABLE INITIALLY DEFERRED, note text);
             INSERT INTO d VALUES (1, 'old'), (2, 'two');",
        )
        .await
        .unwrap();
    attach(&rig, "d");
    init_source(&rig, "d").await;
    // A writer inserts key 1 again (the deferred key check waits for its commit): its touch
    // takes the lower number. Another deletes the old row 1 and commits first: its touch, the
    // higher number, says gone — yet the table ends with row 1.
    let writer = rig.db.client().await;
    writer
        .batch_execute("BEGIN; INSERT INTO d VALUES (1, 'new')")
        .await
        .unwrap();
    client
        .batch_execute("DELETE FROM d WHERE note = 'old'")
        .await
        .unwrap();
    writer.batch_execute("COMMIT").await.unwrap();
    // A key deleted and inserted again in one transaction, and one deleted in one flush and
    // inserted again before the next.
    client
        .batch_execute(
            "BEGIN; DELETE FROM d WHERE id = 2; INSERT INTO d VALUES (2, 'again'); COMMIT;
             INSERT INTO d VALUES (3, 'three');",
        )
        .await
        .unwrap();
    assert_eq!(flush(&rig, "d").await.rows_exported, 3);
    let all = "SELECT id, note FROM d ORDER BY id";
    assert_eq!(
        lake_csv(&rig, all).await,
        "id,note\n1,new\n2,again\n3,three\n"
    );
    client
        .batch_execute("DELETE FROM d WHERE id = 3")
        .await
        .unwrap();
    flush(&rig, "d").await;
    client
        .batch_execute("INSERT INTO d VALUES (3, 'back')")
        .await
        .unwrap();
    flush(&rig, "d").await;
    assert_eq!(
        lake_csv(&rig, all).await,
        "id,note\n1,new\n2,again\n3,back\n"
    );
}

/// Table `table` made by `create`, attached, given two rows by `insert` and flushed; then
/// `update` gives a key an equal key of another text (so another row id): the flush exports
/// the old row id and the new, and the lake's `SELECT id, v … ORDER BY v` is `want`.
async fn a_key_text_change_leaves_no_live_old_row(
    table: &str,
    create: &str,
    insert: &str,
    update: &str,
    want: &str,
) {
    let rig = rig(LakeKind::Local).await;
    let client = rig.db.client().await;
    client.batch_execute(create).await.unwrap();
    attach(&rig, table);
    client.batch_execute(insert).await.unwrap();
    flush(&rig, table).await;
    client.batch_execute(update).await.unwrap();
    let f = flush(&rig, table).await;
    assert_eq!(f.rows_exported, 2, "the old row id and the new: {f:?}");
    let all = format!("SELECT id, v FROM {table} ORDER BY v");
    assert_eq!(lake_csv(&rig, &all).await, want);
}

#[tokio::test]
async fn a_hashed_key_whose_text_changes_leaves_no_live_copy_of_its_old_row_id() {
    // 1.0 = 1.00 to the key, but the texts differ, so the row ids do: the old one is gone.
    // (An unconstrained numeric is a DOUBLE in the lake.)
    a_key_text_change_leaves_no_live_old_row(
        "prices",
        "CREATE TABLE prices (id numeric PRIMARY KEY, v int)",
        "INSERT INTO prices VALUES (1.0, 1), (2, 2)",
        "UPDATE prices SET id = 1.00, v = 10 WHERE id = 1.0",
        "id,v\n2.0,2\n1.0,10\n",
    )
    .await;
}

#[tokio::test]
async fn a_run_stopped_between_publish_and_mark_is_outranked_by_the_next() {
    let (rig, client) = five_rows_flushed().await;
    let t = &TABLES[1];
    let first = lake_versions(&rig).await;
    client
        .batch_execute("UPDATE t_big SET note = 'published' WHERE id = 1")
        .await
        .unwrap();
    // The mark fails once: the file is published, the touch stays.
    let f = flush_running_before_mark(
        &rig,
        "t_big",
        "CREATE FUNCTION no_delete() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN RAISE EXCEPTION 'mark refused'; END $$;
         CREATE TRIGGER no_delete BEFORE DELETE ON lakecdc_touch
           FOR EACH ROW EXECUTE FUNCTION no_delete();",
    )
    .await;
    let f = &f.schemas[0];
    assert_eq!((f.outcome, f.rows_exported), (Outcome::Failed, 1), "{f:?}");
    let published = lake_versions(&rig).await;
    assert!(published[&1] > first[&1]);
    client
        .batch_execute("DROP TRIGGER no_delete ON lakecdc_touch; DROP FUNCTION no_delete()")
        .await
        .unwrap();
    // A later write dated back before the published version: its export still outranks it.
    client
        .batch_execute(
            "UPDATE t_big SET note = 'final' WHERE id = 1;
             UPDATE lakecdc_touch SET touched_at = touched_at - 3600000
               WHERE seq = (SELECT max(seq) FROM lakecdc_touch);",
        )
        .await
        .unwrap();
    let f = flush(&rig, "t_big").await;
    assert_eq!((f.rows_exported, f.rows_marked), (1, 1), "{f:?}");
    let last = lake_versions(&rig).await;
    assert!(last[&1] > published[&1], "{last:?} {published:?}");
    assert_equal(&rig, t, "after the stopped run and the next").await;
    assert_eq!(touches_pending(&client).await, 0);
}

#[tokio::test]
async fn dense_batches_read_by_key_range_and_sparse_ones_by_lookup_export_the_same_rows() {
    let rig = rig(LakeKind::Local).await;
    let client = rig.db.client().await;
    let uuid_of = "('00000000-0000-0000-0000-' || lpad(g::text, 12, '0'))::uuid";
    for (table, key, id) in [("dn_int", "bigint", "g"), ("dn_uuid", "uuid", uuid_of)] {
        client
            .batch_execute(&format!(
                "CREATE TABLE {table} (id {key} PRIMARY KEY, g int NOT NULL, note text);
                 INSERT INTO {table} SELECT {id}, g, 'old ' || g FROM generate_series(1, 300) g"
            ))
            .await
            .unwrap();
        attach(&rig, table);
        let init = lakecdc::init::run(&rig.job_context(), &init_opts(&rig, table))
            .await
            .unwrap();
        assert_eq!(init.schemas[0].rows, 300);
        // Rows 2, 4, …, 100 touched (every tenth deleted), 150, 220 and 290 far apart, 301 to
        // 320 new; the untouched rows between them keep init's copy.
        client
            .batch_execute(&format!(
                "UPDATE {table} SET note = 'new ' || g WHERE g <= 100 AND g % 2 = 0;
                 DELETE FROM {table} WHERE g <= 100 AND g % 10 = 0;
                 INSERT INTO {table} SELECT {id}, g, 'tail ' || g FROM generate_series(301, 320) g;
                 UPDATE {table} SET note = 'far ' || g WHERE g IN (150, 220, 290);"
            ))
            .await
            .unwrap();
        let opts = lakecdc::flush::FlushOptions {
            schemas: vec![table.into()],
            batch_size: 10,
            ..rig.opts.clone()
        };
        let report = lakecdc::flush::run(&rig.ctx, &opts).await.unwrap();
        let f = &report.schemas[0];
        assert_eq!(f.rows_exported, 73, "{f:?}");
        // In `row_id` order, ten at a time: five pages of 2..100 (a range of at most 19 keys
        // for 10 rows), then 150, 220, 290, 301..307 (a range of 158 keys: lookups), then
        // 308..317 and 318..320.
        assert_eq!((f.batches, f.batches_by_range), (8, 7), "{table}: {f:?}");
        let all = format!("SELECT id, g, note FROM {table} ORDER BY g");
        let want = pg_csv(
            &client,
            table,
            "id,g,note",
            "id || ',' || g || ',' || note",
            "g",
        )
        .await;
        holds(
            &want,
            &[
                ",2,new 2\n",
                ",3,old 3\n",
                ",150,far 150\n",
                ",320,tail 320\n",
            ],
            ",10,",
        );
        assert_eq!(lake_csv(&rig, &all).await, want, "{table}");
    }
}

#[tokio::test]
async fn a_text_key_under_a_case_blind_collation_whose_case_changes_leaves_no_live_old_row() {
    // 'ABC' = 'Abc' to the key, but the texts differ, so the row ids do: the old one is gone,
    // though a lookup of 'Abc' finds the row.
    a_key_text_change_leaves_no_live_old_row(
        "names",
        "CREATE COLLATION IF NOT EXISTS lakecdc_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
         CREATE TABLE names (id text COLLATE lakecdc_ci PRIMARY KEY, v int)",
        "INSERT INTO names VALUES ('Abc', 1), ('x', 2)",
        "UPDATE names SET id = 'ABC', v = 10 WHERE id = 'Abc'",
        "id,v\nx,2\nABC,10\n",
    )
    .await;
}

/// The touches still in the touch log (pending, of every source).
pub(crate) async fn touches_pending(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM lakecdc_touch", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_table_mark_waiting_on_a_lock_does_not_hold_back_the_next_batchs_mark() {
    // docs/design.md §4.1, "Pipelining", for a table source: the first batch's mark (a delete
    // of its touches) waits for a touch an application transaction has locked; the second
    // batch's mark runs on a connection of its own meanwhile.
    let rig = rig(LakeKind::Local).await;
    let client = rig.db.client().await;
    let table = "CREATE TABLE tm (id bigint PRIMARY KEY, note text);
                 INSERT INTO tm SELECT g, 'old ' || g FROM generate_series(1, 30) g";
    loaded(&rig, &client, table, "tm").await;
    client
        .batch_execute("UPDATE tm SET note = 'new ' || id")
        .await
        .unwrap();
    // Batches of ten in row-id order: the first holds the ten smallest touched row ids.
    let ids: Vec<uuid::Uuid> = client
        .query("SELECT row_id FROM lakecdc_touch ORDER BY row_id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids.len(), 30);
    let (first, second) = (ids[..10].to_vec(), ids[10..20].to_vec());
    let app = rig.db.client().await;
    app.batch_execute("BEGIN").await.unwrap();
    let lock = "SELECT 1 FROM lakecdc_touch WHERE row_id = $1 FOR UPDATE";
    assert_eq!(app.execute(lock, &[&first[4]]).await.unwrap(), 1);
    let ctx = rig.ctx.clone();
    let opts = lakecdc::flush::FlushOptions {
        schemas: vec!["tm".into()],
        batch_size: 10,
        ..rig.opts.clone()
    };
    let flush = tokio::spawn(async move { lakecdc::flush::run(&ctx, &opts).await });
    let watcher = rig.db.client().await;
    let pending = |ids: Vec<uuid::Uuid>| {
        let w = &watcher;
        async move {
            let n: i64 = w
                .query_one(
                    "SELECT count(*) FROM lakecdc_touch WHERE row_id = ANY($1)",
                    &[&ids],
                )
                .await
                .unwrap()
                .get(0);
            n
        }
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while pending(second.clone()).await > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the second batch was not marked while the first batch's mark waited"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // The first batch's mark is one statement, still waiting: all its touches are there.
    assert_eq!(pending(first.clone()).await, 10);
    assert!(!flush.is_finished());
    app.batch_execute("ROLLBACK").await.unwrap();
    let report = flush.await.unwrap().unwrap();
    let f = &report.schemas[0];
    assert_eq!(
        (f.batches, f.rows_exported, f.rows_marked, f.rows_left_dirty),
        (3, 30, 30, 0),
        "{f:?}"
    );
    assert_eq!(touches_pending(&client).await, 0);
    let all = "SELECT id, note FROM tm ORDER BY id";
    let want = pg_csv(&client, "tm", "id,note", "id || ',' || note", "id").await;
    holds(&want, &["1,new 1\n", "30,new 30\n"], ",old ");
    assert_eq!(lake_csv(&rig, all).await, want);
}

#[tokio::test]
async fn a_touch_deleted_behind_the_flush_is_not_counted_as_marked() {
    let (rig, client) = five_rows_flushed().await;
    client
        .batch_execute("UPDATE t_big SET note = 'again' WHERE id <= 3")
        .await
        .unwrap();
    // Between the publish and the mark, something else deletes one row's touch.
    let f = flush_running_before_mark(
        &rig,
        "t_big",
        "DELETE FROM lakecdc_touch WHERE ctid = (SELECT min(ctid) FROM lakecdc_touch)",
    )
    .await;
    let f = &f.schemas[0];
    assert_eq!(
        (f.rows_exported, f.rows_marked, f.rows_left_dirty),
        (3, 2, 1),
        "{f:?}"
    );
    assert_eq!(touches_pending(&client).await, 0);
}

/// Asserts that CSV `csv` has each of `rows` and not `gone`.
fn holds(csv: &str, rows: &[&str], gone: &str) {
    for row in rows {
        assert!(csv.contains(row), "{row} in {csv}");
    }
    assert!(!csv.contains(gone), "{gone} in {csv}");
}

/// `SELECT …` over table `table` in PostgreSQL as `lakecdc query` prints it in CSV: the
/// header `columns`, then each row's `row` expression, in `order`.
async fn pg_csv(
    client: &tokio_postgres::Client,
    table: &str,
    columns: &str,
    row: &str,
    order: &str,
) -> String {
    client
        .query_one(
            &format!(
                "SELECT '{columns}' || E'\\n' || coalesce(string_agg({row}, E'\\n' ORDER BY {order}) || E'\\n', '') FROM {table}"
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Runs `sql` (creating and filling table `name`), attaches the table and inits its lake (which
/// must succeed).
async fn loaded(rig: &Rig, client: &tokio_postgres::Client, sql: &str, name: &str) {
    client.batch_execute(sql).await.unwrap();
    attach(rig, name);
    init_source(rig, name).await;
}

#[tokio::test]
async fn a_hashed_key_backlog_read_by_table_scans_exports_the_snapshot() {
    let rig = rig(LakeKind::Local).await;
    let client = rig.db.client().await;
    loaded(
        &rig,
        &client,
        "CREATE TABLE sc (id text, n int, note text, PRIMARY KEY (id, n));
         INSERT INTO sc SELECT 'k' || g, g, 'old ' || g FROM generate_series(1, 3000) g;",
        "sc",
    )
    .await;
    // Analysed, so flush knows the table's size: the backlog below is most of it.
    client.batch_execute("ANALYZE sc").await.unwrap();
    client
        .batch_execute(
            "UPDATE sc SET note = 'new ' || n WHERE n % 2 = 0;
             DELETE FROM sc WHERE n % 10 = 0;
             UPDATE sc SET id = id || 'x' WHERE n % 7 = 0;
             INSERT INTO sc SELECT 'k' || g, g, 'tail ' || g FROM generate_series(3001, 3020) g;",
        )
        .await
        .unwrap();
    let count = async |sql: &str| -> u64 {
        let n: i64 = client.query_one(sql, &[]).await.unwrap().get(0);
        n as u64
    };
    let pending = count("SELECT count(DISTINCT row_id) FROM lakecdc_touch").await;
    // Touched and still there: every one is read by the scan.
    let live = count("SELECT count(*) FROM sc WHERE n % 2 = 0 OR n % 7 = 0 OR n > 3000").await;
    let (columns, row, order) = ("id,n,note", "id || ',' || n || ',' || note", "n");
    let all = format!("SELECT {columns} FROM sc ORDER BY {order}");
    let snapshot = pg_csv(&client, "sc", columns, row, order).await;
    // The lake holds the table's state, which has row `has`.
    let lake_is_table = async |has: &str| {
        let now = pg_csv(&client, "sc", columns, row, order).await;
        assert!(now.contains(has), "{has} in {now}");
        assert_eq!(lake_csv(&rig, &all).await, now, "the table's state");
    };
    let opts = lakecdc::flush::FlushOptions {
        schemas: vec!["sc".into()],
        batch_size: 100,
        ..rig.opts.clone()
    };
    let f = &lakecdc::flush::run(&rig.ctx, &opts).await.unwrap().schemas[0];
    assert_eq!(f.rows_exported, pending, "{f:?}");
    assert_eq!((f.rows_by_scan, f.table_scans), (live, 1), "{f:?}");
    holds(
        &snapshot,
        &[
            ",2,new 2\n",
            ",3,old 3\n",
            "k7x,7,old 7\n",
            ",3001,tail 3001\n",
        ],
        ",10,",
    );
    assert_eq!(lake_csv(&rig, &all).await, snapshot, "the snapshot's state");
    // A small backlog (under a sixteenth of the table): looked up by key, no scan.
    client
        .batch_execute("UPDATE sc SET note = note || ' late' WHERE n % 25 = 0")
        .await
        .unwrap();
    let f = flush(&rig, "sc").await;
    assert_eq!((f.rows_by_scan, f.table_scans), (0, 0), "{f:?}");
    lake_is_table(",25,old 25 late\n").await;
    // A sparse one (a fifth of the table): one scan that sends the touched rows only, every
    // one of them kept; a row deleted and one whose key changed among them.
    client
        .batch_execute(
            "UPDATE sc SET note = note || ' sparse' WHERE n % 5 = 1;
             DELETE FROM sc WHERE n = 11;
             UPDATE sc SET id = id || 'y' WHERE n = 16;",
        )
        .await
        .unwrap();
    let live = count("SELECT count(*) FROM sc WHERE n % 5 = 1").await;
    let f = flush(&rig, "sc").await;
    assert_eq!(f.rows_exported, live + 2, "{f:?}");
    assert_eq!((f.rows_by_scan, f.table_scans), (live, 1), "{f:?}");
    lake_is_table("k16y,16,new 16 sparse\n").await;
    assert!(
        !lake_csv(&rig, &all).await.contains(",11,"),
        "the deleted row is gone"
    );
    // Every row: about 47 bytes each, 64 KiB a pass (some 1,400 rows, under half the table,
    // so each pass sends its own range's rows only): two passes (what they did not keep is
    // looked up).
    // Once the first batch is published, rows are rewritten and the old versions vacuumed
    // where nothing holds them: the second pass still reads the snapshot's.
    client
        .batch_execute("UPDATE sc SET note = 'last ' || n")
        .await
        .unwrap();
    let snapshot = pg_csv(&client, "sc", columns, row, order).await;
    let (hooks, _) = rewrite_before_first_mark(
        rig.db.client().await,
        None,
        "UPDATE sc SET note = 'later ' || n WHERE n % 3 = 0",
        "sc",
    );
    let small = lakecdc::flush::FlushOptions {
        scan_memory: 64 << 10,
        ..opts.clone()
    };
    let report = lakecdc::flush::run_with_hooks(&rig.ctx, &small, &hooks)
        .await
        .unwrap();
    let f = &report.schemas[0];
    let rows = count("SELECT count(*) FROM sc").await;
    assert_eq!((f.rows_exported, f.table_scans), (rows, 2), "{f:?}");
    assert!(f.rows_by_scan > rows / 2 && f.rows_by_scan <= rows, "{f:?}");
    assert!(snapshot.contains(",3,last 3\n"), "{snapshot}");
    assert_eq!(lake_csv(&rig, &all).await, snapshot, "the snapshot's state");
    flush(&rig, "sc").await;
    lake_is_table(",3,later 3\n").await;
    // A pass that can keep one row only does not pay for its read: no scan, lookups.
    client
        .batch_execute("UPDATE sc SET note = 'end ' || n")
        .await
        .unwrap();
    let tiny = lakecdc::flush::FlushOptions {
        scan_memory: 1,
        ..opts
    };
    let f = &lakecdc::flush::run(&rig.ctx, &tiny).await.unwrap().schemas[0];
    assert_eq!((f.rows_by_scan, f.table_scans), (0, 0), "{f:?}");
    lake_is_table(",5,end 5\n").await;
}

/// Flush hooks whose first `before_mark` runs, on `other`, the count `probe` (kept in the
/// returned cell), then `write` and a `VACUUM` of `table`: rows rewritten, and their old
/// versions reclaimed where nothing holds them, behind a running read.
fn rewrite_before_first_mark(
    other: tokio_postgres::Client,
    probe: Option<&'static str>,
    write: &'static str,
    table: &'static str,
) -> (FlushHooks, std::sync::Arc<std::sync::Mutex<Option<i64>>>) {
    let other = std::sync::Arc::new(other);
    let once = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
    let cell = seen.clone();
    let hooks = FlushHooks {
        before_mark: Some(std::sync::Arc::new(move |_, _| {
            let (other, once, seen) = (other.clone(), once.clone(), seen.clone());
            Box::pin(async move {
                if once.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                if let Some(probe) = probe {
                    let n: i64 = other.query_one(probe, &[]).await.unwrap().get(0);
                    *seen.lock().unwrap() = Some(n);
                }
                other.batch_execute(write).await.unwrap();
                other
                    .batch_execute(&format!("VACUUM {table}"))
                    .await
                    .unwrap();
            })
        })),
        ..FlushHooks::default()
    };
    (hooks, cell)
}

#[tokio::test]
async fn pages_read_by_key_on_two_connections_share_the_reads_snapshot() {
    let rig = rig(LakeKind::Local).await;
    let client = rig.db.client().await;
    loaded(
        &rig,
        &client,
        "CREATE TABLE two (id text PRIMARY KEY, n int NOT NULL, note text)
             WITH (autovacuum_enabled = false);
         INSERT INTO two SELECT 'k' || g, g, 'old ' || g FROM generate_series(1, 1000) g;",
        "two",
    )
    .await;
    client
        .batch_execute(
            "UPDATE two SET note = 'new ' || n WHERE n % 3 <> 0; DELETE FROM two WHERE n % 10 = 0;",
        )
        .await
        .unwrap();
    let (columns, row, order) = ("id,n,note", "id || ',' || n || ',' || note", "n");
    let all = format!("SELECT {columns} FROM two ORDER BY {order}");
    let snapshot = pg_csv(&client, "two", columns, row, order).await;
    let pending: i64 = client
        .query_one("SELECT count(DISTINCT row_id) FROM lakecdc_touch", &[])
        .await
        .unwrap()
        .get(0);
    // Before the first mark: count the sessions holding a snapshot (the read's connections),
    // then rewrite every row and vacuum, so a page read outside the snapshot would see it.
    let (hooks, seen) = rewrite_before_first_mark(
        rig.db.client().await,
        Some(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND pid <> pg_backend_pid() AND backend_xmin IS NOT NULL",
        ),
        "UPDATE two SET note = 'later ' || n",
        "two",
    );
    // A pass that could keep one row only does not pay for its read: no scan, every page
    // looked up by key.
    let opts = lakecdc::flush::FlushOptions {
        schemas: vec!["two".into()],
        batch_size: 50,
        scan_memory: 1,
        ..rig.opts.clone()
    };
    let report = lakecdc::flush::run_with_hooks(&rig.ctx, &opts, &hooks)
        .await
        .unwrap();
    let f = &report.schemas[0];
    assert_eq!(f.rows_exported as i64, pending, "{f:?}");
    assert_eq!((f.rows_by_scan, f.table_scans), (0, 0), "{f:?}");
    assert_eq!(i64::from(f.batches), (pending + 49) / 50, "{f:?}");
    assert_eq!(
        *seen.lock().unwrap(),
        Some(2),
        "the read and its second connection"
    );
    assert!(snapshot.contains("k2,2,new 2\n") && !snapshot.contains(",10,"));
    assert_eq!(lake_csv(&rig, &all).await, snapshot, "the snapshot's state");
    // The rewrite goes out next.
    let f = flush(&rig, "two").await;
    assert_eq!(f.rows_exported, 900, "{f:?}");
    let now = pg_csv(&client, "two", columns, row, order).await;
    assert!(now.contains("k2,2,later 2\n"), "{now}");
    assert_eq!(lake_csv(&rig, &all).await, now, "the table's state");
}

/// `verify --source` of source `name` (with `--repair` when asked).
async fn verify_table(rig: &Rig, name: &str, repair: bool) -> lakecdc::verify::SchemaVerify {
    verify_table_deep(rig, name, false, repair).await
}

/// `verify --source` of source `name`, `--deep` and `--repair` when asked.
async fn verify_table_deep(
    rig: &Rig,
    name: &str,
    deep: bool,
    repair: bool,
) -> lakecdc::verify::SchemaVerify {
    use lakecdc::verify::{SourceOptions, VerifyOptions};
    let opts = VerifyOptions {
        schemas: vec![name.into()],
        parallelism: 2,
        work_dir: rig.opts.work_dir.clone(),
        source: Some(SourceOptions {
            deep,
            repair,
            max_ids: 100,
            page_rows: 7,
            readers: 2,
        }),
        engine: Default::default(),
    };
    let v = lakecdc::verify::run(&rig.job_context(), &opts)
        .await
        .unwrap();
    v.schemas.into_iter().next().unwrap()
}

/// `lakecdc requeue --schema name …` through the binary: exit code and stdout.
fn requeue_bin(rig: &Rig, name: &str, args: &[&str]) -> (Option<i32>, String) {
    let out = run_bin(rig, &[&["requeue", "--schema", name][..], args].concat());
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Creates `t`, fills it with rows 1..=`rows` (payload from `seed`), attaches it and exports it
/// with init.
async fn attached_and_exported(
    rig: &Rig,
    client: &tokio_postgres::Client,
    t: &Table,
    rows: i64,
    seed: u64,
) {
    client.batch_execute(&create_sql(t)).await.unwrap();
    client
        .batch_execute(&insert_sql(t, &(t.new_key)("g"), 1, rows, seed))
        .await
        .unwrap();
    attach(rig, t.name);
    let init = lakecdc::init::run(&rig.job_context(), &init_opts(rig, t.name))
        .await
        .unwrap();
    assert_eq!(init.exit_code(), 0, "{init:?}");
}

#[tokio::test]
async fn repair_and_requeue_put_a_table_source_right_with_every_key_rule() {
    use lakecdc::verify::Outcome as Verified;
    let rig = rig(LakeKind::Local).await;
    let client = rig.db.client().await;
    let cols: Vec<&str> = COLUMNS.iter().map(|c| c.0).collect();
    for (n, t) in TABLES.iter().enumerate() {
        attached_and_exported(&rig, &client, t, 20, 40 + n as u64).await;
        let key_of = |g: i64| {
            // The key's columns of row `g`, as a WHERE condition.
            let exprs = (t.new_key)(&g.to_string());
            let values: Vec<&str> = exprs.split(", ").collect();
            t.key
                .iter()
                .zip(values)
                .map(|(k, v)| format!("{k} = {v}"))
                .collect::<Vec<_>>()
                .join(" AND ")
        };
        // The lake's row id of row 4, read before the table loses it.
        let csv = lake_csv(
            &rig,
            &format!("SELECT row_id FROM {} WHERE {}", t.name, key_of(4)),
        )
        .await;
        let gone_id = csv.lines().nth(1).unwrap().to_string();
        // Behind the capture's back: rows 3 and 4 deleted, row 99 inserted, row 5 changed.
        client
            .batch_execute(&format!(
                "BEGIN; \
                 DELETE FROM {t} WHERE {k3}; DELETE FROM {t} WHERE {k4}; \
                 INSERT INTO {t} ({key}, {cols}) SELECT {new}, {payload}; \
                 UPDATE {t} SET note = 'changed behind' WHERE {k5}; \
                 {BEHIND}",
                t = t.name,
                k3 = key_of(3),
                k4 = key_of(4),
                k5 = key_of(5),
                key = t.key.join(", "),
                cols = cols.join(", "),
                new = (t.new_key)("99"),
                payload = payload_sql(&mut Rng::new(7), "99"),
            ))
            .await
            .unwrap();
        let v = verify_table(&rig, t.name, false).await;
        assert_eq!(v.outcome, Verified::Diverged, "{v:?}");
        let check = v.source.as_ref().unwrap();
        assert_eq!(
            (check.missing.count, check.extra.count),
            (1, 2),
            "{check:?}"
        );
        assert_eq!(touches_pending(&client).await, 0, "verify writes nothing");

        // Row 4 by id: absent from the table, live in the lake — a tombstone. An id the
        // source never held is unknown: exit 3, nothing written for it.
        let stray = uuid::Uuid::new_v4().to_string();
        let (code, text) = requeue_bin(&rig, t.name, &["--row-id", &gone_id, "--row-id", &stray]);
        assert_eq!(code, Some(3), "{text}");
        assert!(
            text.contains("0 re-exported at a bumped version, 1 as tombstones")
                && text.contains(&format!("unknown: {stray}")),
            "{text}"
        );
        assert_eq!(touches_pending(&client).await, 1);
        // The rest by verify's repair: row 99 re-exported, row 3 a tombstone.
        let v = verify_table(&rig, t.name, true).await;
        let repaired = v.source.as_ref().unwrap().repaired.clone().unwrap();
        // Row 4 is pending now: not divergent.
        assert_eq!(
            (repaired.live.len(), repaired.tombstones.len()),
            (1, 1),
            "{repaired:?}"
        );
        // Row 5's value change: versions cannot show it; `--where` over the table requeues it
        // (a dry run first, which writes nothing).
        let pending = touches_pending(&client).await;
        let (code, text) = requeue_bin(
            &rig,
            t.name,
            &["--where", "note = 'changed behind'", "--dry-run"],
        );
        assert_eq!(code, Some(0), "{text}");
        assert!(text.contains("would requeue 1 of 1"), "{text}");
        assert_eq!(touches_pending(&client).await, pending);
        let (code, text) = requeue_bin(&rig, t.name, &["--where", "note = 'changed behind'"]);
        assert_eq!(code, Some(0), "{text}");
        let f = flush(&rig, t.name).await;
        assert_eq!(f.outcome, Outcome::Flushed, "{f:?}");
        assert_eq!(touches_pending(&client).await, 0);
        assert_eq!(assert_equal(&rig, t, "after repair and requeue").await, 19);
        let v = verify_table(&rig, t.name, false).await;
        assert_eq!(v.outcome, Verified::Intact, "{v:?}");
    }
}

#[tokio::test]
async fn a_requeued_tombstone_does_not_hide_the_key_of_a_row_inserted_again() {
    let rig = rig(LakeKind::Local).await;
    let client = rig.db.client().await;
    let t = &TABLES[2];
    client.batch_execute(&create_sql(t)).await.unwrap();
    client
        .batch_execute(&insert_sql(t, "'r', g", 1, 5, 9))
        .await
        .unwrap();
    attach(&rig, t.name);
    lakecdc::init::run(&rig.job_context(), &init_opts(&rig, t.name))
        .await
        .unwrap();
    let csv = lake_csv(&rig, "SELECT row_id FROM t_comp WHERE n = 2").await;
    let id = csv.lines().nth(1).unwrap().to_string();
    // Deleted behind the capture, requeued as a tombstone (its touch has no key: the table no
    // longer holds the row)…
    client
        .batch_execute(&format!("BEGIN; DELETE FROM t_comp WHERE n = 2; {BEHIND}"))
        .await
        .unwrap();
    let (code, text) = requeue_bin(&rig, t.name, &["--row-id", &id]);
    assert_eq!(code, Some(0), "{text}");
    // …then inserted again before the flush: the flush finds it through the new touch's key.
    client
        .batch_execute(&insert_sql(t, "'r', g", 2, 2, 10))
        .await
        .unwrap();
    let f = flush(&rig, t.name).await;
    assert_eq!(f.rows_exported, 1, "{f:?}");
    assert_eq!(assert_equal(&rig, t, "after the row came back").await, 5);
}

#[tokio::test]
async fn gc_settles_a_table_sources_orphan_by_its_touches_and_repair_requeues_lost_rows() {
    use lakecdc::gc::{GcOptions, Outcome as Gc};
    use lakecdc::store::fault::{Action, Op};
    let (rig, client) = five_rows_flushed().await;
    let t = &TABLES[1];
    let id: i16 = client
        .query_one(
            "SELECT source_id FROM lakecdc_sources WHERE name = 't_big'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let manifest = format!("manifest/{id}.json");
    let data = format!("data/{id}/");
    let before: Vec<String> = rig.keys(&data).await;
    client
        .batch_execute("UPDATE t_big SET note = 'orphaned' WHERE id <= 3")
        .await
        .unwrap();
    // The manifest save fails: the delta stays unlisted, the touches pending.
    rig.store
        .arm(Op::PutBytes, Some(manifest.as_str()), 1, Action::Fail);
    let f = flush(&rig, "t_big").await;
    assert_eq!(f.outcome, Outcome::Failed, "{f:?}");
    let orphans: Vec<String> = rig
        .keys(&data)
        .await
        .into_iter()
        .filter(|k| !before.contains(k) && !k.contains("/_tmp/"))
        .collect();
    assert_eq!(orphans.len(), 1, "{orphans:?}");
    assert_eq!(touches_pending(&client).await, 3);
    let (_, gctx, gopts) = rig.gc_on_a_manual_clock();
    let gopts = GcOptions {
        schemas: vec!["t_big".into()],
        ..gopts
    };
    // Its rows are pending: the next flush brings them, nothing is lost.
    let report = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    let s = &report.schemas[0];
    assert!(s.lost.is_empty(), "{s:?}");
    assert_eq!(
        (s.outcome, report.exit_code()),
        (Some(Gc::Pending), 0),
        "{s:?}"
    );
    // Marked anyway (by hand): nothing would export them again — lost, until repaired.
    client
        .batch_execute("DELETE FROM lakecdc_touch")
        .await
        .unwrap();
    let report = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    let s = &report.schemas[0];
    assert_eq!(
        (s.outcome, report.exit_code()),
        (Some(Gc::Attention), 3),
        "{s:?}"
    );
    assert_eq!(s.lost[0].rows, 3, "{s:?}");
    let repair = GcOptions {
        repair: true,
        ..gopts.clone()
    };
    let report = lakecdc::gc::run(&gctx, &repair).await.unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.repaired.as_ref().unwrap().live.len(), 3, "{s:?}");
    assert_eq!(touches_pending(&client).await, 3);
    let f = flush(&rig, "t_big").await;
    assert_eq!(f.rows_exported, 3, "{f:?}");
    assert_equal(&rig, t, "after the repair").await;
    let report = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    assert!(report.schemas[0].lost.is_empty(), "{report:?}");
    assert_eq!(report.exit_code(), 0);

    // Another orphan, whose rows go out again, are deleted, and whose tombstones a compaction
    // drops: the lake and the table both lack the rows, so its copies are stale, not lost.
    let before: Vec<String> = rig.keys(&data).await;
    client
        .batch_execute("UPDATE t_big SET note = 'orphaned again' WHERE id >= 4")
        .await
        .unwrap();
    rig.store
        .arm(Op::PutBytes, Some(manifest.as_str()), 1, Action::Fail);
    assert_eq!(flush(&rig, "t_big").await.outcome, Outcome::Failed);
    let orphan: Vec<String> = rig
        .keys(&data)
        .await
        .into_iter()
        .filter(|k| !before.contains(k) && !k.contains("/_tmp/"))
        .collect();
    assert_eq!(orphan.len(), 1, "{orphan:?}");
    assert_eq!(flush(&rig, "t_big").await.rows_exported, 2);
    client
        .batch_execute("DELETE FROM t_big WHERE id >= 4")
        .await
        .unwrap();
    assert_eq!(flush(&rig, "t_big").await.rows_exported, 2);
    let c = lakecdc::compact::run(
        &rig.job_context(),
        &CompactOptions {
            schemas: vec!["t_big".into()],
            work_dir: rig.opts.work_dir.clone(),
            max_deltas: 0,
            dirty_ratio: 0.0,
            ..CompactOptions::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(c.exit_code(), 0, "{c:?}");
    assert_eq!(
        assert_equal(&rig, t, "after the deletes compacted").await,
        3
    );
    let report = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
    let s = &report.schemas[0];
    assert!(s.lost.is_empty(), "{s:?}");
    assert!(s.within_grace.contains(&orphan[0]), "{s:?}");
    assert_eq!(report.exit_code(), 0, "{s:?}");
}

#[tokio::test]
async fn verify_deep_compares_a_table_sources_values_typed_and_repair_puts_them_right() {
    use lakecdc::verify::Outcome as Verified;
    let rig = rig(LakeKind::S3).await;
    let client = rig.db.client().await;
    let mut r = Rng::new(2024);
    for t in &TABLES {
        attached_and_exported(&rig, &client, t, 25, r.next()).await;
        // Rows written through the capture and flushed: files of both writers compared.
        let mut next = 100;
        for _ in 0..6 {
            random_statement(&client, t, &mut r, &mut next).await;
        }
        flush(&rig, t.name).await;
        let v = verify_table_deep(&rig, t.name, true, false).await;
        assert_eq!(v.outcome, Verified::Intact, "{}: {v:?}", t.name);
        let check = v.source.as_ref().unwrap();
        assert_eq!(check.values.as_ref().unwrap().count, 0, "{check:?}");
        assert!(check.rows_compared > 20, "{check:?}");
        // Values changed behind the capture: a text, a numeric, an array, a NULL.
        client
            .batch_execute(&format!(
                "BEGIN; \
                 UPDATE {t} SET note = 'behind', amount = 1.25, tags = '{{x,y}}', doc = NULL \
                 WHERE ctid IN (SELECT ctid FROM {t} LIMIT 2); {BEHIND}",
                t = t.name
            ))
            .await
            .unwrap();
        let shallow = verify_table(&rig, t.name, false).await;
        assert_eq!(shallow.outcome, Verified::Intact, "versions cannot see it");
        let v = verify_table_deep(&rig, t.name, true, true).await;
        assert_eq!(v.outcome, Verified::Diverged, "{v:?}");
        let check = v.source.as_ref().unwrap();
        assert_eq!(check.values.as_ref().unwrap().count, 2, "{check:?}");
        assert_eq!(check.repaired.as_ref().unwrap().live.len(), 2, "{check:?}");
        flush(&rig, t.name).await;
        assert_equal(&rig, t, "after the deep repair").await;
        let v = verify_table_deep(&rig, t.name, true, false).await;
        assert_eq!(v.outcome, Verified::Intact, "{v:?}");
    }
}

#[tokio::test]
async fn a_backlog_larger_than_one_read_is_read_again_in_the_same_run() {
    let (rig, client) = five_rows_flushed().await;
    let t = &TABLES[1];
    client
        .batch_execute(&insert_sql(t, "g", 6, 40, 3))
        .await
        .unwrap();
    client
        .batch_execute(
            "UPDATE t_big SET note = 'twice' WHERE id BETWEEN 1 AND 20; \
             UPDATE t_big SET amount = 2.50 WHERE id % 3 = 0; DELETE FROM t_big WHERE id = 7",
        )
        .await
        .unwrap();
    let touches = touches_pending(&client).await;
    assert!(touches > 50, "{touches}");
    let opts = |dry_run: bool| lakecdc::flush::FlushOptions {
        schemas: vec!["t_big".into()],
        max_touches: 7,
        batch_size: 3,
        dry_run,
        ..rig.opts.clone()
    };
    // A dry run plans one read and says the rest needs more.
    let dry = lakecdc::flush::run(&rig.ctx, &opts(true)).await.unwrap();
    let d = &dry.schemas[0];
    assert!(
        d.reason
            .as_deref()
            .unwrap_or("")
            .contains("more than 7 touches"),
        "{d:?}"
    );
    assert!(d.rows_exported <= 7, "{d:?}");
    assert_eq!(touches_pending(&client).await, touches);
    // One run reads seven touches at a time until none is left.
    let run = lakecdc::flush::run(&rig.ctx, &opts(false)).await.unwrap();
    let f = &run.schemas[0];
    assert_eq!(
        (f.outcome, f.reason.as_deref()),
        (Outcome::Flushed, None),
        "{f:?}"
    );
    assert!(f.rows_exported >= 40, "{f:?}");
    assert_eq!(touches_pending(&client).await, 0);
    assert_eq!(
        assert_equal(&rig, t, "after one run of many reads").await,
        39
    );
}

#[tokio::test]
async fn a_key_whose_type_changes_its_row_id_rule_stops_flush_and_attach() {
    // docs/hazards.md L73: the capture computes row ids by the rule of the key's type at
    // attach (a bigint's own value); a domain over bigint is hashed. Flushed on, touches
    // written by the old rule matched no row: every touched row went out as a tombstone.
    let rig = rig(LakeKind::Local).await;
    let client = rig.db.client().await;
    client
        .batch_execute(
            "CREATE DOMAIN big_id AS bigint;
             CREATE TABLE doms (id bigint PRIMARY KEY, v int);",
        )
        .await
        .unwrap();
    attach(&rig, "doms");
    client
        .batch_execute("INSERT INTO doms SELECT g, g FROM generate_series(1, 3) g")
        .await
        .unwrap();
    assert_eq!(flush(&rig, "doms").await.rows_exported, 3);
    client
        .batch_execute(
            "ALTER TABLE doms ALTER COLUMN id TYPE big_id; UPDATE doms SET v = v + 1 WHERE id = 2",
        )
        .await
        .unwrap();
    let s = flush(&rig, "doms").await;
    assert_eq!(s.rows_exported, 0, "{s:?}");
    let reason = s.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("is not the one this lakecdc writes for its current key (id big_id, row ids hashed, attached with row ids integer)")
            && reason.contains("run lakecdc attach"),
        "{reason}"
    );
    // attach refuses to install a capture of another rule over the lake's row ids.
    let attach_again = || {
        let out = harness::bin()
            .args(["attach", "doms", "--pg-url", &rig.db.url])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = attach_again();
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("big_id, whose text depends on session settings"),
        "{err}"
    );
    client
        .batch_execute("ALTER TABLE doms ALTER COLUMN id TYPE numeric")
        .await
        .unwrap();
    let (code, err) = attach_again();
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("row id is integer and its key's type now gives hashed"),
        "{err}"
    );
    // The type put back, the capture is this build's again and the change goes out.
    client
        .batch_execute("ALTER TABLE doms ALTER COLUMN id TYPE bigint")
        .await
        .unwrap();
    let s = flush(&rig, "doms").await;
    assert_eq!(s.rows_exported, 1, "{s:?}");
    let csv = lake_csv(&rig, "SELECT id, v FROM doms ORDER BY id").await;
    assert_eq!(csv, "id,v\n1,1\n2,3\n3,3\n");
}

#[tokio::test]
async fn a_numeric_beyond_a_doubles_range_becomes_its_nearest_double_not_a_stuck_source() {
    // docs/hazards.md L74: `1e400::float8` is an error, and with it every flush of the
    // source until the row changed.
    let rig = rig(LakeKind::Local).await;
    let client = rig.db.client().await;
    client
        .batch_execute("CREATE TABLE nums (id bigint PRIMARY KEY, n numeric, ns numeric[])")
        .await
        .unwrap();
    attach(&rig, "nums");
    client
        .batch_execute(
            "INSERT INTO nums VALUES (1, 1e400, '{1e400,1.5,NULL}'), (2, -1e400, '{}'), \
             (3, 1e-400, '{{1e-400,2},{-1e400,3}}'), (4, 'NaN', NULL), (5, 'Infinity', '{7}'), \
             (6, 2.5, NULL), (7, NULL, NULL), (8, -1e-400, NULL)",
        )
        .await
        .unwrap();
    let s = flush(&rig, "nums").await;
    assert_eq!(s.rows_exported, 8, "{s:?}");
    // So does one inside a numeric[] (element by element, a multi-dimensional array flattened
    // in storage order, NULL elements and arrays kept).
    let csv = lake_csv(
        &rig,
        "SELECT id, ns::VARCHAR AS ns FROM nums WHERE id IN (1, 2, 3, 4, 5) ORDER BY id",
    )
    .await;
    assert_eq!(
        csv,
        "id,ns\n1,\"[inf, 1.5, NULL]\"\n2,[]\n3,\"[0.0, 2.0, -inf, 3.0]\"\n4,\n5,[7.0]\n"
    );
    let csv = lake_csv(
        &rig,
        "SELECT id, CASE WHEN isnan(n) THEN 'nan' ELSE n::VARCHAR END AS n FROM nums ORDER BY id",
    )
    .await;
    assert_eq!(
        csv,
        "id,n\n1,inf\n2,-inf\n3,0.0\n4,nan\n5,inf\n6,2.5\n7,\n8,0.0\n"
    );
}

#[tokio::test]
async fn a_database_without_standard_strings_reads_a_backslashed_key_name_as_written() {
    // docs/hazards.md S16: flush quotes a hashed key's column names in string literals; a
    // database (or role) set to standard_conforming_strings = off read `'k\'` as an escape.
    let rig = rig(LakeKind::Local).await;
    let client = rig.db.client().await;
    client
        .batch_execute(
            r#"DO $$ BEGIN
                 EXECUTE format('ALTER DATABASE %I SET standard_conforming_strings = off', current_database());
               END $$;
               CREATE TABLE slashed ("k\" text PRIMARY KEY, v int);"#,
        )
        .await
        .unwrap();
    attach(&rig, "slashed");
    client
        .batch_execute("INSERT INTO slashed VALUES ('one', 1), ('two', 2)")
        .await
        .unwrap();
    let s = flush(&rig, "slashed").await;
    assert_eq!((s.rows_exported, s.rows_marked), (2, 2), "{s:?}");
    let csv = lake_csv(&rig, r#"SELECT "k\", v FROM slashed ORDER BY v"#).await;
    assert_eq!(csv, "k\\,v\none,1\ntwo,2\n");
}
