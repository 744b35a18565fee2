//! The S3 backend (aws-sdk-s3).
//!
//! Credentials, region and profiles come from aws-config's default chain only (env, profile,
//! IMDS/IRSA): one resolution path for everything (docs/hazards.md #302, #326, #329). An endpoint
//! override and path-style addressing support S3-compatible servers. Every call has a time
//! limit. Conditional writes run with SDK retries disabled: a retried conditional PUT whose
//! first attempt landed would come back 412 and make a committed write look lost.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use aws_config::BehaviorVersion;
use aws_runtime::auth::PayloadSigningOverride;
use aws_sdk_s3::Client;
use aws_sdk_s3::config::Region;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{ChecksumAlgorithm, CompletedMultipartUpload, CompletedPart};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::{
    BeforeTransmitInterceptorContextMut, BeforeTransmitInterceptorContextRef,
    FinalizerInterceptorContextRef,
};
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::{ConfigBag, Storable, StoreReplace};
use aws_smithy_types::retry::RetryConfig;
use aws_smithy_types::timeout::TimeoutConfig;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{
    AbandonedWrite, Download, GetResult, MULTIPART_THRESHOLD, ObjectMeta, ObjectStore, PutMode,
    PutResult, StoreError, range_end,
    stream::{self, Parts},
};

/// Size of each multipart part.
const PART_SIZE: usize = 16 * 1024 * 1024;
/// Parts uploaded (or copied) at once (bounds memory to about `PART_SIZE * PART_CONCURRENCY`).
const PART_CONCURRENCY: usize = 4;
/// The largest source one CopyObject may copy (AWS).
const MAX_COPY_OBJECT_BYTES: u64 = 5 * 1024 * 1024 * 1024;
/// Parts of a streamed upload ([`ObjectStore::put_parts`]) sent at once: with the part being
/// filled and the one waiting in the channel, about four parts of [`stream::PART_BYTES`] in
/// memory.
const STREAM_CONCURRENCY: usize = 2;
/// Size of each part of a multipart copy.
const COPY_PART_SIZE: u64 = 512 * 1024 * 1024;
/// Most parts in one multipart upload (S3).
const MAX_PARTS: u64 = 10_000;
/// A single-request upload at most this large has the answer limit per attempt
/// ([`S3Options::answer_timeout`]), as a request that sends no data has.
const QUICK_PUT_BYTES: u64 = 1024 * 1024;

/// The parts of a multipart upload handed out so far: how many, their bytes and the SHA-256
/// of the whole, computed as they go.
#[derive(Default)]
struct Uploaded {
    parts: i32,
    size: u64,
    hasher: Sha256,
}

impl Uploaded {
    /// Counts and hashes the next part, `chunk`; its part number, or an error past S3's limit
    /// of parts per upload.
    fn add(&mut self, chunk: &[u8]) -> Result<i32, StoreError> {
        if u64::try_from(self.parts).unwrap_or(u64::MAX) >= MAX_PARTS {
            return Err(StoreError::Backend {
                message: format!("a multipart upload passed {MAX_PARTS} parts"),
                source: None,
            });
        }
        self.hasher.update(chunk);
        self.size += chunk.len() as u64;
        self.parts += 1;
        Ok(self.parts)
    }
}

/// How to reach the S3 service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Options {
    /// The bucket holding the lake.
    pub bucket: String,
    /// Endpoint override (S3-compatible servers); `None` uses AWS's resolution.
    pub endpoint: Option<String>,
    /// Path-style addressing (`endpoint/bucket/key`).
    pub path_style: bool,
    /// Region override; otherwise the chain's, else `us-east-1`.
    pub region: Option<String>,
    /// Limit for one attempt of a request that uploads or copies data (a PUT over 1 MiB, a
    /// part, a copy, completing a multipart upload).
    pub attempt_timeout: Duration,
    /// Limit for one attempt of a request that sends no data or little (HEAD, a GET up to its
    /// answer's headers, DELETE, LIST, starting or aborting a multipart upload, a PUT of at
    /// most 1 MiB): its answer comes at once from a healthy server, so one that stalls is
    /// retried long before the upload limit (docs/hazards.md L69).
    pub answer_timeout: Duration,
    /// Limit for a whole request including retries.
    pub operation_timeout: Duration,
}

impl S3Options {
    /// Options for `bucket` with the default time limits.
    pub fn new(bucket: impl Into<String>) -> Self {
        Self {
            bucket: bucket.into(),
            endpoint: None,
            path_style: false,
            region: None,
            attempt_timeout: Duration::from_secs(120),
            answer_timeout: Duration::from_secs(20),
            operation_timeout: Duration::from_secs(600),
        }
    }
}

