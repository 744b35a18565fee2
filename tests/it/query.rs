//! `lakecdc query`: the oracle read through it (every attribute kind, lists, dotted names, a
//! column added between generations), the same rows from `view`'s SQL in a separate DuckDB,
//! verified and cached S3 reads, pruning by `row_id`, and the output formats.

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use lakecdc::compact::CompactOptions;
use lakecdc::engine::EngineConfig;
use lakecdc::init::InitOptions;
use lakecdc::query::{Destination, Format, QueryOptions, QueryReport, SqlSource};
use lakecdc::store::fault::Op;
use lakecdc::store::{ObjectStore, PutMode};
use uuid::Uuid;

use crate::support::harness;
use crate::support::oracle::{self, LakeRow, V};
use crate::support::rig::{LakeKind, Rig, rig, schema_dir_with_nickname};
use crate::support::writer::{Customer, Rng, Writer};

const MANIFEST: &str = "manifest/100.json";

pub fn options(rig: &Rig, sql: &str, format: Format, out: &Path, cache: &Path) -> QueryOptions {
    QueryOptions {
        sql: SqlSource::Text(sql.to_string()),
        schemas: Vec::new(),
        format,
        output: Destination::File(out.to_path_buf()),
        as_of: None,
        verify: false,
        cache_dir: cache.to_path_buf(),
        cache_max: 10 << 30,
        parallelism: 4,
        work_dir: rig.opts.work_dir.clone(),
        engine: EngineConfig::default(),
    }
}

/// Runs `sql` to a Parquet file and returns its rows, one per id (asserted).
pub async fn state_via_query(rig: &Rig, opts: &QueryOptions) -> BTreeMap<Uuid, LakeRow> {
    lakecdc::query::run(&rig.job_context(), opts).await.unwrap();
    let Destination::File(path) = &opts.output else {
        unreachable!()
    };
    let rows = oracle::read_parquet(Bytes::from(std::fs::read(path).unwrap()));
    let n = rows.len();
    let map: BTreeMap<Uuid, LakeRow> = rows.into_iter().collect();
    assert_eq!(map.len(), n, "one row per id");
    map
}

/// An init that replaces the delta tier (retiring its files).
async fn init_replacing(rig: &Rig) {
    let init = InitOptions {
        schemas: vec!["customer".into()],
        replace_delta: true,
        work_dir: rig.opts.work_dir.clone(),
        ..InitOptions::default()
    };
    lakecdc::init::run(&rig.ctx, &init).await.unwrap();
}

/// A compaction that rewrites base and deltas into one new base (retiring them).
async fn compact_rewriting(rig: &Rig) {
    let compact = CompactOptions {
        schemas: vec!["customer".into()],
        work_dir: rig.opts.work_dir.clone(),
        dirty_ratio: 0.0,
        ..CompactOptions::default()
    };
    lakecdc::compact::run(&rig.job_context(), &compact)
        .await
        .unwrap();
}

async fn random_ops(rig: &mut Rig, r: &mut Rng, n: usize) {
    for _ in 0..n {
        rig.writer.random_op(r).await;
    }
}

