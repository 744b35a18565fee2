//! Manifest history, for time travel (docs/design.md §3.5): after every successful save the
//! saved bytes are copied to `<manifest key>.history/<version:020>.json`, and a reader picks
//! the newest copy at or before a version or a time ([`load_as_of`]). A copy is written only
//! after the conditional save succeeded, so it never names a version that was not saved; a
//! failed copy is logged and counted ([`copy_failures`]), never a failure of the job.
//!
//! gc keeps the copy in force at the start of the retention window and every later one, and
//! deletes the older ones (never the newest); it keeps each retired file until its retirement
//! is older than the retention, which keeps every file a kept copy lists
//! ([`crate::gc`], docs/design.md §4.4). Copies are judged by their own `updated_at_ms`, the
//! time a `--as-of TIME` is compared with. Keys under the history prefix are parsed strictly
//! ([`Layout::parse_history_key`]); anything else there is never read nor deleted.

use std::fmt;

use serde::Serialize;

use super::keys::Layout;
use super::manifest::{self, Manifest};
use super::{Capped, read_capped};
use crate::error::{Error, Result};
use crate::store::ObjectStore;

/// How long history copies are kept when `--history-retention` is not set: 24 hours.
pub use super::keys::DEFAULT_HISTORY_RETENTION as DEFAULT_RETENTION;

/// How many history copies this process failed to write (each was logged as a warning; the
/// saves themselves stood). Counted where the copies are written, by the save
/// ([`manifest::commit_within`]).
pub use super::manifest::history_copy_failures as copy_failures;

/// Which version to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsOf {
    /// The manifest as saved at this version.
    Version(i64),
    /// The manifest in force at this time: the newest version saved at or before it.
    Time {
        /// Milliseconds since the Unix epoch.
        epoch_ms: i64,
    },
}

impl fmt::Display for AsOf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AsOf::Version(v) => write!(f, "version {v}"),
            AsOf::Time { epoch_ms } => f.write_str(&format_ms(*epoch_ms)),
        }
    }
}

impl AsOf {
    /// Parses `--as-of`: `42` is a version; an RFC3339 time (`2026-12-01T10:00:00Z`, an offset
    /// like `+02:00`, fractional seconds) or a time ago (`-90s`, `-30m`, `-1h`, `-2d`, also
    /// combined like `-1h30m`, counted back from `now_ms`) is a time. Anything else is one
    /// setting error naming `--as-of` and the accepted forms.
    pub fn parse(text: &str, now_ms: i64) -> Result<AsOf> {
        let t = text.trim();
        let bad = |why: &str| {
            Error::setting(
                "as-of",
                format!(
                    "{text:?} {why}: give a version (42), an RFC3339 time (2026-12-01T10:00:00Z, 2026-12-01T12:00:00.5+02:00) or a time ago (-90s, -30m, -1h, -2d)"
                ),
            )
        };
        if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
            return match t.parse::<i64>() {
                Ok(v) if v >= 1 => Ok(AsOf::Version(v)),
                Ok(_) => Err(bad("is not a version (versions start at 1)")),
                Err(_) => Err(bad("is too large for a version")),
            };
        }
        if let Some(ago) = t.strip_prefix('-') {
            // A unit is required: "-90" is neither a version nor a time.
            if !ago.ends_with(|c: char| c.is_ascii_alphabetic()) {
                return Err(bad("is not a time ago (a unit is required)"));
            }
            let back = crate::config::parse_duration("as-of", ago)
                .map_err(|_| bad("is not a time ago"))?;
            let back = i64::try_from(back.as_millis()).map_err(|_| bad("is too far back"))?;
            let epoch_ms = now_ms
                .checked_sub(back)
                .ok_or_else(|| bad("is too far back"))?;
            return Ok(AsOf::Time { epoch_ms });
        }
        match parse_rfc3339(t) {
            Some(epoch_ms) => Ok(AsOf::Time { epoch_ms }),
            None => Err(bad("is not a version, an RFC3339 time or a time ago")),
        }
    }
}

/// `<manifest key>.history/`: where the schema's history copies live.
pub fn prefix(layout: &Layout, schema_id: i16) -> String {
    layout.history_prefix(schema_id)
}

/// `<manifest key>.history/<version:020>.json`: the copy of the schema's manifest as saved at
/// `version`.
pub fn key(layout: &Layout, schema_id: i16, version: i64) -> String {
    layout.history_key(schema_id, version)
}

