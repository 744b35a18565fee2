//! The COPY tap against the real cluster over TLS: one canary per driver behaviour the tap
//! relies on (numbered as in the module doc of `src/source/copy_tap.rs`), each failing with
//! the number of the behaviour that changed; and its off switch, with which init and flush
//! write the same lake as with the tap on.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::TryStreamExt;
use lakecdc::clock::SystemClock;
use lakecdc::flush::{Context, FlushOptions};
use lakecdc::init::{InitOptions, Outcome};
use lakecdc::lake::Lake;
use lakecdc::source::Connector;
use lakecdc::source::connect::TappedClient;
use lakecdc::source::copy_tap::{Divert, SharedSink};
use lakecdc::store::ObjectStore;
use lakecdc::store::local::LocalStore;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{GenericClient, IsolationLevel, Statement};

use crate::source::{Collected, assert_answers_queries, divide, tapped_copy, untapped_copy};
use crate::support::harness::{self, TestDb};
use crate::support::oracle::{self, LakeRow};
use crate::support::rig::{LakeKind, rig};
use crate::support::writer::Rng;

/// What a canary says when the behaviour it watches has changed.
fn changed(n: u8, what: &str) -> String {
    format!(
        "tokio-postgres changed behaviour {n} ({what}) the COPY tap relies on; \
         see src/source/copy_tap.rs"
    )
}

const ONE: &str = "every server message is read through the TLS stream, from the first";
const TWO: &str = "copy_out ends its stream at CopyDone, with or without CopyData";
const THREE: &str = "query_raw asks for every column in binary";
const FOUR: &str = "a row stream is not checked against CommandComplete's count";
const FIVE: &str = "requests go out in the order their futures are first polled";
const SIX: &str = "each statement ends at exactly one CommandComplete, EmptyQueryResponse, \
                   ErrorResponse or CopyDone";
const SEVEN: &str = "an abandoned statement's responses are read and dropped";

/// Runs canary `n` within a minute: a changed behaviour can leave the protocol stalled (the
/// tap out of step, a statement waiting for a message the tap took), and that must fail too.
async fn canary(n: u8, what: &str, body: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(Duration::from_secs(60), body)
        .await
        .unwrap_or_else(|_| panic!("{} (stalled for a minute)", changed(n, what)));
}

/// A tapped connection to a fresh database, over TLS.
async fn tapped() -> (TestDb, TappedClient) {
    let db = TestDb::new().await;
    let conn = db.connector().connect_tapped().await.unwrap();
    assert_tls(&conn.client).await;
    assert!(conn.tap.is_live(), "{}", changed(1, ONE));
    (db, conn)
}

/// Asserts that `client`'s session runs over TLS.
async fn assert_tls(client: &tokio_postgres::Client) {
    assert!(
        uses_tls(client).await,
        "the test cluster's connections use TLS"
    );
}