/// Flushes, an init, a compaction, a column added, and flushes again; returns the nicknamed
/// rows (id → nickname) and the schema directory that must outlive the rig's use of it.
async fn lived_in_lake(rig: &mut Rig, seed: u64) -> (BTreeMap<Uuid, String>, tempfile::TempDir) {
    let mut r = Rng::new(seed);
    rig.seed(120, &mut r).await;
    rig.flush().await;
    random_ops(rig, &mut r, 40).await;
    rig.flush().await;
    init_replacing(rig).await;
    random_ops(rig, &mut r, 40).await;
    rig.flush().await;
    compact_rewriting(rig).await;
    let dir = schema_dir_with_nickname();
    rig.ctx.schema_dir = Some(dir.path().to_path_buf());
    let live: Vec<Uuid> = rig
        .writer
        .rows
        .iter()
        .filter(|(_, m)| !m.soft_deleted)
        .map(|(id, _)| *id)
        .take(3)
        .collect();
    let mut nicknamed = BTreeMap::new();
    for (i, id) in live.iter().enumerate() {
        rig.writer.update(*id, Customer::random(&mut r)).await;
        let nick = format!("nick-{i}");
        rig.writer
            .client
            .execute(
                "INSERT INTO eav_data (schema_id, row_id, attr_id, value_text) VALUES (100, $1, 90, $2)",
                &[id, &nick],
            )
            .await
            .unwrap();
        nicknamed.insert(*id, nick);
    }
    rig.flush().await;
    random_ops(rig, &mut r, 30).await;
    rig.flush().await;
    (nicknamed, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_query_reads_exactly_the_live_rows_and_views_sql_agrees_in_python_duckdb() {
    let mut rig = rig(LakeKind::Local).await;
    let (nicknamed, _dir) = lived_in_lake(&mut rig, 1901).await;
    let listed = rig.listed().await;
    assert!(listed.len() >= 3, "a base and deltas: {listed:?}");

    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("customer.parquet");
    let opts = options(
        &rig,
        "SELECT * FROM customer",
        Format::Parquet,
        &out,
        &t.path().join("cache"),
    );
    let state = state_via_query(&rig, &opts).await;
    let dirty = oracle::dirty(&rig.writer).await;
    assert!(dirty.is_empty(), "{dirty:?}");
    let (compared, _) = oracle::assert_state_matches(&rig.writer, &state, dirty);
    let live = rig.writer.rows.values().filter(|m| !m.soft_deleted).count();
    assert!(compared > 100 && compared == live, "{compared} of {live}");
    assert_eq!(state.len(), live);
    // The column added between generations: NULL for rows written before it.
    let with_nick: BTreeMap<Uuid, String> = state
        .iter()
        .filter_map(|(id, row)| match &row.columns["nickname"] {
            V::Str(s) => Some((*id, s.clone())),
            V::Null => None,
            other => panic!("nickname {other:?}"),
        })
        .collect();
    assert_eq!(with_nick, nicknamed);
    // A list and a dotted name came through as such.
    assert!(
        state
            .values()
            .any(|r| matches!(r.columns["tags"], V::List(_)))
    );
    assert!(
        state
            .values()
            .any(|r| matches!(r.columns["contact_address_city"], V::Str(_)))
    );

    // `view`'s statements, run by the Python DuckDB, give the same rows.
    let view = lakecdc::view::run(&rig.job_context(), &Default::default())
        .await
        .unwrap();
    let sql = view.schemas[0].sql.clone().unwrap();
    let py_out = t.path().join("python.parquet");
    let script = format!(
        "import duckdb, sys\ncon = duckdb.connect()\ncon.execute(sys.stdin.read())\ncon.execute(\"COPY (SELECT * FROM customer) TO '{}' (FORMAT parquet, COMPRESSION zstd)\")\n",
        py_out.display()
    );
    let out = harness::run_python(&script, sql.as_bytes());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let python_rows: BTreeMap<Uuid, LakeRow> =
        oracle::read_parquet(Bytes::from(std::fs::read(&py_out).unwrap()))
            .into_iter()
            .collect();
    assert_eq!(python_rows, state);
}

fn cached_files(dir: &Path) -> BTreeMap<String, u64> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name() != ".lock")
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                e.metadata().unwrap().len(),
            )
        })
        .collect()
}

fn data_reads(rig: &Rig) -> usize {
    rig.store
        .calls()
        .iter()
        .filter(|c| matches!(c.op, Op::GetToFile | Op::GetBytes) && c.key.starts_with("data/"))
        .count()
}

