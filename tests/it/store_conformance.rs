//! One conformance suite for every backend: memory, local, and s3 against SeaweedFS.

use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use lakecdc::store::local::LocalStore;
use lakecdc::store::memory::MemoryStore;
use lakecdc::store::{ObjectStore, PutMode, StoreError, sha256, stream};
use sha2::{Digest, Sha256};

use crate::support::harness;
use crate::support::http::recording_server;

async fn basic_operations(store: &dyn ObjectStore) {
    // put / get / head
    let put = store
        .put_bytes(
            "a/b/one.bin",
            Bytes::from_static(b"hello"),
            PutMode::Overwrite,
        )
        .await
        .unwrap();
    assert_eq!(put.size, 5);
    assert_eq!(put.sha256, sha256(b"hello"));
    let got = store.get_bytes("a/b/one.bin").await.unwrap();
    assert_eq!(&got.bytes[..], b"hello");
    assert_eq!(got.etag, put.etag);
    let head = store.head("a/b/one.bin").await.unwrap();
    assert_eq!((head.size, head.etag.as_str()), (5, put.etag.as_str()));
    assert!(head.last_modified_ms > 1_600_000_000_000, "{head:?}");

    // copy, with a key that needs percent-encoding in CopySource
    store
        .copy("a/b/one.bin", "a/c/two + three.bin")
        .await
        .unwrap();
    assert_eq!(
        &store.get_bytes("a/c/two + three.bin").await.unwrap().bytes[..],
        b"hello"
    );

    // get_to_file hashes what it wrote
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dl");
    let dl = store
        .get_to_file("a/c/two + three.bin", &path)
        .await
        .unwrap();
    assert_eq!(dl.size, 5);
    assert_eq!(dl.sha256, sha256(&std::fs::read(&path).unwrap()));

    // typed not-found everywhere
    assert!(matches!(
        store.get_bytes("a/missing").await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store.head("a/missing").await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store.get_to_file("a/missing", &dir.path().join("x")).await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store.copy("a/missing", "a/x").await,
        Err(StoreError::NotFound)
    ));

    // delete, and delete of a missing key succeeds
    store.delete("a/b/one.bin").await.unwrap();
    store.delete("a/b/one.bin").await.unwrap();
    assert!(matches!(
        store.head("a/b/one.bin").await,
        Err(StoreError::NotFound)
    ));
    let keys: Vec<String> = store
        .list("a/")
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.key)
        .collect();
    assert_eq!(keys, ["a/c/two + three.bin"]);
}

async fn conditional_writes(store: &dyn ObjectStore) {
    let key = "manifest/7.json";
    let first = store
        .put_bytes(key, Bytes::from_static(b"v1"), PutMode::Create)
        .await
        .unwrap();
    // create-if-absent on an existing key → conflict
    assert!(matches!(
        store
            .put_bytes(key, Bytes::from_static(b"x"), PutMode::Create)
            .await,
        Err(StoreError::Conflict)
    ));
    let second = store
        .put_bytes(
            key,
            Bytes::from_static(b"v2"),
            PutMode::Update(first.etag.clone()),
        )
        .await
        .unwrap();
    assert_ne!(first.etag, second.etag);
    // If-Match with the stale etag → conflict, content unchanged
    assert!(matches!(
        store
            .put_bytes(
                key,
                Bytes::from_static(b"x"),
                PutMode::Update(first.etag.clone())
            )
            .await,
        Err(StoreError::Conflict)
    ));
    assert_eq!(&store.get_bytes(key).await.unwrap().bytes[..], b"v2");
    // The etag an If-Match write answers is one If-Match takes: a flush chains its saves on
    // them without reading the manifest again (docs/design.md §3.2.3).
    store
        .put_bytes(key, Bytes::from_static(b"v3"), PutMode::Update(second.etag))
        .await
        .unwrap();
    assert_eq!(&store.get_bytes(key).await.unwrap().bytes[..], b"v3");
    // If-Match on a missing key → conflict (never a blind create)
    assert!(matches!(
        store
            .put_bytes(
                "manifest/none.json",
                Bytes::from_static(b"x"),
                PutMode::Update(first.etag)
            )
            .await,
        Err(StoreError::Conflict)
    ));
    assert!(matches!(
        store.head("manifest/none.json").await,
        Err(StoreError::NotFound)
    ));
}