/// One kept history copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HistoryPoint {
    /// Its manifest version.
    pub version: i64,
    /// When that version was saved (its `updated_at_ms`, epoch ms).
    pub updated_at_ms: i64,
}

/// The history a schema keeps: its oldest and newest copies and how many there are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HistoryRange {
    /// The oldest kept copy.
    pub oldest: HistoryPoint,
    /// The newest kept copy.
    pub newest: HistoryPoint,
    /// Copies kept.
    pub count: usize,
}

/// The versions of the schema's kept history copies, ascending. Only keys of the strict shape
/// count; anything else under the prefix is ignored.
pub(crate) async fn versions(
    store: &dyn ObjectStore,
    layout: &Layout,
    schema_id: i16,
) -> Result<Vec<i64>> {
    let prefix = layout.history_prefix(schema_id);
    let objects = store
        .list(&prefix)
        .await
        .map_err(Error::storage("list manifest history", prefix))?;
    let mut versions: Vec<i64> = objects
        .iter()
        .filter_map(|o| layout.parse_history_key(schema_id, &o.key))
        .collect();
    versions.sort_unstable();
    versions.dedup();
    Ok(versions)
}

/// Loads the history copy of `version`, checked like a manifest (within the layout's
/// manifest size limit, a path listed once, no negative numbers) and more strictly: it must be
/// stamped with `schema_id` and hold the version its key names. `Ok(None)` when the store says
/// it does not exist.
pub(crate) async fn load_copy(
    store: &dyn ObjectStore,
    layout: &Layout,
    schema_id: i16,
    version: i64,
) -> Result<Option<Manifest>> {
    let key = layout.history_key(schema_id, version);
    let cap = Capped {
        op: "load manifest history copy",
        what: "manifest history copy",
        limit: layout.limits().manifest_bytes,
        why: "a manifest this large is corrupt or hostile; if it is genuine, raise --max-manifest-size",
    };
    let Some(got) = read_capped(store, &key, cap).await? else {
        return Ok(None);
    };
    let m = Manifest::from_json(&key, &got.bytes)?;
    let refuse = |message: String| Error::Manifest {
        key: key.clone(),
        message,
    };
    if m.schema_id != schema_id {
        return Err(refuse(format!(
            "history copy is stamped for schema {}, not {schema_id}; remove it",
            m.schema_id
        )));
    }
    if m.version != version {
        return Err(refuse(format!(
            "history copy holds version {}, not the {version} its key names; remove it",
            m.version
        )));
    }
    m.check_entries(&key)?;
    Ok(Some(m))
}