/// Refuses a half-set static credential pair in the environment: the SDK would otherwise fall
/// through to another provider or fail signing with an opaque error (docs/hazards.md #302).
pub fn check_env_credentials(
    access_key_id: Option<&str>,
    secret_access_key: Option<&str>,
) -> Result<(), String> {
    let set = |v: Option<&str>| v.is_some_and(|s| !s.is_empty());
    match (set(access_key_id), set(secret_access_key)) {
        (true, false) => Err(
            "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not: set both, or neither to use the profile or instance credentials".to_string(),
        ),
        (false, true) => Err(
            "AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not: set both, or neither to use the profile or instance credentials".to_string(),
        ),
        _ => Ok(()),
    }
}

/// An S3 bucket as an [`ObjectStore`].
#[derive(Debug, Clone)]
pub struct S3Store {
    /// For requests that upload or copy data.
    bulk: Lane,
    /// For requests that send no data or little (the shorter per-attempt limit).
    quick: Lane,
    bucket: String,
}

/// A client and the time limits it was built with.
#[derive(Debug, Clone)]
struct Lane {
    client: Client,
    limits: Limits,
}

/// The time limits a client was built with, named in a timeout error.
#[derive(Debug, Clone, Copy)]
struct Limits {
    attempt: Duration,
    request: Duration,
}