/// Whether `client`'s session runs over TLS.
async fn uses_tls(client: &tokio_postgres::Client) -> bool {
    client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

fn sink() -> Arc<Mutex<Collected>> {
    Arc::new(Mutex::new(Collected::default()))
}

fn taken(sink: &Mutex<Collected>) -> Vec<u8> {
    std::mem::take(&mut sink.lock().unwrap().0)
}

/// One binary tuple (a COPY tuple, or a DataRow payload) of `int8` values.
fn int8_tuple(values: &[i64]) -> Vec<u8> {
    let mut t = (values.len() as i16).to_be_bytes().to_vec();
    for v in values {
        t.extend_from_slice(&8i32.to_be_bytes());
        t.extend_from_slice(&v.to_be_bytes());
    }
    t
}

/// The tuples of one `int8` column with `values`.
fn int8_rows(values: impl IntoIterator<Item = i64>) -> Vec<u8> {
    values.into_iter().flat_map(|v| int8_tuple(&[v])).collect()
}

/// A binary COPY stream of one `int8` column: header, tuples, end marker.
fn int8_copy(values: impl IntoIterator<Item = i64>) -> Vec<u8> {
    [
        &b"PGCOPY\n\xff\r\n\0"[..],
        &[0; 8],
        &int8_rows(values),
        &(-1i16).to_be_bytes(),
    ]
    .concat()
}

/// Asserts `got == want`, showing where they first differ rather than every byte.
#[track_caller]
fn assert_same_bytes(got: &[u8], want: &[u8], why: &str) {
    if got != want {
        let at = got
            .iter()
            .zip(want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        let near = |b: &[u8]| b[at..b.len().min(at + 16)].to_vec();
        panic!(
            "{why}\n{} bytes where {} were expected, first differing at byte {at}: {:?}, not {:?}",
            got.len(),
            want.len(),
            near(got),
            near(want)
        );
    }
}

/// Runs prepared `statement` as lakecdc's by-id reads do (`query_raw`, its stream drained):
/// the rows that reached tokio-postgres, and the row count it reports.
async fn read(
    client: &impl GenericClient,
    statement: &Statement,
    params: &[&(dyn ToSql + Sync)],
) -> Result<(usize, Option<u64>), tokio_postgres::Error> {
    let stream = client
        .query_raw(statement, params.iter().map(|p| *p as &dyn ToSql))
        .await?;
    futures::pin_mut!(stream);
    let mut rows = 0;
    while stream.try_next().await?.is_some() {
        rows += 1;
    }
    Ok((rows, stream.rows_affected()))
}

/// `SELECT n::int8 FROM generate_series(1, $1::int8) n`.
const SERIES: &str = "SELECT n::int8 FROM generate_series(1, $1::int8) n";

#[tokio::test]
async fn canary_1_every_server_message_is_read_through_the_tls_stream() {
    canary(1, ONE, async {
        let db = TestDb::new().await;
        let conn = db.connector().connect_tapped().await.unwrap();
        let (client, tap) = (&conn.client, &conn.tap);
        // The handshake's stream was handed to tokio-postgres, which reads the session through it.
        assert!(tap.is_live(), "{}", changed(1, ONE));
        assert_tls(client).await;
        // Unarmed, everything passes: messages the server sends unasked (ParameterStatus, a
        // notice) reach tokio-postgres through the tap.
        client
            .batch_execute(
                "SET application_name = 'canary'; DO $$ BEGIN RAISE NOTICE 'passing by'; END $$",
            )
            .await
            .unwrap();
        assert_eq!(tap.diverted(), 0);
        // The tap's framing started at the server's first message and is still in step: an armed
        // COPY's data, and only that, is taken.
        let (data, result) =
            tapped_copy(client, tap, "SELECT n::int8 FROM generate_series(1, 3) n").await;
        assert_eq!(result.ok(), Some(0), "{}", changed(1, ONE));
        assert_same_bytes(&data, &int8_copy(1..=3), &changed(1, ONE));
        assert_eq!(tap.diverted(), 4, "three rows and the end marker");
        assert_answers_queries(client).await;
    })
    .await;
}

#[tokio::test]
async fn canary_2_copy_out_ends_at_copy_done_without_data() {
    canary(2, TWO, async {
        let (_db, conn) = tapped().await;
        let (client, tap) = (&conn.client, &conn.tap);
        let query = "SELECT n::int8 FROM generate_series(1, 1000) n";
        let (data, result) = tapped_copy(client, tap, query).await;
        assert_eq!(result.ok(), Some(0), "{}", changed(2, TWO));
        assert_same_bytes(&data, &int8_copy(1..=1000), &changed(2, TWO));
        // The stream ended at CopyDone, where the tap ends the statement: the reader disarms right
        // then, and the tap arms again at once.
        let s = sink();
        let armed = tap
            .arm(s.clone())
            .unwrap_or_else(|| panic!("{}", changed(2, TWO)));
        let chunks = untapped_copy(client, query).await.unwrap();
        drop(armed);
        assert!(chunks.is_empty(), "{}", changed(2, TWO));
        assert_same_bytes(&taken(&s), &int8_copy(1..=1000), &changed(2, TWO));
        assert_answers_queries(client).await;
    })
    .await;
}

#[tokio::test]
async fn canary_3_query_raw_asks_for_binary_results() {
    canary(3, THREE, async {
        let (_db, conn) = tapped().await;
        let (client, tap) = (&conn.client, &conn.tap);
        let statement = client
            .prepare("SELECT $1::int8, 'é'::text, NULL::int4, true")
            .await
            .unwrap();
        let s = sink();
        let armed = tap.arm_for(Divert::DataRows, vec![s.clone() as SharedSink]);
        let read = read(client, &statement, &[&7i64]).await.unwrap();
        drop(armed);
        assert_eq!(read, (0, Some(1)));
        // Four fields, each a length and its value in binary: int8 big-endian, text as UTF-8,
        // NULL as length -1, bool as one byte.
        let row = [
            &4i16.to_be_bytes()[..],
            &8i32.to_be_bytes(),
            &7i64.to_be_bytes(),
            &2i32.to_be_bytes(),
            "é".as_bytes(),
            &(-1i32).to_be_bytes(),
            &1i32.to_be_bytes(),
            &[1],
        ]
        .concat();
        assert_same_bytes(&taken(&s), &row, &changed(3, THREE));
    })
    .await;
}

#[tokio::test]
async fn canary_4_a_row_stream_is_not_checked_against_its_count() {
    canary(4, FOUR, async {
        let (_db, conn) = tapped().await;
        let (client, tap) = (&conn.client, &conn.tap);
        let statement = client.prepare(SERIES).await.unwrap();
        let s = sink();
        let armed = tap.arm_for(Divert::DataRows, vec![s.clone() as SharedSink]);
        let read = read(client, &statement, &[&500i64]).await;
        drop(armed);
        // tokio-postgres saw no row, takes the server's word for 500, and says so.
        assert_eq!(read.ok(), Some((0, Some(500))), "{}", changed(4, FOUR));
        assert_same_bytes(&taken(&s), &int8_rows(1..=500), &changed(4, FOUR));
    })
    .await;
}

#[tokio::test]
async fn canary_5_pipelined_reads_are_sent_in_join_order() {
    canary(5, FIVE, async {
        let (_db, mut conn) = tapped().await;
        let (client, tap) = (&mut conn.client, &conn.tap);
        let ups = client.prepare(SERIES).await.unwrap();
        let downs = client
            .prepare("SELECT -n::int8 FROM generate_series(1, $1::int8) n")
            .await
            .unwrap();
        // As the by-id read: two prepared reads in one snapshot, sent at once with `try_join!`,
        // the tap armed with their sinks in the order the futures are listed.
        let tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .unwrap();
        let (first, second) = (sink(), sink());
        let armed = tap.arm_for(
            Divert::DataRows,
            vec![first.clone() as SharedSink, second.clone() as SharedSink],
        );
        let (a, b) =
            futures::try_join!(read(&tx, &ups, &[&300i64]), read(&tx, &downs, &[&200i64])).unwrap();
        drop(armed);
        tx.commit().await.unwrap();
        assert_eq!((a, b), ((0, Some(300)), (0, Some(200))));
        assert_same_bytes(&taken(&first), &int8_rows(1..=300), &changed(5, FIVE));
        assert_same_bytes(
            &taken(&second),
            &int8_rows((1..=200).map(|n| -n)),
            &changed(5, FIVE),
        );
    })
    .await;
}

#[tokio::test]
async fn canary_6_each_statement_ends_at_one_terminator() {
    canary(6, SIX, async {
        let (_db, conn) = tapped().await;
        let (client, tap) = (&conn.client, &conn.tap);
        // Three reads sent at once: one fails at its third row (ErrorResponse), one is empty
        // (EmptyQueryResponse), one completes (CommandComplete). Each is its own request, so the
        // failure ends only the first.
        let fails = client.prepare(&divide(3, 5)).await.unwrap();
        let empty = client.prepare("").await.unwrap();
        let series = client.prepare(SERIES).await.unwrap();
        let sinks = [sink(), sink(), sink()];
        let armed = tap.arm_for(
            Divert::DataRows,
            sinks.iter().map(|s| s.clone() as SharedSink).collect(),
        );
        let (failed, nothing, three) = futures::join!(
            read(client, &fails, &[]),
            read(client, &empty, &[]),
            read(client, &series, &[&3i64])
        );
        drop(armed);
        let failed = failed.err();
        assert_eq!(
            failed.as_ref().and_then(|e| e.code()),
            Some(&SqlState::DIVISION_BY_ZERO),
            "{failed:?}"
        );
        assert_eq!(nothing.ok(), Some((0, None)), "{}", changed(6, SIX));
        assert_eq!(three.ok(), Some((0, Some(3))), "{}", changed(6, SIX));
        let [failing, empty, three] = sinks.map(|s| taken(&s));
        // 1/(3 - n): 0 and 1, then a division by zero.
        assert_same_bytes(&failing, &int8_rows([0, 1]), &changed(6, SIX));
        assert!(empty.is_empty(), "{}", changed(6, SIX));
        assert_same_bytes(&three, &int8_rows(1..=3), &changed(6, SIX));

        // Every statement ended: the tap arms again. A COPY that fails ends at its ErrorResponse,
        // one that completes at its CopyDone.
        for (query, want) in [
            (divide(3, 5), Err(SqlState::DIVISION_BY_ZERO)),
            (divide(0, 4), Ok(int8_copy((1..=4).map(|n| 1 / -n)))),
        ] {
            let s = sink();
            let armed = tap
                .arm(s.clone())
                .unwrap_or_else(|| panic!("{}", changed(6, SIX)));
            let result = untapped_copy(client, &query).await;
            drop(armed);
            let data = taken(&s);
            match want {
                Err(code) => {
                    assert_eq!(result.err().as_ref().and_then(|e| e.code()), Some(&code));
                    let rows_before =
                        [&b"PGCOPY\n\xff\r\n\0"[..], &[0; 8], &int8_rows([0, 1])].concat();
                    assert_same_bytes(&data, &rows_before, &changed(6, SIX));
                }
                Ok(copy) => {
                    assert_eq!(result.ok().map(|c| c.len()), Some(0), "{}", changed(6, SIX));
                    assert_same_bytes(&data, &copy, &changed(6, SIX));
                }
            }
        }
        assert!(tap.arm(sink()).is_some(), "{}", changed(6, SIX));
    })
    .await;
}

#[tokio::test]
async fn canary_7_an_abandoned_statement_is_drained_by_the_driver() {
    canary(7, SEVEN, async {
        let (_db, conn) = tapped().await;
        let (client, tap) = (&conn.client, &conn.tap);
        // Two seconds of rows, 2 ms each: still running when the reader gives up on it.
        let slow = client
            .prepare(
                "SELECT n::int8 FROM generate_series(1, 1000) n, \
                 LATERAL (SELECT pg_sleep(0.002) WHERE n > 0) s",
            )
            .await
            .unwrap();
        let series = client.prepare(SERIES).await.unwrap();
        let s = sink();
        let armed = tap.arm_for(Divert::DataRows, vec![s.clone() as SharedSink]);
        {
            let stream = client
                .query_raw(&slow, std::iter::empty::<&dyn ToSql>())
                .await
                .unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while s.lock().unwrap().0.is_empty() && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert!(!s.lock().unwrap().0.is_empty(), "rows were diverted");
            drop(stream);
        }
        drop(armed);
        assert!(
            tap.arm(sink()).is_none(),
            "disarmed early, the tap is spent"
        );
        // The rest of the abandoned read passes the spent tap; tokio-postgres drops it, and the
        // next statements get their own results.
        let (rows, count) = read(client, &series, &[&5i64]).await.unwrap();
        assert_eq!((rows, count), (5, Some(5)), "{}", changed(7, SEVEN));
        let got: Vec<i64> = client
            .query(&series, &[&4i64])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(got, [1, 2, 3, 4], "{}", changed(7, SEVEN));
        assert_answers_queries(client).await;
    })
    .await;
}

/// A copy of `db` named `{db}_{suffix}` (`CREATE DATABASE … TEMPLATE`), after closing every
/// session on it.
async fn copy_named(db: &TestDb, suffix: &str) -> TestDb {
    let (base, name) = db.url.rsplit_once('/').unwrap();
    let admin = harness::pg_client(&harness::pg_admin_url()).await;
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
            &[&name],
        )
        .await
        .unwrap();
    // The server waits a few seconds for the terminated sessions to go.
    admin
        .batch_execute(&format!("CREATE DATABASE {name}_{suffix} TEMPLATE {name}"))
        .await
        .unwrap();
    TestDb::adopt(format!("{base}/{name}_{suffix}"))
}

/// A lake written by init then flush through `connector`, and the messages its taps diverted
/// after each.
struct Exported {
    store: Arc<LocalStore>,
    diverted_by_init: u64,
    diverted_by_flush: u64,
    _dir: tempfile::TempDir,
}

async fn export(template: &Context, connector: Connector) -> Exported {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(LocalStore::open(dir.path().join("lake")).unwrap());
    let ctx = Context {
        connector: connector.clone(),
        lake: Lake {
            store: store.clone(),
            layout: template.lake.layout.clone(),
        },
        clock: Arc::new(SystemClock),
        ..template.clone()
    };
    // Where init cuts its files depends on the planner's row estimate and, with several
    // readers, on the order their pages arrive: one reader and fresh statistics make both
    // databases' files the same.
    connector
        .connect()
        .await
        .unwrap()
        .batch_execute("ANALYZE")
        .await
        .unwrap();
    let init = InitOptions {
        schemas: vec!["customer".into()],
        work_dir: dir.path().to_path_buf(),
        page_rows: 25,
        max_file_rows: 60,
        readers: 1,
        ..InitOptions::default()
    };
    let report = lakecdc::init::run(&ctx, &init).await.unwrap();
    assert_eq!(report.schemas[0].outcome, Outcome::Exported);
    let diverted_by_init = connector.copy_tap_diverted();
    // The versions still dirty go out again as deltas, read by id.
    let flush = FlushOptions {
        force: true,
        batch_size: 40,
        work_dir: dir.path().to_path_buf(),
        ..FlushOptions::default()
    };
    lakecdc::flush::run(&ctx, &flush).await.unwrap();
    Exported {
        store,
        diverted_by_init,
        diverted_by_flush: connector.copy_tap_diverted() - diverted_by_init,
        _dir: dir,
    }
}

/// A listed file as two lakes can share it: everything but its key and time bounds.
#[derive(Debug, PartialEq)]
struct File {
    tier: String,
    row_id_min: String,
    row_id_max: String,
    row_count: u64,
    size_bytes: u64,
    checksum: String,
}

/// The rows of one file.
type Rows = Vec<(uuid::Uuid, LakeRow)>;

/// The files of a lake's manifest, bases then deltas, each by row-id range (ties in manifest
/// order), with their rows.
async fn files(store: &dyn ObjectStore) -> Vec<(File, Rows)> {
    let m = oracle::manifest_json(store, "manifest/100.json")
        .await
        .unwrap();
    let mut out = Vec::new();
    for f in m["files"].as_array().unwrap() {
        let text = |k: &str| f[k].as_str().unwrap().to_string();
        let bytes = store.get_bytes(&text("path")).await.unwrap().bytes;
        let file = File {
            tier: text("tier"),
            row_id_min: text("row_id_min"),
            row_id_max: text("row_id_max"),
            row_count: f["row_count"].as_u64().unwrap(),
            size_bytes: f["size_bytes"].as_u64().unwrap(),
            checksum: text("checksum"),
        };
        out.push((file, oracle::read_parquet(bytes)));
    }
    out.sort_by(|(a, _), (b, _)| {
        (a.tier == "delta", &a.row_id_min).cmp(&(b.tier == "delta", &b.row_id_min))
    });
    out
}

/// Init then flush write the same lake, file by file and byte for byte, over TLS and over a
/// plain connection (`sslmode=disable`), each with the COPY tap on and off. A plain connection
/// is tapped like a TLS one: lakecdc opens its socket (`src/source/socket.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_and_flush_write_the_same_lake_over_tls_and_plain_with_the_tap_on_and_off() {
    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(517);
    rig.seed(90, &mut r).await;
    for _ in 0..200 {
        rig.writer.random_op(&mut r).await;
    }
    let live = rig.writer.rows.values().filter(|m| !m.soft_deleted).count();
    // The same rows four times: each export marks its database's rows, so each reads a copy.
    let plain_url = |db: &TestDb| format!("{}?sslmode=disable", db.url);
    let copies = [
        copy_named(&rig.db, "tls_off").await,
        copy_named(&rig.db, "plain_on").await,
        copy_named(&rig.db, "plain_off").await,
    ];
    let connectors = [
        (true, true, rig.db.connector()),
        (true, false, copies[0].connector().with_copy_tap(false)),
        (
            false,
            true,
            Connector::new(&harness::pg_settings(&plain_url(&copies[1]))).unwrap(),
        ),
        (
            false,
            false,
            Connector::new(&harness::pg_settings(&plain_url(&copies[2])))
                .unwrap()
                .with_copy_tap(false),
        ),
    ];
    let mut lakes = Vec::new();
    for (tls, tap, connector) in connectors {
        let what = format!("tls {tls}, tap {tap}");
        assert_eq!(connector.copy_tap(), tap, "{what}");
        {
            let conn = connector.connect_tapped().await.unwrap();
            assert_eq!(
                uses_tls(&conn.client).await,
                tls,
                "{what}: the session's transport"
            );
            assert_eq!(conn.tap.is_live(), tap, "{what}");
        }
        let lake = export(&rig.ctx, connector).await;
        // The reads went through the tap with it on, and none with it off.
        if tap {
            assert!(
                lake.diverted_by_init > live as u64 && lake.diverted_by_flush > 0,
                "{what}: init's and flush's rows went through the tap: {} and {} messages for \
                 {live} rows",
                lake.diverted_by_init,
                lake.diverted_by_flush
            );
        } else {
            assert_eq!(
                (lake.diverted_by_init, lake.diverted_by_flush),
                (0, 0),
                "{what}"
            );
        }
        lakes.push((what, files(lake.store.as_ref()).await));
    }
    let (_, a) = &lakes[0];
    let rows = |tier: &str, files: &[(File, Rows)]| -> usize {
        files
            .iter()
            .filter(|(f, _)| f.tier == tier)
            .map(|(_, rows)| rows.len())
            .sum()
    };
    assert_eq!(rows("base", a), live);
    assert!(
        a.iter().filter(|(f, _)| f.tier == "base").count() > 1,
        "several base files"
    );
    assert!(rows("delta", a) > 0, "flush wrote deltas");
    for (what, b) in &lakes[1..] {
        assert_eq!(a.len(), b.len(), "{what}: {a:?}\n{b:?}");
        for ((fa, ra), (fb, rb)) in a.iter().zip(b) {
            assert_eq!(ra, rb, "{what}: the rows of {fa:?} and {fb:?}");
            // The writer is deterministic: the same rows make the same bytes.
            assert_eq!(fa, fb, "{what}");
        }
    }
}