async fn pagination(store: &dyn ObjectStore) {
    let n = 1_200;
    let writes = (0..n).map(|i| {
        let key = format!("p/{i:05}.bin");
        async move {
            store
                .put_bytes(&key, Bytes::from(format!("{i}")), PutMode::Overwrite)
                .await
                .unwrap();
        }
    });
    futures::stream::iter(writes)
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
    store
        .put_bytes("pq", Bytes::from_static(b"outside"), PutMode::Overwrite)
        .await
        .unwrap();
    let listed = store.list("p/").await.unwrap();
    assert_eq!(listed.len(), n);
    let want: Vec<String> = (0..n).map(|i| format!("p/{i:05}.bin")).collect();
    let got: Vec<String> = listed.iter().map(|m| m.key.clone()).collect();
    assert_eq!(got, want);
    assert_eq!(listed[7].size, 1);
}

use futures::StreamExt;

/// 16 writers race to update one manifest from the same etag: exactly one wins.
async fn racing_writers(store: Arc<dyn ObjectStore>) {
    let key = "manifest/race.json";
    for round in 0..5 {
        let base = store
            .put_bytes(
                key,
                Bytes::from(format!("round {round}")),
                PutMode::Overwrite,
            )
            .await
            .unwrap();
        let tasks: Vec<_> = (0..16)
            .map(|w| {
                let store = store.clone();
                let etag = base.etag.clone();
                tokio::spawn(async move {
                    store
                        .put_bytes(
                            key,
                            Bytes::from(format!("writer {w}")),
                            PutMode::Update(etag),
                        )
                        .await
                })
            })
            .collect();
        let mut wins = Vec::new();
        for (w, t) in tasks.into_iter().enumerate() {
            match t.await.unwrap() {
                Ok(_) => wins.push(w),
                Err(StoreError::Conflict) => {}
                Err(e) => panic!("writer {w}: unexpected {e:?}"),
            }
        }
        assert_eq!(wins.len(), 1, "round {round}: winners {wins:?}");
        let body = store.get_bytes(key).await.unwrap().bytes;
        assert_eq!(body, Bytes::from(format!("writer {}", wins[0])));
    }
    // Creators race the same way.
    let tasks: Vec<_> = (0..16)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .put_bytes(
                        "manifest/new.json",
                        Bytes::from(format!("{w}")),
                        PutMode::Create,
                    )
                    .await
            })
        })
        .collect();
    let mut wins = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => wins += 1,
            Err(StoreError::Conflict) => {}
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(wins, 1);
}

/// A 40 MiB file and a file of exactly two 16 MiB parts: multipart on S3; the returned SHA-256
/// equals an independent hash of the downloaded bytes.
async fn large_upload(store: &dyn ObjectStore, reader: &dyn ObjectStore) {
    let dir = tempfile::tempdir().unwrap();
    for (i, len) in [40 * 1024 * 1024 + 123, 32 * 1024 * 1024]
        .into_iter()
        .enumerate()
    {
        let path = dir.path().join(format!("big{i}.bin"));
        let key = format!("big/obj{i}.bin");
        let data = noise(len);
        std::fs::write(&path, &data).unwrap();
        let put = store.put_file(&key, &path).await.unwrap();
        assert_eq!(put.size, data.len() as u64);
        let downloaded = reader.get_bytes(&key).await.unwrap().bytes;
        assert_eq!(downloaded.len(), data.len());
        let independent: [u8; 32] = Sha256::digest(&downloaded).into();
        assert_eq!(put.sha256, independent);
        assert_eq!(downloaded[..], data[..]);
    }
}

/// `len` bytes that do not compress.
fn noise(len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    data
}

/// Writes `data` to a streamed upload of `key` in writes of uneven sizes, from a blocking
/// thread as the compaction's writer does; `end` ends the object, otherwise the writer is
/// dropped part-way.
async fn put_streamed(
    store: &dyn ObjectStore,
    key: &str,
    data: Vec<u8>,
    end: bool,
) -> Result<lakecdc::store::PutResult, StoreError> {
    let (mut w, parts) = stream::channel();
    let writer = tokio::task::spawn_blocking(move || {
        let mut at = 0;
        let mut step = 1;
        while at < data.len() {
            let n = step.min(data.len() - at);
            if w.write_all(&data[at..at + n]).is_err() {
                return;
            }
            at += n;
            step = step * 7 % 3_000_017 + 1;
        }
        if end {
            w.end().unwrap();
        }
    });
    let put = store.put_parts(key, parts).await;
    writer.await.unwrap();
    put
}