impl S3Store {
    /// Builds a client from aws-config's default chain plus `opts`. Makes no request.
    pub async fn connect(opts: &S3Options) -> Self {
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(region) = &opts.region {
            loader = loader.region(Region::new(region.clone()));
        }
        let shared = loader.load().await;
        let mut builder = aws_sdk_s3::config::Builder::from(&shared);
        if shared.region().is_none() {
            builder = builder.region(Region::new("us-east-1"));
        }
        if let Some(endpoint) = &opts.endpoint {
            builder = builder.endpoint_url(endpoint.clone());
        }
        builder = builder.force_path_style(opts.path_style);
        // lakecdc hashes every byte it downloads against the manifest itself; the SDK's own
        // check of a response's checksum only warns about multipart objects it cannot check.
        builder = builder
            .response_checksum_validation(
                aws_sdk_s3::config::ResponseChecksumValidation::WhenRequired,
            )
            .interceptor(RequestLog);
        // One client per per-attempt limit, each with its own connections.
        let lane = |attempt: Duration| {
            // The attempt's limit covers the wait for the answer's headers, so a stalled
            // request always ends as a timeout that names the limits (no separate read limit
            // racing it).
            let timeouts = TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(10))
                .disable_read_timeout()
                .operation_attempt_timeout(attempt)
                .operation_timeout(opts.operation_timeout)
                .build();
            Lane {
                client: Client::from_conf(builder.clone().timeout_config(timeouts).build()),
                limits: Limits {
                    attempt,
                    request: opts.operation_timeout,
                },
            }
        };
        Self {
            bulk: lane(opts.attempt_timeout),
            quick: lane(opts.answer_timeout.min(opts.attempt_timeout)),
            bucket: opts.bucket.clone(),
        }
    }

    /// The bucket name.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The SDK client, for test setup (bucket creation).
    pub fn client(&self) -> &Client {
        &self.bulk.client
    }

    /// Starts a GET of `key` and refuses it at once when its announced length passes `limit`
    /// (the body is then never read).
    async fn get_object(
        &self,
        key: &str,
        limit: u64,
    ) -> Result<aws_sdk_s3::operation::get_object::GetObjectOutput, StoreError> {
        let out = self
            .quick
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| classify(e, "get object", &self.bucket, self.quick.limits))?;
        let size = out
            .content_length()
            .map_or(0, |n| u64::try_from(n).unwrap_or(0));
        if size > limit {
            return Err(StoreError::TooLarge { size, limit });
        }
        Ok(out)
    }

    async fn put_multipart(&self, key: &str, path: &Path) -> Result<PutResult, StoreError> {
        let file = tokio::fs::File::open(path).await?;
        let upload_id = self.create_multipart(key, true).await?;
        let done = self
            .upload_chunks(key, &upload_id, file_chunks(file), PART_CONCURRENCY)
            .await;
        self.abort_failed(key, &upload_id, done).await
    }

    /// Starts a multipart upload to `key` (parts checksummed with CRC32 when `crc32`).
    async fn create_multipart(&self, key: &str, crc32: bool) -> Result<String, StoreError> {
        let mut req = self
            .quick
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(key);
        if crc32 {
            req = req.checksum_algorithm(ChecksumAlgorithm::Crc32);
        }
        let created = req.send().await.map_err(|e| {
            classify(
                e,
                "create multipart upload",
                &self.bucket,
                self.quick.limits,
            )
        })?;
        Ok(created.upload_id().unwrap_or_default().to_string())
    }

    /// Passes `done` on, first aborting the multipart upload when it failed (no parts are
    /// left behind to be billed).
    async fn abort_failed<T>(
        &self,
        key: &str,
        upload_id: &str,
        done: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if done.is_err() {
            let _ = self
                .quick
                .client
                .abort_multipart_upload()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(upload_id)
                .send()
                .await;
        }
        done
    }

    /// Copies `from` (of `size` bytes) to `to` part by part (UploadPartCopy, `part_size` bytes
    /// each, raised as needed to stay within S3's 10,000 parts): the way to copy an object
    /// larger than one CopyObject may copy (5 GiB). Public so that tests can copy a small
    /// object this way.
    pub async fn copy_in_parts(
        &self,
        from: &str,
        to: &str,
        size: u64,
        part_size: u64,
    ) -> Result<(), StoreError> {
        if size == 0 {
            // A multipart upload needs at least one part; an empty object copies whole.
            return self.copy(from, to).await;
        }
        let part_size = part_size.max(size.div_ceil(MAX_PARTS)).max(1);
        let upload_id = self.create_multipart(to, false).await?;
        let done = self.copy_parts(from, to, &upload_id, size, part_size).await;
        self.abort_failed(to, &upload_id, done).await
    }

    async fn copy_parts(
        &self,
        from: &str,
        to: &str,
        upload_id: &str,
        size: u64,
        part_size: u64,
    ) -> Result<(), StoreError> {
        let source = copy_source(&self.bucket, from);
        let ranges = (0..size.div_ceil(part_size)).map(|i| {
            let first = i * part_size;
            let last = (first + part_size).min(size) - 1;
            (i32::try_from(i + 1).unwrap_or(i32::MAX), first, last)
        });
        let parts: Vec<CompletedPart> = futures::stream::iter(ranges)
            .map(|(number, first, last)| {
                let source = source.clone();
                async move {
                    let out = self
                        .bulk
                        .client
                        .upload_part_copy()
                        .bucket(&self.bucket)
                        .key(to)
                        .upload_id(upload_id)
                        .part_number(number)
                        .copy_source(source)
                        .copy_source_range(format!("bytes={first}-{last}"))
                        .send()
                        .await
                        .map_err(|e| classify(e, "copy part", &self.bucket, self.bulk.limits))?;
                    let etag = out.copy_part_result().and_then(|r| r.e_tag());
                    Ok::<_, StoreError>(
                        CompletedPart::builder()
                            .part_number(number)
                            .set_e_tag(etag.map(str::to_string))
                            .build(),
                    )
                }
            })
            .buffered(PART_CONCURRENCY)
            .try_collect()
            .await?;
        self.complete_multipart(to, upload_id, parts, "complete multipart copy")
            .await?;
        Ok(())
    }

    /// Completes a multipart upload from its parts; returns the object's ETag.
    async fn complete_multipart(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<CompletedPart>,
        op: &'static str,
    ) -> Result<String, StoreError> {
        let done = self
            .bulk
            .client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            )
            .send()
            .await
            .map_err(|e| classify(e, op, &self.bucket, self.bulk.limits))?;
        Ok(done.e_tag().unwrap_or_default().to_string())
    }

    /// Uploads the parts of an object as `chunks` yields them, `concurrency` at a time,
    /// counting and hashing them as they go out, and completes the upload once `chunks` ends.
    /// The next chunk is taken (read from its file, or waited for from its writer) while the
    /// parts before it are being sent.
    async fn upload_chunks(
        &self,
        key: &str,
        upload_id: &str,
        chunks: impl futures::Stream<Item = Result<Bytes, StoreError>>,
        concurrency: usize,
    ) -> Result<PutResult, StoreError> {
        let mut chunks = std::pin::pin!(chunks);
        let mut sent = Uploaded::default();
        let mut pending = futures::stream::FuturesOrdered::new();
        let mut done = Vec::new();
        let mut ended = false;
        loop {
            tokio::select! {
                biased;
                Some(part) = pending.next(), if !pending.is_empty() => done.push(part?),
                next = chunks.next(), if !ended && pending.len() < concurrency => {
                    match next.transpose()? {
                        Some(chunk) => {
                            let part_number = sent.add(&chunk)?;
                            pending.push_back(self.upload_part(key, upload_id, part_number, chunk));
                        }
                        None => ended = true,
                    }
                }
                else => break,
            }
        }
        if sent.parts == 0 {
            return Err(StoreError::Backend {
                message: format!("a multipart upload to {key} was given no part"),
                source: None,
            });
        }
        self.complete_hashed(key, upload_id, done, sent).await
    }

    /// Completes a multipart upload whose parts `sent` counted and hashed as they went out.
    async fn complete_hashed(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<CompletedPart>,
        sent: Uploaded,
    ) -> Result<PutResult, StoreError> {
        let etag = self
            .complete_multipart(key, upload_id, parts, "complete multipart upload")
            .await?;
        Ok(PutResult {
            size: sent.size,
            sha256: sent.hasher.finalize().into(),
            etag,
        })
    }

    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        part_number: i32,
        chunk: Bytes,
    ) -> Result<CompletedPart, StoreError> {
        let out = self
            .bulk
            .client
            .upload_part()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .part_number(part_number)
            .checksum_algorithm(ChecksumAlgorithm::Crc32)
            .body(ByteStream::from(chunk))
            .send()
            .await
            .map_err(|e| classify(e, "upload part", &self.bucket, self.bulk.limits))?;
        let mut part = CompletedPart::builder()
            .part_number(part_number)
            .set_e_tag(out.e_tag().map(str::to_string));
        if let Some(crc) = out.checksum_crc32() {
            part = part.checksum_crc32(crc);
        }
        Ok(part.build())
    }
}

