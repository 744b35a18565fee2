//! Clock skew between this host, PostgreSQL and the store (docs/operations.md, `doctor`): flush
//! ages dirty rows by the host's clock against versions stamped by the application, gc's grace
//! compares the store's dates with the host's, and the commit lease spans both.

use super::check::{Check, Kind};

/// Skew beyond this is a warning.
pub(super) const WARN_MS: i64 = 1_000;
/// Skew beyond this fails the check.
pub(super) const FAIL_MS: i64 = 60_000;

/// A remote clock read between two readings of the host's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Sample {
    /// The host's clock before the remote reading was asked for.
    pub before_ms: i64,
    /// The host's clock after it arrived.
    pub after_ms: i64,
    /// The remote reading.
    pub remote_ms: i64,
    /// The remote clock's resolution: it reads `remote_ms` for any instant up to this much
    /// later (1000 for an HTTP date, which drops the milliseconds).
    pub resolution_ms: i64,
}

impl Sample {
    /// The smallest skew (remote minus host) the sample allows: zero when the remote reading
    /// fits between the two host readings, within its resolution.
    pub(super) fn skew_ms(&self) -> i64 {
        let earliest = self.before_ms.saturating_sub(self.resolution_ms);
        if self.remote_ms > self.after_ms {
            self.remote_ms - self.after_ms
        } else if self.remote_ms < earliest {
            self.remote_ms - earliest
        } else {
            0
        }
    }
}

/// The clock-skew check from what was sampled: PostgreSQL's `now()` and the store's date of
/// the probe object, or why either could not be read.
pub(super) fn check(pg: Result<Sample, &str>, store: Result<Sample, &str>) -> Check {
    if let (Err(a), Err(b)) = (&pg, &store) {
        return Check::skip(Kind::ClockSkew, format!("{a}; {b}"));
    }
    let mut parts = Vec::new();
    let mut worst = 0i64;
    for (name, sample) in [("PostgreSQL", pg), ("store", store)] {
        match sample {
            Ok(s) => {
                let skew = s.skew_ms();
                worst = worst.max(skew.saturating_abs());
                parts.push(format!("{name} {skew:+} ms"));
            }
            Err(why) => parts.push(format!("{name} not checked ({why})")),
        }
    }
    let detail = format!(
        "{} against this host (the store's dates are whole seconds)",
        parts.join(", ")
    );
    let fix = "synchronise the clocks (NTP, chrony) of this host, the database server and the store: flush's max-age, gc's grace and the commit lease are measured across them";
    if worst > FAIL_MS {
        Check::fail(Kind::ClockSkew, detail, fix)
    } else if worst > WARN_MS {
        Check::warn(Kind::ClockSkew, detail, fix)
    } else {
        Check::ok(Kind::ClockSkew, detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::check::Status;

    fn sample(before_ms: i64, after_ms: i64, remote_ms: i64, resolution_ms: i64) -> Sample {
        Sample {
            before_ms,
            after_ms,
            remote_ms,
            resolution_ms,
        }
    }

    #[test]
    fn a_truncated_http_date_within_the_put_is_no_skew() {
        // Put between 10.400 s and 10.450 s; the date says 10 s.
        assert_eq!(sample(10_400, 10_450, 10_000, 1_000).skew_ms(), 0);
        assert_eq!(sample(10_400, 10_450, 9_400, 1_000).skew_ms(), 0);
        assert_eq!(sample(10_400, 10_450, 9_000, 1_000).skew_ms(), -400);
        assert_eq!(sample(10_400, 10_450, 12_450, 1_000).skew_ms(), 2_000);
        assert_eq!(sample(10_400, 10_450, 10_399, 1).skew_ms(), 0);
        assert_eq!(sample(10_400, 10_450, 10_398, 1).skew_ms(), -1);
    }

    #[test]
    fn skew_warns_past_a_second_and_fails_past_a_minute() {
        let at = |skew: i64| Ok(sample(100_000, 100_010, 100_010 + skew, 1));
        let status = |pg, store| check(pg, store).status;
        assert_eq!(status(at(0), at(1_000)), Status::Ok);
        assert_eq!(status(at(1_001), at(0)), Status::Warn);
        assert_eq!(status(at(0), at(60_001)), Status::Fail);
        assert_eq!(status(Err("no database"), at(5)), Status::Ok);
        assert_eq!(status(Err("no database"), Err("no lake")), Status::Skip);
        let c = check(Err("no database"), at(-70_000));
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.detail.contains("PostgreSQL not checked (no database)"),
            "{}",
            c.detail
        );
        assert!(c.detail.contains("store -"), "{}", c.detail);
    }
}