/// Streamed uploads (docs/design.md §9, the consolidated delta): an empty object, one of less
/// than a part and one of several parts (multipart on S3) are stored whole, their SHA-256 the
/// independent hash of what is read back; a writer that stops part-way stores nothing and
/// leaves no unfinished write behind.
async fn streamed_upload(store: &dyn ObjectStore, reader: &dyn ObjectStore) {
    for (key, len) in [
        ("streamed/empty.bin", 0),
        ("streamed/small.bin", 1_000),
        (
            "streamed/parts.bin",
            2 * stream::PART_BYTES + 3 * 1024 * 1024 + 77,
        ),
    ] {
        let data = noise(len);
        let put = put_streamed(store, key, data.clone(), true).await.unwrap();
        assert_eq!(put.size, len as u64, "{key}");
        let got = reader.get_bytes(key).await.unwrap().bytes;
        assert_eq!(got.len(), len, "{key}");
        assert_eq!(put.sha256, <[u8; 32]>::from(Sha256::digest(&got)), "{key}");
        assert!(got[..] == data[..], "{key}");
        assert_eq!(store.head(key).await.unwrap().etag, put.etag, "{key}");
    }
    let cut = put_streamed(
        store,
        "streamed/cut.bin",
        noise(3 * stream::PART_BYTES + 5),
        false,
    )
    .await;
    assert!(matches!(cut, Err(StoreError::Unfinished)), "{cut:?}");
    assert!(matches!(
        store.head("streamed/cut.bin").await,
        Err(StoreError::NotFound)
    ));
    assert_eq!(store.abandoned_writes("streamed/").await.unwrap(), vec![]);
    let keys: Vec<String> = store
        .list("streamed/")
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.key)
        .collect();
    assert_eq!(
        keys,
        [
            "streamed/empty.bin",
            "streamed/parts.bin",
            "streamed/small.bin"
        ]
    );
}

/// Capped reads (docs/security.md): an object over the cap is refused with its whole size —
/// which only its announced length (S3) or its opened file (local) gives before the body is
/// read — and no partial download is left; one at the cap is read whole.
async fn capped_reads(store: &dyn ObjectStore) {
    let body = Bytes::from(vec![7u8; 3 << 20]);
    let size = body.len() as u64;
    store
        .put_bytes("capped/big", body.clone(), PutMode::Overwrite)
        .await
        .unwrap();
    match store.get_bytes_within("capped/big", 1024).await {
        Err(StoreError::TooLarge { size: s, limit }) => assert_eq!((s, limit), (size, 1024)),
        other => panic!("{other:?}"),
    }
    let got = store.get_bytes_within("capped/big", size).await.unwrap();
    assert_eq!(got.bytes, body);
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("big");
    match store
        .get_to_file_within("capped/big", &local, size - 1)
        .await
    {
        Err(StoreError::TooLarge { size: s, .. }) => assert_eq!(s, size),
        other => panic!("{other:?}"),
    }
    let dl = store
        .get_to_file_within("capped/big", &dir.path().join("whole"), size)
        .await
        .unwrap();
    assert_eq!(dl.sha256, sha256(&body));
    assert!(matches!(
        store.get_bytes_within("capped/absent", 10).await,
        Err(StoreError::NotFound)
    ));
}