/// Signs a request with the SHA-256 of its body that lakecdc computed already, for the
/// manifest (docs/design.md §3.3): the signer would otherwise hash every uploaded byte a second
/// time. The payload stays signed: a server that checks signed payloads (AWS S3 does) refuses
/// a body other than the one whose hash the manifest records.
#[derive(Debug)]
struct SignedPayload(String);

impl Intercept for SignedPayload {
    fn name(&self) -> &'static str {
        "SignedPayload"
    }

    fn modify_before_signing(
        &self,
        _context: &mut BeforeTransmitInterceptorContextMut<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        cfg.interceptor_state()
            .store_put(PayloadSigningOverride::Precomputed(self.0.clone()));
        Ok(())
    }
}

/// Logs each attempt of each S3 request at debug level, with its answer and time, so that a
/// stalled request can be told from a slow job (`LAKECDC_LOG=info,lakecdc::store::s3=debug`).
/// It logs the operation, the method and the URI's path only: never the host, headers, query
/// strings or bodies.
#[derive(Debug)]
struct RequestLog;

/// When the attempt being logged was sent (unset until it is).
#[derive(Debug, Clone, Copy)]
struct Sent(std::time::Instant);

impl Storable for Sent {
    type Storer = StoreReplace<Self>;
}

/// The operation's name (`HeadObject`, …), for the log.
fn operation(cfg: &ConfigBag) -> &str {
    cfg.load::<Metadata>().map_or("?", Metadata::name)
}

/// The path of `uri` (`/bucket/key` or `/key`): without its scheme, host and query string.
fn uri_path(uri: &str) -> &str {
    let after_scheme = uri.split_once("://").map_or(uri, |(_, rest)| rest);
    let path = after_scheme.find('/').map_or("/", |i| &after_scheme[i..]);
    path.split(['?', '#']).next().unwrap_or(path)
}

impl Intercept for RequestLog {
    fn name(&self) -> &'static str {
        "RequestLog"
    }

    fn read_before_attempt(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        // An attempt that fails before it is sent has no time of its own.
        cfg.interceptor_state().unset::<Sent>();
        Ok(())
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let request = context.request();
        tracing::debug!(
            op = operation(cfg),
            method = request.method(),
            path = uri_path(request.uri()),
            "s3 request sent"
        );
        cfg.interceptor_state()
            .store_put(Sent(std::time::Instant::now()));
        Ok(())
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let ms = cfg.load::<Sent>().map(|s| s.0.elapsed().as_millis());
        let op = operation(cfg);
        let status = context.response().map(|r| r.status().as_u16());
        match context.output_or_error() {
            // A timeout after the headers (a body that stalled) is a failure, not an answer.
            Some(Err(e)) => {
                let error = aws_smithy_types::error::display::DisplayErrorContext(e).to_string();
                tracing::debug!(op, status, ms, error, "s3 request failed");
            }
            _ => tracing::debug!(op, status, ms, "s3 request answered"),
        }
        Ok(())
    }
}

/// A file's bytes in chunks of [`PART_SIZE`], read in order. An empty file still makes one
/// (empty) part; a longer one never ends with an empty part.
fn file_chunks(file: tokio::fs::File) -> impl futures::Stream<Item = Result<Bytes, StoreError>> {
    futures::stream::try_unfold((Some(file), true), |(file, first)| async move {
        let Some(mut file) = file else {
            return Ok(None);
        };
        let chunk = read_chunk(&mut file, PART_SIZE).await?;
        if chunk.is_empty() && !first {
            return Ok(None);
        }
        let more = (chunk.len() == PART_SIZE).then_some(file);
        Ok(Some((chunk, (more, false))))
    })
}

async fn read_chunk(file: &mut tokio::fs::File, max: usize) -> std::io::Result<Bytes> {
    let mut buf = Vec::with_capacity(max);
    while buf.len() < max {
        let n = (&mut *file)
            .take((max - buf.len()) as u64)
            .read_to_end(&mut buf)
            .await?;
        if n == 0 {
            break;
        }
    }
    Ok(Bytes::from(buf))
}

