//! The doctor's lake checks (docs/operations.md, `doctor`): the store answers, one object
//! round-trips under `<lake root>/_doctor/`, stale conditional writes are refused, and every
//! selected schema's data prefix and manifest belong to this lake and this database — the
//! writers' own checks ([`owner::check`], [`owner::check_source`]), run without writing.

use super::check::{Check, Kind};
use super::skew::Sample;
use crate::clock::Clock;
use crate::error::Error;
use crate::lake::{Lake, SourceGuard, owner};
use crate::source::registry::Registered;
use crate::store::StoreError;
use crate::store::probe::{self, Conditional, Verdict};

/// What the store checks found.
pub(super) struct StoreFindings {
    /// Checks 5 to 7, in order.
    pub checks: Vec<Check>,
    /// The store's date of the probe object against this host's clock.
    pub clock: Result<Sample, String>,
    /// Whether the lake answered (the ownership check reads it).
    pub reachable: bool,
}

/// Runs the store probe on the opened lake, or reports why it could not be opened.
pub(super) async fn store(lake: &Result<Lake, Error>, clock: &dyn Clock) -> StoreFindings {
    let unreachable = |detail: String, fix: String| {
        let why = "the lake is unreachable (see above)";
        StoreFindings {
            checks: vec![
                Check::fail(Kind::LakeReachable, detail, fix),
                Check::skip(Kind::RoundTrip, why),
                Check::skip(Kind::ConditionalWrites, why),
            ],
            clock: Err(why.to_string()),
            reachable: false,
        }
    };
    let lake = match lake {
        Ok(l) => l,
        Err(e) => {
            let fix = match e {
                Error::Storage { source, .. } => fix_for(source),
                _ => "fix --lake".to_string(),
            };
            return unreachable(e.chain(), fix);
        }
    };
    let store = lake.store.as_ref();
    let prefix = lake.layout.doctor_prefix();
    let key = format!("{prefix}{}", uuid::Uuid::new_v4());
    let now = || clock.now_ms();
    let report = probe::probe(store, prefix, &key, &now).await;
    if let Err(e) = &report.reachable {
        return unreachable(
            format!("{}: listing {prefix:?}: {e}", store.describe()),
            fix_for(e),
        );
    }
    let not_reached = "the round trip failed (see above)";
    let mut round_trip = match &report.round_trip {
        Some(Ok(())) => Check::ok(
            Kind::RoundTrip,
            format!("put, read back, deleted {}", store.uri(&key)),
        ),
        Some(Err(why)) => Check::fail(
            Kind::RoundTrip,
            format!("{}: {why}", store.uri(&key)),
            "give the credentials (or, for a local lake, the user) list, read, write and delete rights on the lake: s3:ListBucket, s3:GetObject, s3:PutObject, s3:DeleteObject",
        ),
        None => Check::skip(Kind::RoundTrip, not_reached),
    };
    if let Err(e) = &report.cleanup {
        round_trip = Check::fail(
            Kind::RoundTrip,
            format!(
                "{}; the probe object {} could not be deleted: {e}",
                round_trip.detail,
                store.uri(&key)
            ),
            format!(
                "delete {} by hand, and see the store's delete rights",
                store.uri(&key)
            ),
        );
    }
    // gc undoes the uploads killed runs left unfinished (docs/operations.md): it needs to
    // list them, which the round trip's rights do not cover.
    if round_trip.status == super::check::Status::Ok
        && let Err(e) = store.abandoned_writes(prefix).await
    {
        round_trip = Check::warn(
            Kind::RoundTrip,
            format!(
                "{}; unfinished uploads under {prefix:?} cannot be listed: {e}",
                round_trip.detail
            ),
            "grant s3:ListBucketMultipartUploads and s3:AbortMultipartUpload on the lake, so that gc aborts the uploads killed runs leave; or add a bucket lifecycle rule aborting incomplete multipart uploads after a day",
        );
    }
    let conditional = match &report.conditional {
        Some(c) => conditional_check(c),
        None => Check::skip(Kind::ConditionalWrites, not_reached),
    };
    StoreFindings {
        checks: vec![
            Check::ok(
                Kind::LakeReachable,
                format!("{} answers a listing of {prefix:?}", store.describe()),
            ),
            round_trip,
            conditional,
        ],
        clock: report
            .written
            .map(|w| Sample {
                before_ms: w.before_ms,
                after_ms: w.after_ms,
                remote_ms: w.last_modified_ms,
                // HTTP dates drop the milliseconds.
                resolution_ms: 1_000,
            })
            .ok_or_else(|| not_reached.to_string()),
        reachable: true,
    }
}

/// How to mend a store that cannot be listed.
fn fix_for(e: &StoreError) -> String {
    match e {
        StoreError::NoSuchBucket { bucket } => {
            format!("create bucket {bucket:?}, or fix --lake")
        }
        StoreError::NoSuchDirectory { path } => {
            format!("create the directory (mkdir -p {path}), or fix --lake")
        }
        StoreError::NotADirectory { .. } => "fix --lake".to_string(),
        _ => "check --lake, --s3-endpoint, --s3-region, the AWS credentials, and that this host reaches the store".to_string(),
    }
}