/// Ranged reads (`get_range`): exactly the bytes asked for, or an error — never a short read.
async fn ranged_reads(store: &dyn ObjectStore) {
    // Larger than one body chunk, so that an S3 range's body arrives in pieces.
    let body: Vec<u8> = (0..(3u32 << 20) + 17)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let size = body.len() as u64;
    let key = "ranged/obj.bin";
    store
        .put_bytes(key, Bytes::from(body.clone()), PutMode::Overwrite)
        .await
        .unwrap();
    // A middle range, across what would be chunk boundaries.
    let (offset, len) = (1_000_003u64, 2_000_000u64);
    let got = store.get_range(key, offset, len).await.unwrap();
    assert_eq!(got.len() as u64, len);
    assert_eq!(got[..], body[offset as usize..(offset + len) as usize]);
    // A small one at the start, and the object's last bytes.
    assert_eq!(store.get_range(key, 0, 4).await.unwrap()[..], body[..4]);
    let tail = store.get_range(key, size - 9, 9).await.unwrap();
    assert_eq!(tail[..], body[body.len() - 9..]);
    // The whole object as one range.
    assert_eq!(store.get_range(key, 0, size).await.unwrap()[..], body[..]);
    // Nothing asked for: empty, even at or past the end.
    assert!(store.get_range(key, 5, 0).await.unwrap().is_empty());
    assert!(store.get_range(key, size, 0).await.unwrap().is_empty());
    // A range that ends past the end is an error, never a short read: one starting inside
    // the object, one starting at its end, one past it, and one whose end overflows.
    for (offset, len) in [
        (size - 9, 10),
        (0, size + 1),
        (size, 1),
        (size + 100, 5),
        (u64::MAX - 1, 2),
    ] {
        match store.get_range(key, offset, len).await {
            Err(e @ StoreError::RangePastEnd { .. }) => {
                assert!(!e.is_retryable() && !e.is_not_found(), "{e:?}");
                assert!(e.to_string().contains("past the object's end"), "{e}");
            }
            other => panic!("{offset}+{len}: {other:?}"),
        }
    }
    // A missing object is the typed not-found.
    assert!(matches!(
        store.get_range("ranged/missing.bin", 0, 1).await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store.get_range("ranged/missing.bin", 10, 5).await,
        Err(StoreError::NotFound)
    ));
    // An empty object has no byte to read.
    store
        .put_bytes("ranged/empty.bin", Bytes::new(), PutMode::Overwrite)
        .await
        .unwrap();
    assert!(matches!(
        store.get_range("ranged/empty.bin", 0, 1).await,
        Err(StoreError::RangePastEnd { .. })
    ));
}