/// Percent-encodes a `CopySource` (`bucket/key`), keeping `/` (docs/hazards.md #516).
fn copy_source(bucket: &str, key: &str) -> String {
    let mut out = String::with_capacity(bucket.len() + key.len() + 1);
    for b in format!("{bucket}/{key}").bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Maps an SDK error to a [`StoreError`], keeping the semantic cases.
fn classify<E>(
    err: SdkError<E, HttpResponse>,
    op: &'static str,
    bucket: &str,
    limits: Limits,
) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let status = err.raw_response().map(|r| r.status().as_u16());
    let code = err.code().map(str::to_string);
    match (&err, code.as_deref(), status) {
        (_, Some("NoSuchBucket"), _) => StoreError::NoSuchBucket {
            bucket: bucket.to_string(),
        },
        (_, Some("NoSuchKey" | "NotFound"), _) | (_, _, Some(404)) => StoreError::NotFound,
        // An attempt's or the request's limit. The connect limit is a dispatch failure whose
        // cause names it (`HTTP connect timeout occurred after 10s`).
        (SdkError::TimeoutError(_), _, _) => StoreError::Timeout {
            attempt_s: limits.attempt.as_secs(),
            request_s: limits.request.as_secs(),
        },
        _ => {
            let message = match (code.as_deref(), status) {
                (Some(code), Some(status)) => format!("{op}: {code} (HTTP {status})"),
                (None, Some(status)) => format!("{op}: HTTP {status}"),
                (Some(code), None) => format!("{op}: {code}"),
                // The SDK's error is the source: its chain says what failed, once
                // (`Error::chain`).
                (None, None) => op.to_string(),
            };
            StoreError::Backend {
                message,
                source: Some(Box::new(err)),
            }
        }
    }
}

/// A body read of `op` that failed mid-stream.
fn body_failed(op: &'static str, e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::Backend {
        message: format!("{op}: reading the body failed"),
        source: Some(Box::new(e)),
    }
}

/// Classifies a ranged GET's failure: 416 (`InvalidRange`: the range starts at or past the
/// object's end) is [`StoreError::RangePastEnd`], an answer rather than a failure to retry;
/// the rest as any other GET's.
fn classify_range<E>(
    err: SdkError<E, HttpResponse>,
    offset: u64,
    len: u64,
    bucket: &str,
    limits: Limits,
) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let status = err.raw_response().map(|r| r.status().as_u16());
    if status == Some(416) || err.code() == Some("InvalidRange") {
        // `Content-Range: bytes */<size>`, when the server tells the size.
        let size = err
            .raw_response()
            .and_then(|r| r.headers().get("content-range"))
            .and_then(content_range_size);
        return StoreError::RangePastEnd { offset, len, size };
    }
    classify(err, "get object range", bucket, limits)
}

/// The first byte a `Content-Range: bytes <first>-<last>/<size>` header answers with.
fn content_range_first(header: &str) -> Option<u64> {
    let (first, _) = header.trim().strip_prefix("bytes ")?.split_once('-')?;
    first.trim().parse().ok()
}

/// The object's size a `Content-Range` header tells (`bytes <first>-<last>/<size>` or
/// `bytes */<size>`); `None` when it is unknown (`*`) or the header is malformed.
fn content_range_size(header: &str) -> Option<u64> {
    let (_, size) = header.trim().strip_prefix("bytes ")?.rsplit_once('/')?;
    size.trim().parse().ok()
}

/// Refuses a chunk that would take a capped read past `limit` bytes.
fn within(read: u64, chunk: usize, limit: u64) -> Result<(), StoreError> {
    let size = read.saturating_add(chunk as u64);
    if size > limit {
        return Err(StoreError::TooLarge { size, limit });
    }
    Ok(())
}

/// Classifies a conditional write's failure: 412, 409 and (for If-Match) 404 prove the write
/// did not happen.
fn classify_conditional<E>(
    err: SdkError<E, HttpResponse>,
    mode: &PutMode,
    bucket: &str,
    limits: Limits,
) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let code = err.code().map(str::to_string);
    let status = err.raw_response().map(|r| r.status().as_u16());
    match (status, code.as_deref(), mode) {
        (_, Some("NoSuchBucket"), _) => classify(err, "put object", bucket, limits),
        (Some(412), _, _) | (Some(409), _, _) => StoreError::Conflict,
        (_, Some("PreconditionFailed" | "ConditionalRequestConflict"), _) => StoreError::Conflict,
        (Some(404), _, PutMode::Update(_)) => StoreError::Conflict,
        _ => classify(err, "put object", bucket, limits),
    }
}

#[async_trait]
impl ObjectStore for S3Store {
    fn describe(&self) -> String {
        format!("s3://{}", self.bucket)
    }

    async fn put_file(&self, key: &str, path: &Path) -> Result<PutResult, StoreError> {
        let len = tokio::fs::metadata(path).await?.len();
        if len >= MULTIPART_THRESHOLD {
            return self.put_multipart(key, path).await;
        }
        let body = Bytes::from(tokio::fs::read(path).await?);
        self.put_bytes(key, body, PutMode::Overwrite).await
    }

