//! PostgreSQL access: the schema lock on one pinned connection, DSN quoting, password hygiene.

use std::time::Duration;

use lakecdc::source::{Connector, SchemaLock};

use crate::support::harness::{self, TestDb, pg_settings};

async fn advisory_holders(db: &TestDb, schema_id: i16) -> Vec<i32> {
    let client = db.client().await;
    client
        .query(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::int4::oid AND objid = $1::int4::oid AND objsubid = 2 AND granted",
            &[&i32::from(schema_id)],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test]
async fn schema_lock_is_taken_and_released_on_one_connection() {
    let db = TestDb::new().await;
    let conn = db.connector();
    let lock = SchemaLock::try_acquire(&conn, 101).await.unwrap().unwrap();
    assert_eq!(advisory_holders(&db, 101).await, [lock.backend_pid()]);
    assert!(SchemaLock::try_acquire(&conn, 101).await.unwrap().is_none());
    // Another schema is independent.
    let other = SchemaLock::try_acquire(&conn, 102).await.unwrap().unwrap();
    assert!(
        lock.release().await.unwrap(),
        "unlock ran on the holding session"
    );
    assert!(advisory_holders(&db, 101).await.is_empty());
    let again = SchemaLock::try_acquire(&conn, 101).await.unwrap().unwrap();
    drop(again); // closing the connection releases too
    drop(other);
    for _ in 0..50 {
        if advisory_holders(&db, 101).await.is_empty()
            && advisory_holders(&db, 102).await.is_empty()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("dropped locks were not released");
}

#[tokio::test]
async fn a_killed_holder_frees_the_lock() {
    let db = TestDb::new().await;
    let conn = db.connector();
    let holder = SchemaLock::try_acquire(&conn, 7).await.unwrap().unwrap();
    let admin = db.client().await;
    let killed: bool = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&holder.backend_pid()])
        .await
        .unwrap()
        .get(0);
    assert!(killed);
    for _ in 0..50 {
        if let Some(lock) = SchemaLock::try_acquire(&conn, 7).await.unwrap() {
            assert_ne!(lock.backend_pid(), holder.backend_pid());
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the lock of a terminated session was never freed");
}

#[tokio::test]
async fn keyword_dsn_with_spaces_and_quotes_connects() {
    let db = TestDb::new().await;
    // postgres://postgres@127.0.0.1:PORT/db → keyword form with awkward values.
    let rest = db.url.strip_prefix("postgres://postgres@").unwrap();
    let (hostport, dbname) = rest.split_once('/').unwrap();
    let (host, port) = hostport.split_once(':').unwrap();
    let dsn = format!(
        r"host={host} port={port} user=postgres dbname='{dbname}' password='p w\'q\\x' application_name='lakecdc test app' sslmode=disable"
    );
    let client = Connector::new(&pg_settings(&dsn))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let app: String = client
        .query_one("SELECT current_setting('application_name')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(app, "lakecdc test app");
}

#[tokio::test]
async fn change_log_stats_count_dirty_rows() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let tables = lakecdc::config::Tables::default();
    let mut c = db.client().await;
    lakecdc::source::ddl::apply(&mut c, &tables, &[], false)
        .await
        .unwrap();
    client
        .batch_execute(
            "INSERT INTO change_log (schema_id, row_id, flushed_at, changed_at) VALUES
             (100, gen_random_uuid(), 0, 50), (100, gen_random_uuid(), 0, 40),
             (100, gen_random_uuid(), 7, 10), (101, gen_random_uuid(), 0, 99)",
        )
        .await
        .unwrap();
    let s = lakecdc::source::stats::dirty(&client, &tables.change_log, 100)
        .await
        .unwrap();
    assert_eq!((s.count, s.oldest_changed_at), (2, 40));
    let s = lakecdc::source::stats::dirty(&client, &tables.change_log, 102)
        .await
        .unwrap();
    assert_eq!((s.count, s.oldest_changed_at), (0, 0));
    let schemas = lakecdc::source::stats::dirty_schemas(&client, &tables.change_log)
        .await
        .unwrap();
    assert_eq!(schemas, [100, 101]);
}

/// A client of `db` after creating the source tables (default names) in it.
async fn with_source_tables(db: &TestDb) -> (tokio_postgres::Client, lakecdc::config::Tables) {
    let mut client = db.client().await;
    let tables = lakecdc::config::Tables::default();
    lakecdc::source::ddl::apply(&mut client, &tables, &[], false)
        .await
        .unwrap();
    (client, tables)
}

/// `change_log` keeps every flushed slot, so finding the schemas with dirty rows must not read
/// the history: a per-minute idle flush would otherwise scan a table that only grows.
#[tokio::test]
async fn dirty_schemas_are_found_without_reading_the_flushed_history() {
    let db = TestDb::new().await;
    let (client, tables) = with_source_tables(&db).await;
    client
        .batch_execute(
            "INSERT INTO change_log (schema_id, row_id, flushed_at, changed_at)
             SELECT s, gen_random_uuid(), 1000 + i, i
             FROM generate_series(1, 20000) AS i, (VALUES (-3), (100), (101), (250)) AS v(s);
             INSERT INTO change_log (schema_id, row_id, flushed_at, changed_at) VALUES
             (-3, gen_random_uuid(), 0, 5), (101, gen_random_uuid(), 0, 7),
             (32767, gen_random_uuid(), 0, 9);
             ANALYZE change_log;",
        )
        .await
        .unwrap();
    // The server's statistics show what the lookup read: every row change_log gave any scan,
    // sequential or through an index (this session's counts are reported before each reading).
    let read = || async {
        client
            .batch_execute("SELECT pg_stat_force_next_flush()")
            .await
            .unwrap();
        client
            .query_one(
                "SELECT t.seq_tup_read + (SELECT sum(i.idx_tup_read)::int8 FROM pg_stat_user_indexes i
                                          WHERE i.relid = t.relid)
                 FROM pg_stat_user_tables t WHERE t.relid = 'change_log'::regclass",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    let before = read().await;
    let schemas = lakecdc::source::stats::dirty_schemas(&client, &tables.change_log)
        .await
        .unwrap();
    let rows_read = read().await - before;
    assert_eq!(schemas, [-3, 101, 32767]);
    // A few index entries per schema id, not the 80,003 slots of history.
    assert!(
        rows_read < 100,
        "the lookup read {rows_read} change_log rows"
    );
}

#[test]
fn a_password_never_reaches_errors_or_logs() {
    let secret = "hunter2-Sekr1t";
    let cases = [
        // Unreachable server (connection error path).
        format!(
            "host=127.0.0.1 port=1 user=u password='{secret} x' dbname=d sslmode=disable connect_timeout=2"
        ),
        format!("postgres://u:{secret}@127.0.0.1:1/d?sslmode=disable&connect_timeout=2"),
        // Malformed strings (parse error path).
        format!("host=127.0.0.1 password='{secret}"),
        format!("host=127.0.0.1 password={secret} bogus_option=1"),
        format!("host=127.0.0.1 password={secret} sslmode=sometimes"),
    ];
    for url in cases {
        for extra in [vec![], vec!["-vv"], vec!["--log-format", "json", "-vv"]] {
            let out = harness::bin()
                .args(["init-db", "--pg-url", &url])
                .args(&extra)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(!out.status.success(), "{url}");
            assert!(
                !stderr.contains("hunter2") && !stdout.contains("hunter2"),
                "{url}: {stderr}"
            );
            assert!(stderr.contains("lakecdc: error:"), "{stderr}");
        }
    }
}

/// init's progress total comes from the planner, not from a count that would read the table a
/// second time; it must still see only the schema's live rows.
#[tokio::test]
async fn the_live_row_estimate_follows_the_schema_and_its_deletions() {
    let db = TestDb::new().await;
    let (client, tables) = with_source_tables(&db).await;
    client
        .batch_execute(
            "INSERT INTO entity_main (ltbase_schema_id, ltbase_row_id, ltbase_created_at,
               ltbase_updated_at, ltbase_deleted_at)
             SELECT CASE WHEN i % 3 = 0 THEN 101 ELSE 100 END, gen_random_uuid(), i, i,
                    CASE WHEN i % 3 = 1 AND i % 2 = 0 THEN i END
             FROM generate_series(1, 30000) AS i;
             ANALYZE entity_main;",
        )
        .await
        .unwrap();
    // Schema 100: 20,000 rows, 5,000 of them soft-deleted; counted per reader range as init's
    // plan counts them (random ids: each of three ranges holds about a third).
    let ranges = lakecdc::source::live::live_ranges(&client, &tables, 100, 3)
        .await
        .unwrap();
    let counts = lakecdc::source::live::count_live_in(&client, &tables, 100, &ranges)
        .await
        .unwrap();
    assert_eq!(counts.len(), 3);
    assert!(
        counts.iter().all(|&n| (4_000..6_000).contains(&n)),
        "{counts:?}"
    );
    let exact: i64 = counts.iter().sum();
    assert_eq!(exact, 15_000);
    let estimate = lakecdc::source::live::estimate_live(&client, &tables, 100)
        .await
        .unwrap();
    // The planner assumes the schema and the deletions independent: close, not exact.
    assert!(
        (12_000..=18_000).contains(&estimate),
        "estimate {estimate} for 15,000 live rows"
    );
    let none = lakecdc::source::live::estimate_live(&client, &tables, 555)
        .await
        .unwrap();
    assert!(none <= 1, "estimate {none} for a schema without rows");
}

/// Collects what a COPY tap diverts.
#[derive(Default)]
pub struct Collected(pub Vec<u8>);

impl lakecdc::source::copy_tap::CopySink for Collected {
    fn copy_data(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
}

/// Binary COPY of `query` through the tap: the data the tap took, and the number of data
/// messages that reached tokio-postgres (or the error).
pub async fn tapped_copy(
    client: &tokio_postgres::Client,
    tap: &lakecdc::source::copy_tap::CopyTap,
    query: &str,
) -> (Vec<u8>, Result<usize, tokio_postgres::Error>) {
    use std::sync::{Arc, Mutex};
    let sink = Arc::new(Mutex::new(Collected::default()));
    let armed = tap.arm(sink.clone()).expect("the TLS connection is tapped");
    let result = untapped_copy(client, query)
        .await
        .map(|chunks| chunks.len());
    drop(armed);
    let data = std::mem::take(&mut sink.lock().unwrap().0);
    (data, result)
}

/// Binary COPY of `query` through tokio-postgres: its data messages.
pub async fn untapped_copy(
    client: &tokio_postgres::Client,
    query: &str,
) -> Result<Vec<bytes::Bytes>, tokio_postgres::Error> {
    use futures::TryStreamExt;
    let sql = format!("COPY ({query}) TO STDOUT (FORMAT binary)");
    client.copy_out(sql.as_str()).await?.try_collect().await
}

/// Asserts that `client` still runs ordinary statements and gets their results.
pub async fn assert_answers_queries(client: &tokio_postgres::Client) {
    let n: i64 = client
        .query_one("SELECT 42::int8", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 42);
}

/// `SELECT 1/(k - n)::int8 FROM generate_series(1, rows) n`: fails at row `k`.
pub fn divide(k: i64, rows: i64) -> String {
    format!("SELECT 1/({k} - n)::int8 FROM generate_series(1, {rows}) n")
}

#[tokio::test]
async fn a_tapped_connection_survives_a_copy_that_fails_midway() {
    let db = TestDb::new().await;
    let conn = db.connector().connect_tapped().await.unwrap();
    let (client, tap) = (&conn.client, &conn.tap);
    // The signature, flags and extension length, then per row: field count, length, value.
    let header = [&b"PGCOPY\n\xff\r\n\0"[..], &[0; 8]].concat();
    let row = |v: i64| {
        [
            &1i16.to_be_bytes()[..],
            &8i32.to_be_bytes(),
            &v.to_be_bytes(),
        ]
        .concat()
    };

    // Division by zero at row 2000: PostgreSQL has sent the rows before it when it fails.
    let (data, result) = tapped_copy(client, tap, &divide(2000, 5000)).await;
    let err = result.unwrap_err();
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::DIVISION_BY_ZERO)
    );
    let rows: Vec<u8> = (1..2000).flat_map(|n| row(1 / (2000 - n))).collect();
    assert_eq!(data, [header.clone(), rows].concat());
    assert_eq!(tap.diverted(), 1999);

    // The framing held: ordinary statements and a complete COPY work on the same connection,
    // and tokio-postgres saw none of the COPY's data.
    assert_answers_queries(client).await;
    let before = tap.diverted();
    let (data, result) = tapped_copy(client, tap, &divide(0, 3)).await;
    assert_eq!(result.unwrap(), 0, "no CopyData reached tokio-postgres");
    let rows: Vec<u8> = (1..=3).flat_map(|n| row(1 / (0 - n))).collect();
    assert_eq!(
        data,
        [header, rows, (-1i16).to_be_bytes().to_vec()].concat()
    );
    // PostgreSQL sends the header in the first row's message.
    assert_eq!(tap.diverted() - before, 4, "three rows and the end marker");

    // Megabytes of multibyte text, in messages that span the tap's reads: the same bytes as
    // tokio-postgres's messages on a plain connection.
    let text = "SELECT n, repeat('ä€𝄞', n % 50) FROM generate_series(1, 20000) n";
    let (data, result) = tapped_copy(client, tap, text).await;
    assert_eq!(result.unwrap(), 0);
    let plain = harness::pg_client(&format!("{}?sslmode=disable", db.url)).await;
    let expected = untapped_copy(&plain, text).await.unwrap().concat();
    assert!(expected.len() > 4 << 20, "{} bytes", expected.len());
    assert_eq!(data, expected);
}

#[tokio::test]
async fn a_copy_abandoned_midway_leaves_the_connection_correct_through_tokio_postgres() {
    use std::sync::{Arc, Mutex};
    let db = TestDb::new().await;
    let conn = db.connector().connect_tapped().await.unwrap();
    let (client, tap) = (&conn.client, &conn.tap);
    // Two seconds of rows, 2 ms each: the COPY is still running when the reader gives up.
    let big = "SELECT n, repeat('x', 100) FROM generate_series(1, 1000) n, \
               LATERAL (SELECT pg_sleep(0.002) WHERE n > 0) s";

    // A reader gives up on a COPY after its first data (a timeout, an abort): the server is
    // still sending it.
    let sink = Arc::new(Mutex::new(Collected::default()));
    let armed = tap.arm(sink.clone()).unwrap();
    {
        let sql = format!("COPY ({big}) TO STDOUT (FORMAT binary)");
        let stream = client.copy_out(sql.as_str()).await.unwrap();
        futures::pin_mut!(stream);
        // With the tap armed nothing reaches tokio-postgres until the COPY ends; wait for some
        // data to have been diverted, then abandon the stream.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while sink.lock().unwrap().0.is_empty() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(!sink.lock().unwrap().0.is_empty());
    }
    drop(armed);
    assert!(
        tap.arm(sink.clone()).is_none(),
        "a tap disarmed before its COPY ended is spent"
    );

    // Later statements on the connection are right, through tokio-postgres.
    assert_answers_queries(client).await;
    let small = "SELECT n, repeat('y', n) FROM generate_series(1, 500) n";
    let through_spent = untapped_copy(client, small).await.unwrap().concat();
    let plain = harness::pg_client(&format!("{}?sslmode=disable", db.url)).await;
    assert_eq!(
        through_spent,
        untapped_copy(&plain, small).await.unwrap().concat()
    );
}