#[tokio::test]
async fn memory_store_conforms() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    basic_operations(store.as_ref()).await;
    conditional_writes(store.as_ref()).await;
    pagination(store.as_ref()).await;
    racing_writers(store.clone()).await;
    large_upload(store.as_ref(), store.as_ref()).await;
    streamed_upload(store.as_ref(), store.as_ref()).await;
    capped_reads(store.as_ref()).await;
    ranged_reads(store.as_ref()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn local_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(LocalStore::open(dir.path()).unwrap());
    basic_operations(store.as_ref()).await;
    conditional_writes(store.as_ref()).await;
    pagination(store.as_ref()).await;
    racing_writers(store.clone()).await;
    let reader = LocalStore::open(dir.path()).unwrap();
    large_upload(store.as_ref(), &reader).await;
    streamed_upload(store.as_ref(), &reader).await;
    capped_reads(store.as_ref()).await;
    ranged_reads(store.as_ref()).await;
    // No temp or lock file is ever listed.
    for m in store.list("").await.unwrap() {
        assert!(!m.key.contains(".lakecdc-"), "{}", m.key);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_store_conforms() {
    let store = harness::s3_bucket().await;
    let dynstore: Arc<dyn ObjectStore> = store.clone();
    basic_operations(dynstore.as_ref()).await;
    conditional_writes(dynstore.as_ref()).await;
    pagination(dynstore.as_ref()).await;
    racing_writers(dynstore.clone()).await;
    let reader = harness::s3_reader(store.bucket()).await;
    large_upload(dynstore.as_ref(), reader.as_ref()).await;
    streamed_upload(dynstore.as_ref(), reader.as_ref()).await;
    capped_reads(dynstore.as_ref()).await;
    ranged_reads(dynstore.as_ref()).await;
}

#[tokio::test]
async fn s3_missing_bucket_is_not_a_missing_object() {
    let store =
        lakecdc::store::s3::S3Store::connect(&harness::s3_options("no-such-bucket-lakecdc")).await;
    let err = store.get_bytes("manifest/7.json").await.unwrap_err();
    assert!(
        !err.is_not_found(),
        "a missing bucket read as not-found: {err:?}"
    );
    assert!(matches!(err, StoreError::NoSuchBucket { .. }), "{err:?}");
    let err = store
        .put_bytes(
            "manifest/7.json",
            Bytes::from_static(b"{}"),
            PutMode::Create,
        )
        .await
        .unwrap_err();
    assert!(!err.is_conflict(), "{err:?}");
    assert!(matches!(err, StoreError::NoSuchBucket { .. }), "{err:?}");
}

/// A server that accepts connections and never answers: its `http://` endpoint, and the task
/// to abort when done.
async fn silent_server() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    (format!("http://{addr}"), server)
}

#[tokio::test]
async fn an_s3_timeout_names_the_time_limits() {
    let (endpoint, server) = silent_server().await;
    let mut opts = harness::s3_options("silent");
    opts.endpoint = Some(endpoint);
    opts.attempt_timeout = std::time::Duration::from_secs(1);
    opts.operation_timeout = std::time::Duration::from_secs(3);
    let store = lakecdc::store::s3::S3Store::connect(&opts).await;
    let err = store.get_bytes("a.bin").await.unwrap_err();
    // A ranged read has the same limits.
    let ranged = store.get_range("a.bin", 0, 1).await.unwrap_err();
    server.abort();
    assert!(
        matches!(
            ranged,
            StoreError::Timeout {
                attempt_s: 1,
                request_s: 3
            }
        ),
        "{ranged:?}"
    );
    assert!(
        matches!(
            err,
            StoreError::Timeout {
                attempt_s: 1,
                request_s: 3
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "timed out (limits: 1s per attempt, 3s per request with its retries)"
    );
}

#[tokio::test]
async fn a_stalled_request_that_sends_little_is_retried_on_its_shorter_limit() {
    // docs/hazards.md L69: a HEAD, GET, LIST or small PUT that gets no answer is given up on
    // after attempts of the answer limit, a larger upload after attempts of the upload limit.
    let (endpoint, server) = silent_server().await;
    let mut opts = harness::s3_options("silent");
    opts.endpoint = Some(endpoint);
    opts.answer_timeout = std::time::Duration::from_secs(1);
    opts.attempt_timeout = std::time::Duration::from_secs(3);
    opts.operation_timeout = std::time::Duration::from_secs(30);
    let store = lakecdc::store::s3::S3Store::connect(&opts).await;
    /// The error a request failed with and how long it took.
    async fn timed<T>(
        request: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> (StoreError, std::time::Duration) {
        let started = std::time::Instant::now();
        match request.await {
            Ok(_) => panic!("a silent server answered"),
            Err(e) => (e, started.elapsed()),
        }
    }
    let small = || Bytes::from(vec![b'x'; 1 << 20]);
    let large = Bytes::from(vec![b'x'; (1 << 20) + 1]);
    let (head, get, list, put, create, large_put) = tokio::join!(
        timed(store.head("a.bin")),
        timed(store.get_bytes("a.bin")),
        timed(store.list("data/")),
        timed(store.put_bytes("m.json", small(), PutMode::Overwrite)),
        timed(store.put_bytes("n.json", small(), PutMode::Create)),
        timed(store.put_bytes("d.parquet", large, PutMode::Overwrite)),
    );
    server.abort();
    // Three attempts with the SDK's backoff between them (under 1 s, then under 2 s): 3 to
    // 6 s of 1 s attempts, 9 to 12 s of 3 s ones. A conditional save is sent once.
    let split = std::time::Duration::from_secs(8);
    let limits = |e: &StoreError| match e {
        StoreError::Timeout {
            attempt_s,
            request_s: 30,
        } => Some(*attempt_s),
        _ => None,
    };
    for (what, (err, took)) in [("head", head), ("get", get), ("list", list), ("put", put)] {
        assert!(
            limits(&err) == Some(1) && took < split,
            "{what}: {err:?} after {took:?}"
        );
    }
    let (err, took) = create;
    assert!(
        limits(&err) == Some(1) && took < std::time::Duration::from_secs(2),
        "conditional put: {err:?} after {took:?}"
    );
    let (err, took) = large_put;
    assert!(
        limits(&err) == Some(3) && took >= split,
        "large put: {err:?} after {took:?}"
    );
    assert_eq!(
        err.to_string(),
        "timed out (limits: 3s per attempt, 30s per request with its retries)"
    );
}

#[tokio::test]
async fn an_object_copied_part_by_part_is_the_same_object() {
    // The path a copy takes on AWS for a source over 5 GiB (CopyObject's limit), exercised
    // with 5 MiB parts: three parts, the last one short.
    let store = harness::s3_bucket().await;
    let body: Vec<u8> = (0..12 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    store
        .put_bytes("big/src.bin", Bytes::from(body.clone()), PutMode::Overwrite)
        .await
        .unwrap();
    store
        .copy_in_parts("big/src.bin", "big/dst.bin", body.len() as u64, 5 << 20)
        .await
        .unwrap();
    let got = store.get_bytes("big/dst.bin").await.unwrap();
    assert_eq!(got.bytes.len(), body.len());
    assert_eq!(sha256(&got.bytes), sha256(&body));
    // An empty object (no part to copy) is copied whole.
    store
        .put_bytes("big/empty.bin", Bytes::new(), PutMode::Overwrite)
        .await
        .unwrap();
    store
        .copy_in_parts("big/empty.bin", "big/empty2.bin", 0, 5 << 20)
        .await
        .unwrap();
    assert_eq!(store.head("big/empty2.bin").await.unwrap().size, 0);
    // A failed part copy aborts the upload and writes nothing.
    let err = store
        .copy_in_parts("big/missing.bin", "big/dst2.bin", 12 << 20, 5 << 20)
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "the missing source: {err:?}");
    assert!(
        store.head("big/dst2.bin").await.unwrap_err().is_not_found(),
        "{err}"
    );
}

#[tokio::test]
async fn an_s3_upload_is_signed_with_the_checksum_the_manifest_records() {
    // docs/design.md §3.3: the signer is handed lakecdc's own SHA-256 of the body instead of
    // hashing it again; the hash it signs must be exactly the body's, whatever the put mode.
    let (url, seen) = recording_server(
        "HTTP/1.1 200 OK\r\nETag: \"e\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".into(),
    );
    let mut opts = harness::s3_options("recorded");
    opts.endpoint = Some(url);
    let store = lakecdc::store::s3::S3Store::connect(&opts).await;
    let body: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut results = Vec::new();
    for mode in [
        PutMode::Overwrite,
        PutMode::Create,
        PutMode::Update("\"e\"".into()),
    ] {
        results.push(
            store
                .put_bytes("a/one.bin", Bytes::from(body.clone()), mode)
                .await
                .unwrap(),
        );
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3, "one request per put");
    for (request, put) in seen.iter().zip(&results) {
        let header = |name: &str| {
            request
                .header(name)
                .unwrap_or_else(|| panic!("no {name} header in {:?}", request.headers))
        };
        assert_eq!(request.method, "PUT");
        assert_eq!(request.path, "/recorded/a/one.bin?x-id=PutObject");
        assert_eq!(request.body, body, "the body arrives whole");
        assert_eq!(put.sha256, sha256(&body));
        assert_eq!(header("x-amz-content-sha256"), hex::encode(sha256(&body)));
        let auth = header("authorization");
        let signed = auth
            .split("SignedHeaders=")
            .nth(1)
            .and_then(|s| s.split(',').next())
            .unwrap_or_default();
        assert!(
            signed.split(';').any(|h| h == "x-amz-content-sha256"),
            "the payload hash is signed: {auth}"
        );
    }
}

#[tokio::test]
async fn a_conditional_write_whose_answer_is_lost_is_sent_once_never_retried() {
    // docs/hazards.md L29: a server that takes the whole request and then drops the
    // connection without an answer — a save that may have landed. A retry of a conditional
    // write would come back "precondition failed" against the save's own first attempt and
    // read as a lost race, so conditional writes go out once; the error is not a conflict.
    let (url, seen) = recording_server(String::new());
    let mut opts = harness::s3_options("dropped");
    opts.endpoint = Some(url);
    let store = lakecdc::store::s3::S3Store::connect(&opts).await;
    let body = Bytes::from_static(b"{\"version\": 8}");
    for mode in [PutMode::Create, PutMode::Update("\"e\"".into())] {
        let before = seen.lock().unwrap().len();
        let err = store
            .put_bytes("manifest/8.json", body.clone(), mode.clone())
            .await
            .unwrap_err();
        assert!(!err.is_conflict(), "{mode:?}: {err:?}");
        // The error line names the failure once, without the SDK's debug form.
        let line = lakecdc::error::Error::storage("save manifest", "manifest/8.json")(err).chain();
        assert!(
            line.starts_with("save manifest manifest/8.json: put object: dispatch failure")
                && line.matches("dispatch failure").count() == 1
                && !line.contains("DispatchFailure"),
            "{line}"
        );
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len() - before, 1, "{mode:?}: sent once, not retried");
        let request = seen.last().unwrap();
        assert_eq!(request.method, "PUT");
        assert_eq!(request.body, body, "the request arrived whole");
        let condition = match &mode {
            PutMode::Create => ("if-none-match", "*"),
            _ => ("if-match", "\"e\""),
        };
        assert_eq!(request.header(condition.0), Some(condition.1), "{mode:?}");
    }
    // The same loss on a plain write is retried: the single attempts above are the
    // conditional writes' own, not the server's doing.
    let before = seen.lock().unwrap().len();
    store
        .put_bytes("data/one.bin", body.clone(), PutMode::Overwrite)
        .await
        .unwrap_err();
    let attempts = seen.lock().unwrap().len() - before;
    assert!(attempts > 1, "a plain write was sent {attempts} time(s)");
}