    async fn put_parts(&self, key: &str, mut parts: Parts) -> Result<PutResult, StoreError> {
        // An object of one part goes up in one PUT, a larger one as a multipart upload.
        let Some(first) = stream::next(&mut parts).await? else {
            return self.put_bytes(key, Bytes::new(), PutMode::Overwrite).await;
        };
        let Some(second) = stream::next(&mut parts).await? else {
            return self.put_bytes(key, first, PutMode::Overwrite).await;
        };
        let upload_id = self.create_multipart(key, true).await?;
        let rest = futures::stream::try_unfold(&mut parts, |parts| async move {
            Ok(stream::next(parts).await?.map(|chunk| (chunk, parts)))
        });
        let chunks = futures::stream::iter([Ok(first), Ok(second)]).chain(rest);
        let done = self
            .upload_chunks(key, &upload_id, chunks, STREAM_CONCURRENCY)
            .await;
        self.abort_failed(key, &upload_id, done).await
    }

    async fn put_bytes(
        &self,
        key: &str,
        body: Bytes,
        mode: PutMode,
    ) -> Result<PutResult, StoreError> {
        let sha256 = super::sha256(&body);
        let size = body.len() as u64;
        // A small body (a manifest, a marker, a small delta) is sent in well under the answer
        // limit: a save that then gets no answer is given up on as soon as a HEAD would be.
        let lane = if size <= QUICK_PUT_BYTES {
            &self.quick
        } else {
            &self.bulk
        };
        let mut req = lane
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .body(ByteStream::from(body));
        let conditional = match &mode {
            PutMode::Overwrite => false,
            PutMode::Create => {
                req = req.if_none_match("*");
                true
            }
            PutMode::Update(etag) => {
                req = req.if_match(etag);
                true
            }
        };
        let mut req = req
            .customize()
            .interceptor(SignedPayload(hex::encode(sha256)));
        // A retried conditional write could fail against its own first attempt's save and
        // read as a lost race (docs/hazards.md L29): conditional writes go out once.
        if conditional {
            req = req.config_override(
                aws_sdk_s3::config::Builder::default().retry_config(RetryConfig::disabled()),
            );
        }
        let sent = req.send().await;
        let out = sent.map_err(|e| classify_conditional(e, &mode, &self.bucket, lane.limits))?;
        Ok(PutResult {
            size,
            sha256,
            etag: out.e_tag().unwrap_or_default().to_string(),
        })
    }

    async fn get_bytes_within(&self, key: &str, limit: u64) -> Result<GetResult, StoreError> {
        let mut out = self.get_object(key, limit).await?;
        let etag = out.e_tag().unwrap_or_default().to_string();
        let mut bytes = Vec::with_capacity(
            usize::try_from(out.content_length().unwrap_or(0).max(0)).unwrap_or(0),
        );
        while let Some(chunk) = out.body.next().await {
            let chunk = chunk.map_err(|e| body_failed("get object", e))?;
            within(bytes.len() as u64, chunk.len(), limit)?;
            bytes.extend_from_slice(&chunk);
        }
        Ok(GetResult {
            bytes: Bytes::from(bytes),
            etag,
        })
    }

    async fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Bytes, StoreError> {
        const OP: &str = "get object range";
        if len == 0 {
            return Ok(Bytes::new());
        }
        // len > 0, so the range's last byte is one before its end.
        let last = range_end(offset, len)? - 1;
        let mut out = self
            .quick
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .range(format!("bytes={offset}-{last}"))
            .send()
            .await
            .map_err(|e| classify_range(e, offset, len, &self.bucket, self.quick.limits))?;
        let past_end = |size| StoreError::RangePastEnd { offset, len, size };
        let misread = |what: String| StoreError::Backend {
            message: format!("{OP}: asked for {len} bytes at offset {offset}, {what}"),
            source: None,
        };
        let content_range = out.content_range().map(str::to_string);
        let size = content_range.as_deref().and_then(content_range_size);
        // A server that ignores the Range header answers with the whole object (no
        // Content-Range): right only when the range starts at the object's first byte.
        let first = match content_range.as_deref() {
            Some(header) => content_range_first(header),
            None => Some(0),
        };
        if first != Some(offset) {
            let got = content_range.as_deref().unwrap_or("the whole object");
            return Err(misread(format!("the server answered with {got}")));
        }
        // A range that runs past the object's end comes back short (HTTP 206).
        let announced = out.content_length().and_then(|n| u64::try_from(n).ok());
        match announced {
            Some(n) if n < len => return Err(past_end(size)),
            Some(n) if n > len => return Err(misread(format!("the server announced {n}"))),
            _ => {}
        }
        let mut bytes = Vec::with_capacity(usize::try_from(announced.unwrap_or(0)).unwrap_or(0));
        while let Some(chunk) = out.body.next().await {
            let chunk = chunk.map_err(|e| body_failed(OP, e))?;
            let got = (bytes.len() as u64).saturating_add(chunk.len() as u64);
            if got > len {
                return Err(misread(format!("the server sent at least {got}")));
            }
            bytes.extend_from_slice(&chunk);
        }
        if bytes.len() as u64 != len {
            return Err(past_end(size));
        }
        Ok(Bytes::from(bytes))
    }