/// The newest manifest of `schema_id` at or before `as_of`: the live manifest when it is (it
/// counts as the newest copy), else a history copy, loaded and checked like a manifest
/// ([`load_copy`]). A time is looked up by bisecting the kept versions (their `updated_at_ms`
/// increase with them), loading O(log n) copies. Errors, each one line: the schema has no
/// manifest; `as_of` is newer than the live version; it is before the oldest kept copy (past the
/// history retention, naming the oldest version kept and its time); its copy is missing.
pub async fn load_as_of(
    store: &dyn ObjectStore,
    layout: &Layout,
    schema_id: i16,
    as_of: &AsOf,
) -> Result<Manifest> {
    let live_key = layout.manifest_key(schema_id);
    let refuse = |message: String| Error::AsOf {
        as_of: as_of.to_string(),
        schema_id,
        message,
    };
    let Some(live) = manifest::load_within(store, &live_key, schema_id, layout.limits()).await?
    else {
        return Err(refuse(format!(
            "finds no manifest at {live_key}: the schema was never exported, so no version exists"
        )));
    };
    let live = live.manifest;
    let kept: Vec<i64> = versions(store, layout, schema_id)
        .await?
        .into_iter()
        .filter(|v| *v < live.version)
        .collect();
    match *as_of {
        AsOf::Version(v) if v == live.version => Ok(live),
        AsOf::Version(v) if v > live.version => Err(refuse(format!(
            "is newer than the live manifest {live_key}, at version {}",
            live.version
        ))),
        AsOf::Version(v) => {
            if let Some(m) = load_copy(store, layout, schema_id, v).await? {
                return Ok(m);
            }
            match kept.first() {
                Some(oldest) if v > *oldest => Err(refuse(format!(
                    "has no history copy at {}: its copy failed when it was saved (see that job's warnings); the other versions from {oldest} to {} are kept",
                    layout.history_key(schema_id, v),
                    live.version
                ))),
                _ => Err(past_retention(store, layout, schema_id, &kept, &live, &refuse).await?),
            }
        }
        AsOf::Time { epoch_ms } => {
            if live.updated_at_ms <= epoch_ms {
                return Ok(live);
            }
            // The first index whose copy was saved after `epoch_ms` (bisection).
            let (mut lo, mut hi) = (0, kept.len());
            let mut found: Option<Manifest> = None;
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                let m = load_kept(store, layout, schema_id, kept[mid]).await?;
                if m.updated_at_ms <= epoch_ms {
                    found = Some(m);
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            let Some(m) = found else {
                return Err(past_retention(store, layout, schema_id, &kept, &live, &refuse).await?);
            };
            // The version in force at `epoch_ms` is `m`'s only if the next saved version is
            // the next one kept: a missing copy between them may have been in force.
            let next = kept.get(lo).copied().unwrap_or(live.version);
            if next != m.version.saturating_add(1) {
                return Err(refuse(format!(
                    "falls between versions {} and {next}, and the history copies between them are missing: their copies failed when they were saved (see those jobs' warnings)",
                    m.version
                )));
            }
            Ok(m)
        }
    }
}

/// A kept copy that must exist (it was just listed).
async fn load_kept(
    store: &dyn ObjectStore,
    layout: &Layout,
    schema_id: i16,
    version: i64,
) -> Result<Manifest> {
    load_copy(store, layout, schema_id, version)
        .await?
        .ok_or_else(|| Error::Manifest {
            key: layout.history_key(schema_id, version),
            message: "history copy disappeared while it was read (gc removed it past the history retention); retry".into(),
        })
}

/// The refusal of an `as_of` before the oldest kept copy (`kept`, or the live manifest when no
/// copy is kept), naming that version and its time.
async fn past_retention(
    store: &dyn ObjectStore,
    layout: &Layout,
    schema_id: i16,
    kept: &[i64],
    live: &Manifest,
    refuse: &dyn Fn(String) -> Error,
) -> Result<Error> {
    let oldest = match kept.first() {
        Some(v) => load_kept(store, layout, schema_id, *v).await?,
        None => live.clone(),
    };
    let saved = format_ms(oldest.updated_at_ms);
    Ok(if oldest.version <= 1 {
        refuse(format!(
            "is before the schema's first version, saved at {saved}"
        ))
    } else {
        refuse(format!(
            "is past the history retention: the oldest version kept is {}, saved at {saved}; gc keeps history for its --history-retention",
            oldest.version
        ))
    })
}

/// The schema's kept history copies, for inspect: the oldest and newest (their versions and
/// save times) and how many; `None` when no copy is kept.
pub async fn range(
    store: &dyn ObjectStore,
    layout: &Layout,
    schema_id: i16,
) -> Result<Option<HistoryRange>> {
    let kept = versions(store, layout, schema_id).await?;
    let (Some(first), Some(last)) = (kept.first(), kept.last()) else {
        return Ok(None);
    };
    let point = |m: Manifest| HistoryPoint {
        version: m.version,
        updated_at_ms: m.updated_at_ms,
    };
    let oldest = point(load_kept(store, layout, schema_id, *first).await?);
    let newest = point(load_kept(store, layout, schema_id, *last).await?);
    Ok(Some(HistoryRange {
        oldest,
        newest,
        count: kept.len(),
    }))
}

/// What gc does to a schema's history ([`prune_plan`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Prune {
    /// Copies superseded before the retention window: deleted.
    pub(crate) due: Vec<String>,
    /// Copies kept.
    pub(crate) kept: usize,
}