fn conditional_check(c: &Conditional) -> Check {
    if c.honoured() {
        return Check::ok(
            Kind::ConditionalWrites,
            "If-Match with the current etag lands; create-if-absent over an existing object and If-Match with a stale etag are refused",
        );
    }
    let mut problems = Vec::new();
    let mut ignored = false;
    for (what, got, want) in [
        (
            "create-if-absent (If-None-Match) over an existing object",
            &c.create_existing,
            Verdict::Refused,
        ),
        (
            "If-Match with a stale etag",
            &c.stale_etag,
            Verdict::Refused,
        ),
        (
            "If-Match with the current etag",
            &c.current_etag,
            Verdict::Accepted,
        ),
    ] {
        match got {
            g if *g == want => {}
            Verdict::Accepted => {
                ignored = true;
                problems.push(format!("{what} was accepted"));
            }
            Verdict::Refused => problems.push(format!("{what} was refused")),
            Verdict::Failed(e) => problems.push(format!("{what} failed: {e}")),
        }
    }
    let fix = if ignored {
        "this store ignores conditional writes, and manifest commits, compaction and concurrent flushes rely on them: use a store that honours If-None-Match and If-Match (AWS S3, SeaweedFS, a recent MinIO, a local directory)"
    } else {
        "check that the store (and any proxy before it) passes If-None-Match and If-Match through"
    };
    Check::fail(Kind::ConditionalWrites, problems.join("; "), fix)
}

/// Why schema `id`'s claimed data prefix looks orphaned: it holds base files while its
/// manifest does not exist (docs/hazards.md L100). `None` when it has a manifest, or no base
/// file, or the store cannot say.
async fn bases_without_manifest(lake: &Lake, id: i16) -> Option<String> {
    let (store, layout) = (lake.store.as_ref(), &lake.layout);
    let key = layout.manifest_key(id);
    if !matches!(store.head(&key).await, Err(StoreError::NotFound)) {
        return None;
    }
    let prefix = layout.schema_prefix(id);
    let bases = store
        .list(&prefix)
        .await
        .ok()?
        .iter()
        .filter(|o| layout.classify(&o.key).is_base())
        .count();
    (bases > 0)
        .then(|| format!("{prefix} holds {bases} base files but manifest {key} does not exist"))
}

/// Every selected schema's data prefix is claimed by its manifest (or by none yet), and its
/// manifest names this database (or none yet). With `adopt` (`--adopt-source`), a manifest of
/// another database is a warning: the writers will take it over.
pub(super) async fn ownership(
    lake: &Result<Lake, Error>,
    reachable: bool,
    schemas: &Result<Vec<Registered>, String>,
    guard: &Result<SourceGuard, String>,
    adopt: bool,
) -> Check {
    let (lake, schemas, guard) = match (lake, reachable, schemas, guard) {
        (Ok(l), true, Ok(s), Ok(g)) => (l, s, g),
        (_, false, ..) | (Err(_), ..) => {
            return Check::skip(Kind::Ownership, "the lake is unreachable (see above)");
        }
        (_, _, Err(why), _) | (_, _, _, Err(why)) => {
            return Check::skip(Kind::Ownership, why.clone());
        }
    };
    let (store, layout) = (lake.store.as_ref(), &lake.layout);
    let (mut failed, mut foreign, mut unclaimed) = (Vec::new(), Vec::new(), 0);
    let mut orphaned = Vec::new();
    for reg in schemas {
        let at = |what: String| format!("schema {:?} (id {}): {what}", reg.name, reg.id);
        match owner::check(store, layout, reg.id).await {
            Ok(owner::Ownership::Ours) => {
                if let Some(why) = bases_without_manifest(lake, reg.id).await {
                    orphaned.push(at(why));
                }
            }
            Ok(owner::Ownership::Unclaimed) => unclaimed += 1,
            Ok(owner::Ownership::Other(why)) => failed.push(at(why)),
            Err(e) => failed.push(at(e.chain())),
        }
        match owner::check_source(store, layout, reg.id, guard).await {
            Ok(_) => {}
            Err(e @ Error::ForeignSource { .. }) => foreign.push(at(e.chain())),
            Err(e) => failed.push(at(e.chain())),
        }
    }
    let adopt_fix = "if this database replaced the lake's source (a restore, a migration), run the writers once with --adopt-source, then verify --source --repair; otherwise point --pg-url at the lake's database, or --lake at this database's lake";
    if !failed.is_empty() || (!foreign.is_empty() && !adopt) {
        let fix = if foreign.is_empty() || adopt {
            "check --lake, --data-prefix and --manifest-template against the writers'".to_string()
        } else if failed.is_empty() {
            adopt_fix.to_string()
        } else {
            format!("check --lake, --data-prefix and --manifest-template; {adopt_fix}")
        };
        let mut problems = failed;
        if !adopt {
            problems.append(&mut foreign);
        }
        return Check::fail(Kind::Ownership, problems.join("; "), fix);
    }
    if !foreign.is_empty() {
        return Check::warn(
            Kind::Ownership,
            format!(
                "--adopt-source is set: the writers will take these over for {}: {}",
                guard.identity.describe(),
                foreign.join("; ")
            ),
            "run verify --source --repair after the first adopting write; unset --adopt-source once done",
        );
    }
    if !orphaned.is_empty() {
        return Check::warn(
            Kind::Ownership,
            orphaned.join("; "),
            "if no init was just killed before its first save, the manifest was lost: restore it from object versioning or its newest history copy (<manifest key>.history/), or rebuild with lakecdc init --replace-delta; gc refuses the schema until then",
        );
    }
    Check::ok(
        Kind::Ownership,
        format!(
            "{} schemas: data prefixes claimed by their manifest ({unclaimed} not claimed yet), manifests written from {} or new",
            schemas.len(),
            guard.identity.describe()
        ),
    )
}