    async fn get_to_file_within(
        &self,
        key: &str,
        path: &Path,
        limit: u64,
    ) -> Result<Download, StoreError> {
        let mut out = self.get_object(key, limit).await?;
        let mut file = tokio::fs::File::from_std(crate::scratch::create_file(path)?);
        // Each of tokio's writes hands the kernel what it has buffered (`scratch::WRITE_PIECE`).
        file.set_max_buf_size(crate::scratch::WRITE_PIECE);
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        while let Some(chunk) = out.body.next().await {
            let chunk = chunk.map_err(|e| body_failed("get object", e))?;
            within(size, chunk.len(), limit)?;
            hasher.update(&chunk);
            size += chunk.len() as u64;
            file.write_all(&chunk).await?;
        }
        file.sync_all().await?;
        Ok(Download {
            size,
            sha256: hasher.finalize().into(),
        })
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        let out = self
            .quick
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| classify(e, "head object", &self.bucket, self.quick.limits))?;
        Ok(ObjectMeta {
            key: key.to_string(),
            size: u64::try_from(out.content_length().unwrap_or(0)).unwrap_or(0),
            etag: out.e_tag().unwrap_or_default().to_string(),
            last_modified_ms: out
                .last_modified()
                .and_then(|t| t.to_millis().ok())
                .unwrap_or(0),
        })
    }

    async fn copy(&self, from: &str, to: &str) -> Result<(), StoreError> {
        let sent = self
            .bulk
            .client
            .copy_object()
            .bucket(&self.bucket)
            .key(to)
            .copy_source(copy_source(&self.bucket, from))
            .send()
            .await;
        match sent {
            Ok(_) => Ok(()),
            // AWS refuses CopyObject for a source over 5 GiB (InvalidRequest): a large merged
            // base is copied part by part instead.
            Err(e) if e.code() == Some("InvalidRequest") => {
                let size = self.head(from).await?.size;
                if size > MAX_COPY_OBJECT_BYTES {
                    self.copy_in_parts(from, to, size, COPY_PART_SIZE).await
                } else {
                    Err(classify(e, "copy object", &self.bucket, self.bulk.limits))
                }
            }
            Err(e) => Err(classify(e, "copy object", &self.bucket, self.bulk.limits)),
        }
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        match self
            .quick
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => match classify(e, "delete object", &self.bucket, self.quick.limits) {
                StoreError::NotFound => Ok(()),
                other => Err(other),
            },
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StoreError> {
        let mut pages = self
            .quick
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(prefix)
            .into_paginator()
            .send();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page =
                page.map_err(|e| classify(e, "list objects", &self.bucket, self.quick.limits))?;
            for obj in page.contents() {
                out.push(ObjectMeta {
                    key: obj.key().unwrap_or_default().to_string(),
                    size: u64::try_from(obj.size().unwrap_or(0)).unwrap_or(0),
                    etag: obj.e_tag().unwrap_or_default().to_string(),
                    last_modified_ms: obj
                        .last_modified()
                        .and_then(|t| t.to_millis().ok())
                        .unwrap_or(0),
                });
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    async fn abandoned_writes(&self, prefix: &str) -> Result<Vec<AbandonedWrite>, StoreError> {
        let op = "list multipart uploads";
        let mut out = Vec::new();
        let (mut key_marker, mut id_marker) = (None::<String>, None::<String>);
        loop {
            let page = self
                .quick
                .client
                .list_multipart_uploads()
                .bucket(&self.bucket)
                .prefix(prefix)
                .set_key_marker(key_marker.clone())
                .set_upload_id_marker(id_marker.clone())
                .send()
                .await
                .map_err(|e| classify(e, op, &self.bucket, self.quick.limits))?;
            for u in page.uploads() {
                // An upload whose start the server does not say is never judged old.
                let (Some(key), Some(id), Some(started_ms)) = (
                    u.key(),
                    u.upload_id(),
                    u.initiated().and_then(|t| t.to_millis().ok()),
                ) else {
                    continue;
                };
                out.push(AbandonedWrite {
                    key: key.to_string(),
                    started_ms,
                    bytes: None,
                    handle: id.to_string(),
                });
            }
            let next = (
                page.next_key_marker().map(str::to_string),
                page.next_upload_id_marker().map(str::to_string),
            );
            if page.is_truncated() != Some(true) {
                return Ok(out);
            }
            if next.0.is_none() || next == (key_marker, id_marker) {
                // A truncated page that does not move on: what was listed is what is known.
                tracing::warn!(
                    prefix,
                    "the listing of multipart uploads does not advance; the rest is left for the next run"
                );
                return Ok(out);
            }
            (key_marker, id_marker) = next;
        }
    }

    async fn remove_abandoned(&self, write: &AbandonedWrite) -> Result<(), StoreError> {
        let aborted = self
            .quick
            .client
            .abort_multipart_upload()
            .bucket(&self.bucket)
            .key(&write.key)
            .upload_id(&write.handle)
            .send()
            .await;
        match aborted {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("NoSuchUpload") => Ok(()),
            Err(e) => {
                match classify(e, "abort multipart upload", &self.bucket, self.quick.limits) {
                    StoreError::NotFound => Ok(()),
                    other => Err(other),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upload_counts_and_hashes_its_parts_and_refuses_one_past_the_limit() {
        let mut sent = Uploaded::default();
        assert_eq!((sent.add(b"ab").unwrap(), sent.add(b"c").unwrap()), (1, 2));
        assert_eq!(sent.size, 3);
        let hash: [u8; 32] = std::mem::take(&mut sent.hasher).finalize().into();
        assert_eq!(hash, super::super::sha256(b"abc"));
        sent.parts = i32::try_from(MAX_PARTS).unwrap() - 1;
        assert_eq!(sent.add(b"d").unwrap(), 10_000);
        let e = sent.add(b"e").unwrap_err().to_string();
        assert!(e.contains("passed 10000 parts"), "{e}");
        assert_eq!((sent.parts, sent.size), (10_000, 4));
    }

    #[tokio::test]
    async fn a_file_is_read_in_whole_parts_with_no_empty_part_after_a_full_one() {
        let dir = tempfile::tempdir().unwrap();
        let chunks = |len: usize| {
            let path = dir.path().join(format!("f{len}"));
            let body: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            std::fs::write(&path, &body).unwrap();
            async move {
                let file = tokio::fs::File::open(&path).await.unwrap();
                let got: Vec<Bytes> = file_chunks(file).try_collect().await.unwrap();
                assert_eq!(got.concat(), body, "a file of {len} bytes");
                got.iter().map(Bytes::len).collect::<Vec<_>>()
            }
        };
        assert_eq!(chunks(0).await, [0]);
        assert_eq!(chunks(5).await, [5]);
        assert_eq!(chunks(PART_SIZE).await, [PART_SIZE]);
        assert_eq!(chunks(2 * PART_SIZE).await, [PART_SIZE, PART_SIZE]);
        assert_eq!(chunks(PART_SIZE + 1).await, [PART_SIZE, 1]);
    }

    #[test]
    fn copy_source_is_percent_encoded_verbatim() {
        assert_eq!(
            copy_source("b", "data/7/_tmp/a.parquet"),
            "b/data/7/_tmp/a.parquet"
        );
        assert_eq!(
            copy_source("b", "/7/a b+c.parquet"),
            "b//7/a%20b%2Bc.parquet"
        );
    }

    #[test]
    fn the_request_log_shows_a_uri_path_only() {
        assert_eq!(
            uri_path(
                "https://user:pw@s3.example.com:9000/lake/data/7/a.parquet?uploadId=x&partNumber=2"
            ),
            "/lake/data/7/a.parquet"
        );
        assert_eq!(uri_path("http://bucket.s3.amazonaws.com/m.json"), "/m.json");
        assert_eq!(uri_path("http://127.0.0.1:8333"), "/");
        assert_eq!(uri_path("http://h/b?list-type=2&prefix=data%2F"), "/b");
        assert_eq!(uri_path("/b/k#frag"), "/b/k");
    }

    #[test]
    fn content_range_headers_are_parsed() {
        assert_eq!(content_range_first("bytes 100-199/1000"), Some(100));
        assert_eq!(content_range_size("bytes 100-199/1000"), Some(1000));
        assert_eq!(content_range_size("bytes */1000"), Some(1000));
        assert_eq!(content_range_first("bytes */1000"), None);
        assert_eq!(content_range_size("bytes 0-9/*"), None);
        assert_eq!(content_range_first("items 0-9/10"), None);
        assert_eq!(content_range_size(""), None);
    }

    #[test]
    fn half_set_credentials_are_refused() {
        assert!(check_env_credentials(Some("AKIA"), None).is_err());
        assert!(check_env_credentials(Some("AKIA"), Some("")).is_err());
        assert!(check_env_credentials(None, Some("secret")).is_err());
        assert!(check_env_credentials(Some("AKIA"), Some("secret")).is_ok());
        assert!(check_env_credentials(None, None).is_ok());
        let msg = check_env_credentials(Some("AKIA"), None).unwrap_err();
        assert!(msg.contains("AWS_SECRET_ACCESS_KEY"), "{msg}");
    }
}