/// Which history copies gc deletes at `now_ms`: with a retention, every copy older than the
/// one in force at the window's start (`now - retention`), found by bisection over the copies'
/// `updated_at_ms`; so a `--as-of` anywhere within the window still finds its version, and the
/// newest copy is never deleted. With no retention (zero) every copy is deleted.
pub(crate) async fn prune_plan(
    store: &dyn ObjectStore,
    layout: &Layout,
    schema_id: i16,
    now_ms: i64,
) -> Result<Prune> {
    let kept = versions(store, layout, schema_id).await?;
    let retention = layout.history_retention();
    let keys = |vs: &[i64]| -> Vec<String> {
        vs.iter()
            .map(|v| layout.history_key(schema_id, *v))
            .collect()
    };
    if retention.is_zero() {
        return Ok(Prune {
            due: keys(&kept),
            kept: 0,
        });
    }
    let window = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let start = now_ms.saturating_sub(window);
    // The first index saved after the window's start; the one before it was in force then.
    let (mut lo, mut hi) = (0, kept.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let m = load_kept(store, layout, schema_id, kept[mid]).await?;
        if m.updated_at_ms <= start {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let in_force = lo.saturating_sub(1);
    Ok(Prune {
        due: keys(&kept[..in_force]),
        kept: kept.len() - in_force,
    })
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01 (the inverse of [`days_from_civil`]).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Epoch milliseconds as RFC3339 in UTC with milliseconds (`2026-12-01T10:00:00.000Z`).
pub fn format_ms(epoch_ms: i64) -> String {
    let days = epoch_ms.div_euclid(86_400_000);
    let ms = epoch_ms.rem_euclid(86_400_000);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

/// `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` as epoch milliseconds (fractions past milliseconds
/// are truncated); `None` for anything else, including impossible dates.
fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |from: usize, len: usize| -> Option<i64> {
        let part = b.get(from..from + len)?;
        if !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(part).ok()?.parse().ok()
    };
    let at = |i: usize, c: &[u8]| b.get(i).is_some_and(|x| c.contains(x));
    if !(at(4, b"-") && at(7, b"-") && at(10, b"Tt") && at(13, b":") && at(16, b":")) {
        return None;
    }
    let (y, mo, d) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (h, mi, sec) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    if !(1..=12).contains(&mo) || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 {
        return None;
    }
    if sec > 59 {
        return None;
    }
    let mut i = 19;
    let mut frac_ms = 0;
    if at(i, b".") {
        let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 || digits > 9 {
            return None;
        }
        let padded = format!(
            "{:0<3}",
            std::str::from_utf8(&b[i + 1..i + 1 + digits.min(3)]).ok()?
        );
        frac_ms = padded.parse::<i64>().ok()?;
        i += 1 + digits;
    }
    let offset_min = match b.get(i..)? {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let (oh, om) = (num(i + 1, 2)?, num(i + 4, 2)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let total = oh * 60 + om;
            if *sign == b'-' { -total } else { total }
        }
        _ => return None,
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec - offset_min * 60;
    Some(secs * 1000 + frac_ms)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const NOW: i64 = 1_796_119_200_000; // 2026-12-01T10:00:00Z

    #[test]
    fn as_of_parses_versions_times_and_times_ago() {
        assert_eq!(AsOf::parse("42", NOW).unwrap(), AsOf::Version(42));
        assert_eq!(AsOf::parse(" 7 ", NOW).unwrap(), AsOf::Version(7));
        let t = |s: &str| match AsOf::parse(s, NOW).unwrap() {
            AsOf::Time { epoch_ms } => epoch_ms,
            other => panic!("{s}: {other:?}"),
        };
        assert_eq!(t("2026-12-01T10:00:00Z"), NOW);
        assert_eq!(t("2026-12-01t10:00:00z"), NOW);
        assert_eq!(t("2026-12-01T12:00:00+02:00"), NOW);
        assert_eq!(t("2026-12-01T08:30:00-01:30"), NOW);
        assert_eq!(t("2026-12-01T10:00:00.5Z"), NOW + 500);
        assert_eq!(t("2026-12-01T10:00:00.123456789Z"), NOW + 123);
        assert_eq!(t("1970-01-01T00:00:00Z"), 0);
        assert_eq!(t("1969-12-31T23:59:59.999Z"), -1);
        assert_eq!(t("2024-02-29T00:00:00Z"), 1_709_164_800_000);
        assert_eq!(t("-1h"), NOW - 3_600_000);
        assert_eq!(t("-30m"), NOW - 1_800_000);
        assert_eq!(t("-90s"), NOW - 90_000);
        assert_eq!(t("-2d"), NOW - 2 * 86_400_000);
        assert_eq!(t("-1h30m"), NOW - 5_400_000);
    }

    #[test]
    fn bad_as_of_text_is_one_setting_error_naming_the_forms() {
        for bad in [
            "",
            "0",
            "-1",
            "-90",
            "1h",
            "+1h",
            "-1x",
            "99999999999999999999",
            "yesterday",
            "2026-12-01",
            "2026-12-01T10:00:00",
            "2026-13-01T10:00:00Z",
            "2026-02-29T10:00:00Z",
            "2026-12-01T24:00:00Z",
            "2026-12-01T10:60:00Z",
            "2026-12-01T10:00:60Z",
            "2026-12-01T10:00:00.Z",
            "2026-12-01T10:00:00+2:00",
            "2026-12-01T10:00:00+02:00x",
            "2026-12-01 10:00:00Z",
            "２026-12-01T10:00:00Z",
        ] {
            let err = AsOf::parse(bad, NOW).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{bad:?}");
            let msg = err.to_string();
            assert!(msg.starts_with("as-of "), "{msg}");
            assert!(
                msg.contains("RFC3339") && msg.contains("-1h") && msg.contains("(42)"),
                "{msg}"
            );
        }
    }

    /// Five saves a minute apart, copied; the live manifest at version 5.
    async fn five_saves() -> (crate::store::memory::MemoryStore, Layout) {
        let store = crate::store::memory::MemoryStore::new();
        let layout = Layout::new("", "data", "manifest/{schema_id}.json").unwrap();
        let clock = crate::clock::ManualClock::new(NOW);
        for _ in 0..5 {
            manifest::commit_within(&store, &layout, 7, &clock, Default::default(), |_| Ok(()))
                .await
                .unwrap();
            clock.advance(60_000);
        }
        (store, layout)
    }

    #[tokio::test]
    async fn gc_keeps_the_copy_in_force_at_the_window_start_and_every_later_one() {
        let (store, layout) = five_saves().await;
        let day = 86_400_000;
        let at = |now: i64, layout: &Layout| {
            let (store, layout) = (&store, layout.clone());
            async move { prune_plan(store, &layout, 7, now).await.unwrap() }
        };
        let keys =
            |vs: &[i64]| -> Vec<String> { vs.iter().map(|v| layout.history_key(7, *v)).collect() };
        // The window starts between saves 3 and 4: 3 was in force then.
        let p = at(NOW + day + 2 * 60_000 + 30_000, &layout).await;
        assert_eq!((p.due, p.kept), (keys(&[1, 2]), 3));
        // Exactly at save 3: the same.
        let p = at(NOW + day + 2 * 60_000, &layout).await;
        assert_eq!((p.due, p.kept), (keys(&[1, 2]), 3));
        // Before every save: nothing is due.
        let p = at(NOW + 1, &layout).await;
        assert_eq!((p.due, p.kept), (Vec::new(), 5));
        // Long after: only the newest is kept.
        let p = at(NOW + 10 * day, &layout).await;
        assert_eq!((p.due, p.kept), (keys(&[1, 2, 3, 4]), 1));
        // No retention: every copy is due.
        let off = layout.clone().with_history_retention(Duration::ZERO);
        let p = at(NOW, &off).await;
        assert_eq!((p.due, p.kept), (keys(&[1, 2, 3, 4, 5]), 0));
    }

    #[tokio::test]
    async fn a_time_finds_the_version_in_force_loading_few_copies() {
        let (store, layout) = five_saves().await;
        let faulty = crate::store::fault::FaultStore::new(std::sync::Arc::new(store));
        for (t, want) in [
            (NOW, 1),
            (NOW + 59_999, 1),
            (NOW + 60_000, 2),
            (NOW + 3 * 60_000 + 1, 4),
            (NOW + 4 * 60_000, 5),
            (i64::MAX, 5),
        ] {
            let before = faulty.calls().len();
            let m = load_as_of(&faulty, &layout, 7, &AsOf::Time { epoch_ms: t })
                .await
                .unwrap();
            assert_eq!(m.version, want, "{t}");
            let reads = faulty.calls()[before..]
                .iter()
                .filter(|c| c.op == crate::store::fault::Op::GetBytes)
                .count();
            // The live manifest, then at most ceil(log2(4 + 1)) copies.
            assert!(reads <= 4, "{reads} reads for {t}");
        }
        let err = load_as_of(&faulty, &layout, 7, &AsOf::Time { epoch_ms: NOW - 1 })
            .await
            .unwrap_err();
        assert!(matches!(err, Error::AsOf { schema_id: 7, .. }), "{err:?}");
        assert!(
            err.to_string()
                .contains("before the schema's first version"),
            "{err}"
        );
    }

    #[test]
    fn times_format_and_parse_back() {
        for ms in [0, -1, NOW, NOW + 999, 951_782_400_000, 253_402_300_799_999] {
            let text = format_ms(ms);
            assert_eq!(parse_rfc3339(&text), Some(ms), "{text}");
        }
        assert_eq!(format_ms(NOW), "2026-12-01T10:00:00.000Z");
        assert_eq!(
            AsOf::Time { epoch_ms: NOW }.to_string(),
            "2026-12-01T10:00:00.000Z"
        );
        assert_eq!(AsOf::Version(3).to_string(), "version 3");
    }
}