async fn count_sum(rig: &Rig, opts: &QueryOptions) -> (QueryReport, String) {
    let report = lakecdc::query::run(&rig.job_context(), opts).await.unwrap();
    let Destination::File(path) = &opts.output else {
        unreachable!()
    };
    (report, std::fs::read_to_string(path).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_reads_are_checked_cached_by_checksum_and_evicted_under_the_cap() {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(1902);
    rig.seed(80, &mut r).await;
    rig.flush().await;
    for _ in 0..3 {
        random_ops(&mut rig, &mut r, 20).await;
        rig.flush().await;
    }
    let manifest = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
        .await
        .unwrap();
    let files = manifest["files"].as_array().unwrap().clone();
    assert!(files.len() >= 4);
    let expected: BTreeMap<String, u64> = files
        .iter()
        .map(|f| {
            let hex = f["checksum"]
                .as_str()
                .unwrap()
                .strip_prefix("sha256:")
                .unwrap();
            (format!("{hex}.parquet"), f["size_bytes"].as_u64().unwrap())
        })
        .collect();
    let live = oracle::lake_state(rig.store.as_ref(), MANIFEST).await.len();

    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("cache");
    let out = t.path().join("out.csv");
    let opts = options(
        &rig,
        "SELECT count(*) AS n FROM customer",
        Format::Csv,
        &out,
        &cache,
    );
    let before = data_reads(&rig);
    let (report, text) = count_sum(&rig, &opts).await;
    assert_eq!(text, format!("n\n{live}\n"));
    assert_eq!(report.schemas[0].downloaded, files.len());
    assert_eq!(data_reads(&rig) - before, files.len());
    // Files are named by their checksum, hold exactly the listed bytes, and nothing else.
    assert_eq!(cached_files(&cache), expected);

    // Unchanged lake: nothing downloaded.
    let before = data_reads(&rig);
    let (report, text) = count_sum(&rig, &opts).await;
    assert_eq!(text, format!("n\n{live}\n"));
    assert_eq!(data_reads(&rig), before, "a warm cache reads nothing");
    assert_eq!(report.schemas[0].cache_hits, files.len());
    assert_eq!(report.schemas[0].downloaded, 0);

    // A cap below the lake: the query still runs, and the cache ends under the cap.
    let total: u64 = expected.values().sum();
    let cap = total / 2;
    let small = QueryOptions {
        cache_max: cap,
        ..opts.clone()
    };
    let (report, text) = count_sum(&rig, &small).await;
    assert_eq!(text, format!("n\n{live}\n"));
    assert!(report.evicted > 0);
    let left: u64 = cached_files(&cache).values().sum();
    assert!(left <= cap, "{left} > {cap}");

    // A flipped byte in a listed object: the query fails naming it, and nothing of it is
    // cached.
    let victim = files[1]["path"].as_str().unwrap().to_string();
    let mut bytes = rig.store.get_bytes(&victim).await.unwrap().bytes.to_vec();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    rig.store
        .put_bytes(&victim, Bytes::from(bytes), PutMode::Overwrite)
        .await
        .unwrap();
    let fresh = t.path().join("fresh");
    let bad = QueryOptions {
        cache_dir: fresh.clone(),
        ..opts.clone()
    };
    let e = lakecdc::query::run(&rig.job_context(), &bad)
        .await
        .unwrap_err();
    assert!(e.to_string().contains(&victim), "{e}");
    assert_eq!(e.exit_code(), 1);
    let victim_hex = files[1]["checksum"].as_str().unwrap()[7..].to_string();
    let left = cached_files(&fresh);
    assert!(
        !left
            .keys()
            .any(|k| k.contains(&victim_hex) || k.starts_with(".tmp")),
        "{left:?}"
    );
    // The failed query left no partial output beside the one the earlier runs wrote.
    let beside: Vec<String> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".out.csv"))
        .collect();
    assert!(beside.is_empty(), "{beside:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_query_over_two_schemas_keeps_every_file_it_names_while_the_cache_evicts() {
    let mut rig = rig(LakeKind::S3).await;
    // `order` takes customer's attributes, so one writer model serves both schemas.
    let dir = schema_dir_with_nickname();
    std::fs::copy(
        dir.path().join("customer_attributes.json"),
        dir.path().join("order_attributes.json"),
    )
    .unwrap();
    rig.ctx.schema_dir = Some(dir.path().to_path_buf());
    let mut r = Rng::new(1905);
    rig.seed(40, &mut r).await;
    let mut order = Writer::new(rig.db.client().await, 101).await;
    let mut orders = Vec::new();
    for _ in 0..40 {
        let id = r.uuid();
        order.create(id, Customer::random(&mut r)).await;
        orders.push(id);
    }
    rig.flush().await;
    for _ in 0..3 {
        random_ops(&mut rig, &mut r, 10).await;
        for id in orders.iter().take(8) {
            order.update(*id, Customer::random(&mut r)).await;
        }
        rig.flush().await;
    }
    let mut totals = Vec::new();
    let mut live = Vec::new();
    for key in [MANIFEST, "manifest/101.json"] {
        let m = oracle::manifest_json(rig.store.as_ref(), key)
            .await
            .unwrap();
        let files = m["files"].as_array().unwrap().clone();
        assert!(files.len() >= 4, "{key}: {}", files.len());
        totals.push(
            files
                .iter()
                .map(|f| f["size_bytes"].as_u64().unwrap())
                .sum::<u64>(),
        );
        live.push(oracle::lake_state(rig.store.as_ref(), key).await.len());
    }
    // Either schema's files fit under the cap, both together do not: the second view's
    // eviction must spare the files the first view names.
    let cap = totals[0].max(totals[1]);
    assert!(cap < totals[0] + totals[1]);
    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("cache");
    let out = t.path().join("out.csv");
    let opts = QueryOptions {
        cache_max: cap,
        ..options(
            &rig,
            "SELECT (SELECT count(*) FROM customer) AS c, (SELECT count(*) FROM \"order\") AS o",
            Format::Csv,
            &out,
            &cache,
        )
    };
    let (report, text) = count_sum(&rig, &opts).await;
    assert_eq!(text, format!("c,o\n{},{}\n", live[0], live[1]));
    assert_eq!(report.schemas.len(), 2);
    // Warm and over the cap: the next query evicts what it does not name, and still runs.
    let (_, text) = count_sum(&rig, &opts).await;
    assert_eq!(text, format!("c,o\n{},{}\n", live[0], live[1]));
    let one = QueryOptions {
        sql: SqlSource::Text("SELECT count(*) AS o FROM \"order\"".into()),
        ..opts.clone()
    };
    let (report, text) = count_sum(&rig, &one).await;
    assert_eq!(text, format!("o\n{}\n", live[1]));
    assert_eq!(report.schemas.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_point_lookup_downloads_only_the_files_whose_range_holds_the_id() {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(1903);
    let ids = rig.seed(60, &mut r).await;
    rig.flush().await;
    // 21 more flushes of two updates each: narrow-ish ranges.
    for _ in 0..21 {
        for _ in 0..2 {
            let id = ids[r.below(ids.len() as u64) as usize];
            if !rig.writer.rows[&id].soft_deleted {
                rig.writer.update(id, Customer::random(&mut r)).await;
            }
        }
        rig.flush().await;
    }
    let manifest = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
        .await
        .unwrap();
    let files = manifest["files"].as_array().unwrap().clone();
    assert!(files.len() >= 20, "{}", files.len());
    let state = oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
    let target = *state.keys().nth(state.len() / 2).unwrap();
    let holding: usize = files
        .iter()
        .filter(|f| {
            let lo = Uuid::parse_str(f["row_id_min"].as_str().unwrap()).unwrap();
            let hi = Uuid::parse_str(f["row_id_max"].as_str().unwrap()).unwrap();
            lo <= target && target <= hi
        })
        .count();
    assert!(holding < files.len(), "the test needs prunable files");

    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("one.parquet");
    let sql = format!("SELECT * FROM customer WHERE row_id = '{target}'");
    let opts = options(&rig, &sql, Format::Parquet, &out, &t.path().join("cache"));
    let before = data_reads(&rig);
    let got = state_via_query(&rig, &opts).await;
    assert_eq!(data_reads(&rig) - before, holding);
    assert_eq!(got.len(), 1);
    assert_eq!(got[&target], state[&target]);
    // The same lookup through IN, and an id no file holds (one file read, no row).
    let absent = Uuid::from_u128(0);
    let sql = format!("SELECT * FROM customer c WHERE c.row_id IN ('{target}', '{absent}')");
    let got = state_via_query(
        &rig,
        &QueryOptions {
            sql: SqlSource::Text(sql),
            ..opts.clone()
        },
    )
    .await;
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![target]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_point_lookup_keeps_the_columns_of_every_listed_file() {
    // docs/hazards.md R8: the files a pin keeps must give the view every column the others
    // do, or `SELECT *` loses one and a WHERE name binds to a select-list alias instead.
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(1905);
    let ids = rig.seed(40, &mut r).await;
    rig.flush().await;
    let dir = schema_dir_with_nickname();
    rig.ctx.schema_dir = Some(dir.path().to_path_buf());
    let (nicknamed, target) = (ids[0], ids[1]);
    rig.writer.update(nicknamed, Customer::random(&mut r)).await;
    rig.writer
        .client
        .execute(
            "INSERT INTO eav_data (schema_id, row_id, attr_id, value_text) VALUES (100, $1, 90, 'nick')",
            &[&nicknamed],
        )
        .await
        .unwrap();
    rig.flush().await;
    assert_eq!(rig.listed().await.len(), 2);

    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("cache");
    let out = t.path().join("one.parquet");
    let sql = format!("SELECT * FROM customer WHERE row_id = '{target}'");
    let before = data_reads(&rig);
    let got = state_via_query(&rig, &options(&rig, &sql, Format::Parquet, &out, &cache)).await;
    assert_eq!(got[&target].columns["nickname"], V::Null);
    // The delta holds no pinned id but brings the column; nothing else was left to prune.
    assert_eq!(data_reads(&rig) - before, 2);
    let csv = t.path().join("alias.csv");
    let sql = format!(
        "SELECT name AS nickname FROM customer WHERE row_id = '{target}' AND nickname IS NULL"
    );
    lakecdc::query::run(
        &rig.job_context(),
        &options(&rig, &sql, Format::Csv, &csv, &cache),
    )
    .await
    .unwrap();
    let name = match &oracle::lake_state(rig.store.as_ref(), MANIFEST).await[&target].columns["name"]
    {
        V::Str(s) => s.clone(),
        other => panic!("name {other:?}"),
    };
    assert_eq!(
        std::fs::read_to_string(&csv).unwrap(),
        format!("nickname\n{name}\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_format_parses_and_the_binary_speaks_one_line_errors() {
    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(1904);
    rig.seed(40, &mut r).await;
    rig.flush().await;
    let live = oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("cache");
    let sql = "SELECT row_id, name, tags, lifetime_value FROM customer ORDER BY row_id";

    let csv = t.path().join("out.csv");
    lakecdc::query::run(
        &rig.job_context(),
        &options(&rig, sql, Format::Csv, &csv, &cache),
    )
    .await
    .unwrap();
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("row_id,name,tags,lifetime_value"));
    let ids: Vec<String> = lines
        .map(|l| l.split(',').next().unwrap().to_string())
        .collect();
    let want: Vec<String> = live.keys().map(Uuid::to_string).collect();
    assert_eq!(ids, want);

    let json = t.path().join("out.json");
    lakecdc::query::run(
        &rig.job_context(),
        &options(&rig, sql, Format::Json, &json, &cache),
    )
    .await
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), live.len());
    for (row, (id, lake)) in rows.iter().zip(&live) {
        assert_eq!(row["row_id"], id.to_string());
        match &lake.columns["tags"] {
            V::List(items) => assert_eq!(row["tags"].as_array().unwrap().len(), items.len()),
            V::Null => assert!(row["tags"].is_null()),
            other => panic!("{other:?}"),
        }
    }

    let parquet = t.path().join("out.parquet");
    lakecdc::query::run(
        &rig.job_context(),
        &options(&rig, sql, Format::Parquet, &parquet, &cache),
    )
    .await
    .unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
        Bytes::from(std::fs::read(&parquet).unwrap()),
    )
    .unwrap()
    .build()
    .unwrap();
    let n: usize = reader.map(|b| b.unwrap().num_rows()).sum();
    assert_eq!(n, live.len());

    // The binary: SQL from stdin, CSV when piped; a SQL error is one line and exit 2; a schema
    // with no manifest is named.
    let lake = rig.work.path().join("lake");
    let bin = |args: &[&str], stdin: &str| {
        let mut child = harness::bin()
            .args(["query", "--pg-url", &rig.db.url, "--cache-dir"])
            .arg(&cache)
            .arg("--lake")
            .arg(&lake)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let out = bin(&[], "SELECT count(*) AS n FROM customer");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("n\n{}\n", live.len())
    );
    let out = bin(&["SELECT nope FROM customer"], "");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("nope"), "{err}");
    let out = bin(&["SELECT 1 FROM \"order\""], "");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no schema \"order\" in the lake") && err.contains("its schemas: customer"),
        "{err}"
    );

    // The lake is its own catalog: no database is needed to read it.
    let no_db = |sql: &str| {
        harness::bin()
            .args([
                "query",
                "--pg-url",
                "postgres://nobody@127.0.0.1:1/none",
                "--cache-dir",
            ])
            .arg(&cache)
            .arg("--lake")
            .arg(&lake)
            .arg(sql)
            .output()
            .unwrap()
    };
    let counted = format!("n\n{}\n", live.len());
    let out = no_db("SELECT count(*) AS n FROM customer");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), counted);
    // A manifest from before names were recorded: named from the registry when it answers,
    // else schema_<id>.
    let mut m = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
        .await
        .unwrap();
    m.as_object_mut().unwrap().remove("schema_name").unwrap();
    rig.store
        .put_bytes(
            MANIFEST,
            Bytes::from(serde_json::to_vec(&m).unwrap()),
            PutMode::Overwrite,
        )
        .await
        .unwrap();
    let out = bin(&["SELECT count(*) AS n FROM customer"], "");
    assert_eq!(String::from_utf8_lossy(&out.stdout), counted, "{out:?}");
    let out = no_db("SELECT count(*) AS n FROM schema_100");
    assert_eq!(String::from_utf8_lossy(&out.stdout), counted, "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_query_reads_only_its_views_files_and_runs_one_statement() {
    // docs/hazards.md R12, S23: the SQL is a query over the lake, not a shell: no host file is
    // read or written, nothing lands in the lake, and a second statement is refused, not run.
    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(2212);
    rig.seed(30, &mut r).await;
    rig.flush().await;
    let live = oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("cache");
    let lake = rig.work.path().join("lake");
    let secret = t.path().join("secret.toml");
    std::fs::write(&secret, "pg-url = \"postgres://u:hunter2@db/x\"\n").unwrap();
    let planted = lake.join("data/100/planted.parquet");
    let written = t.path().join("written.csv");
    let listing = || {
        let mut keys: Vec<String> = walk(&lake);
        keys.sort();
        keys
    };
    let before = listing();
    let run = |args: &[&str]| {
        let out = harness::bin()
            .args(["query", "--pg-url", &rig.db.url, "--cache-dir"])
            .arg(&cache)
            .arg("--lake")
            .arg(&lake)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let counted = format!("n\n{}\n", live.len());
    for sql in [
        format!("SELECT * FROM read_text('{}')", secret.display()),
        "SELECT * FROM read_csv('/etc/passwd', sep = ':')".to_string(),
        "SELECT * FROM glob('/etc/*')".to_string(),
        format!("COPY (SELECT 1) TO '{}'", planted.display()),
        format!("COPY (SELECT 1) TO '{}'", written.display()),
        format!("ATTACH '{}' AS other", t.path().join("new.db").display()),
        "INSTALL httpfs".to_string(),
        "LOAD httpfs".to_string(),
        "SET enable_external_access = true".to_string(),
        "SELECT count(*) AS n FROM customer; SELECT 2 AS two".to_string(),
        format!(
            "COPY (SELECT 1) TO '{}'; SELECT count(*) AS n FROM customer",
            written.display()
        ),
        "-- only a comment".to_string(),
        " ; ".to_string(),
    ] {
        for format in ["csv", "json", "parquet"] {
            let out = t.path().join(format!("out.{format}"));
            let (code, stdout, err) =
                run(&["--format", format, "-o", out.to_str().unwrap(), "--", &sql]);
            assert_ne!(code, Some(0), "{sql} ({format}): {stdout}{err}");
            // (A warning about another run's leftovers in the shared work dir may precede it.)
            let lines = err.lines().filter(|l| !l.contains(" WARN ")).count();
            assert_eq!(lines, 1, "{sql} ({format}): {err}");
            assert!(
                !stdout.contains("hunter2") && !err.contains("hunter2"),
                "{err}"
            );
            assert!(!out.exists(), "{sql} ({format})");
        }
    }
    assert!(!written.exists() && !t.path().join("new.db").exists());
    assert_eq!(listing(), before, "nothing lands in the lake");
    let (code, _, err) = run(&["SELECT 1; SELECT 2"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("more than one statement"), "{err}");
    let (code, _, err) = run(&["/* nothing */ ;"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no statement"), "{err}");
    let (code, _, err) = run(&["explain SELECT 1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not EXPLAIN statements"), "{err}");
    // One statement with trailing semicolons and comments, and the read-only forms DuckDB
    // takes as a query, all run in every format.
    for sql in [
        "SELECT count(*) AS n FROM customer; -- done",
        "SELECT count(*) AS n FROM customer;\n;\n/* end */",
        "FROM customer SELECT count(*) AS n",
        "WITH c AS (SELECT * FROM customer) SELECT count(*) AS n FROM c",
    ] {
        let (code, stdout, err) = run(&[sql]);
        assert_eq!(
            (code, stdout.as_str()),
            (Some(0), counted.as_str()),
            "{sql}: {err}"
        );
        let out = t.path().join("ok.parquet");
        let (code, _, err) = run(&["-o", out.to_str().unwrap(), sql]);
        assert_eq!(code, Some(0), "{sql}: {err}");
        assert!(std::fs::metadata(&out).unwrap().len() > 0);
    }
    // An age is given as documented, `--as-of -1h`, not only `--as-of=-1h`.
    let (code, stdout, err) = run(&["--as-of", "-1h", "SELECT 1 AS y"]);
    assert_eq!((code, stdout.as_str()), (Some(0), "y\n1\n"), "{err}");
    let (code, stdout, err) = run(&["DESCRIBE customer"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(stdout.contains("row_id,UUID"), "{stdout}");
}

/// Every file under `dir`, as paths relative to it.
fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_filter_sees_each_rows_newest_copy_only() {
    // docs/hazards.md #178: filtering copies before picking each row's newest one lets an older
    // matching copy surface. The view picks first; the user's WHERE applies to the winner.
    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(1905);
    let ids = rig.seed(10, &mut r).await;
    let renamed = ids[3];
    let mut c = Customer::random(&mut r);
    c.name = Some("before".into());
    rig.writer.update(renamed, c.clone()).await;
    rig.flush().await;
    c.name = Some("after".into());
    rig.writer.update(renamed, c).await;
    rig.flush().await;
    rig.writer.hard_delete(ids[4]).await;
    rig.flush().await;
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out.csv");
    let run = async |sql: &str| {
        let opts = options(&rig, sql, Format::Csv, &out, &t.path().join("cache"));
        lakecdc::query::run(&rig.job_context(), &opts)
            .await
            .unwrap();
        std::fs::read_to_string(&out).unwrap()
    };
    assert_eq!(
        run("SELECT row_id FROM customer WHERE name = 'before'").await,
        "row_id\n"
    );
    assert_eq!(
        run("SELECT row_id FROM customer WHERE name = 'after'").await,
        format!("row_id\n{renamed}\n")
    );
    // The deleted row is gone from the state, and its copies are all in the history.
    let sql = format!(
        "SELECT count(*) AS n FROM customer WHERE row_id = '{}'",
        ids[4]
    );
    assert_eq!(run(&sql).await, "n\n0\n");
    let sql = format!(
        "SELECT count(*) AS n FROM customer__history WHERE row_id = '{}' AND deleted_at > 0",
        ids[4]
    );
    assert_eq!(run(&sql).await, "n\n1\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_local_file_replaced_by_a_link_is_refused_and_a_short_one_named() {
    // docs/hazards.md R3: a local lake's files are read through the descriptor that was
    // checked, opened without following links.
    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(1906);
    rig.seed(20, &mut r).await;
    rig.flush().await;
    let listed = rig.listed().await;
    let lake = rig.work.path().join("lake");
    let victim = lake.join(&listed[0]);
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out.csv");
    let opts = options(
        &rig,
        "SELECT count(*) FROM customer",
        Format::Csv,
        &out,
        &t.path().join("c"),
    );

    let elsewhere = t.path().join("elsewhere.parquet");
    std::fs::rename(&victim, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &victim).unwrap();
    let e = lakecdc::query::run(&rig.job_context(), &opts)
        .await
        .unwrap_err();
    assert!(
        e.chain().contains(&listed[0]) && e.chain().contains("link"),
        "{}",
        e.chain()
    );
    assert!(!out.exists());

    std::fs::remove_file(&victim).unwrap();
    let mut bytes = std::fs::read(&elsewhere).unwrap();
    bytes.pop();
    std::fs::write(&victim, bytes).unwrap();
    let e = lakecdc::query::run(&rig.job_context(), &opts)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains(&listed[0]) && e.to_string().contains("bytes"),
        "{e}"
    );
    assert_eq!(e.exit_code(), 1);

    // The same size with other bytes (R15): refused by its SHA-256 without --verify.
    std::fs::remove_file(&victim).unwrap();
    let mut bytes = std::fs::read(&elsewhere).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    std::fs::write(&victim, bytes).unwrap();
    assert!(!opts.verify);
    let e = lakecdc::query::run(&rig.job_context(), &opts)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains(&listed[0]) && e.to_string().contains("sha256"),
        "{e}"
    );
    assert!(!out.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn as_of_reads_an_earlier_state_until_gc_passes_the_retention() {
    use lakecdc::clock::Clock;
    use std::time::Duration;
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(1907);
    rig.seed(60, &mut r).await;
    rig.flush().await;
    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("cache");
    let out = t.path().join("state.parquet");
    let opts = options(
        &rig,
        "SELECT * FROM customer",
        Format::Parquet,
        &out,
        &cache,
    );
    // The state at version v1, as the test records it.
    let then = state_via_query(&rig, &opts).await;
    let v1 = oracle::manifest_json(rig.store.as_ref(), MANIFEST)
        .await
        .unwrap()["version"]
        .as_i64()
        .unwrap();
    let v1_at = lakecdc::clock::SystemClock.now_ms();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let v1_files = rig.listed().await;

    // Later flushes (updates, deletes), an init and a compaction that retire v1's files, more
    // flushes, gc past the grace but within the retention.
    random_ops(&mut rig, &mut r, 30).await;
    rig.flush().await;
    init_replacing(&rig).await;
    random_ops(&mut rig, &mut r, 30).await;
    rig.flush().await;
    compact_rewriting(&rig).await;
    random_ops(&mut rig, &mut r, 20).await;
    rig.flush().await;
    let now = state_via_query(&rig, &opts).await;
    assert_ne!(now, then, "the workload changed the state");
    let (clock, gc_ctx, gc_opts) =
        rig.gc_on_a_manual_clock_keeping_history(Duration::from_secs(24 * 3600));
    clock.advance(16 * 60 * 1000);
    lakecdc::gc::run(&gc_ctx, &gc_opts).await.unwrap();

    let as_of = |text: String| QueryOptions {
        as_of: Some(text),
        ..opts.clone()
    };
    assert_eq!(state_via_query(&rig, &as_of(v1.to_string())).await, then);
    let at = lakecdc::lake::history::format_ms(v1_at);
    assert_eq!(state_via_query(&rig, &as_of(at)).await, then);
    assert_eq!(state_via_query(&rig, &opts).await, now);

    // Past the retention, gc removes what only old versions read and their copies; asking for
    // v1 then says so.
    clock.advance(25 * 3600 * 1000);
    lakecdc::gc::run(&gc_ctx, &gc_opts).await.unwrap();
    let keys = rig.keys("data/").await;
    let listed = rig.listed().await;
    let only_v1: Vec<&String> = v1_files.iter().filter(|f| !listed.contains(f)).collect();
    assert!(!only_v1.is_empty(), "the compaction retired v1's files");
    assert!(
        only_v1.iter().all(|f| !keys.contains(f)),
        "{only_v1:?} {keys:?}"
    );
    let history = rig.keys(&format!("{MANIFEST}.history/")).await;
    // The copy in force when the window opened and the later ones (gc's own save) are kept.
    let v1_copy = format!("{MANIFEST}.history/{v1:020}.json");
    assert!(
        !history.contains(&v1_copy) && (1..=2).contains(&history.len()),
        "{history:?}"
    );
    let e = lakecdc::query::run(
        &lakecdc::job::Context {
            clock: clock.clone(),
            ..rig.job_context()
        },
        &as_of(v1.to_string()),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("past the history retention"), "{e}");
    assert_eq!(e.exit_code(), 2);
}
