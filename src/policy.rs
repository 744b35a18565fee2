//! When each job has work to do: flush's due thresholds and compaction's decision. Pure
//! functions of the numbers (no I/O), shared by the jobs that act on them and by inspect, which
//! reports what they would do.

use std::time::Duration;

use serde::Serialize;

use crate::lake::manifest::{Manifest, Tier};

/// When a schema's dirty rows are due for a flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushThresholds {
    /// Due when at least this many rows are dirty.
    pub min_records: i64,
    /// Due when the oldest dirty row is at least this old.
    pub max_age: Duration,
    /// Due regardless of the two above.
    pub force: bool,
}

impl FlushThresholds {
    /// Why a schema is not due for a flush, or `None` when it is.
    pub fn below(&self, count: i64, oldest: i64, now: i64) -> Option<String> {
        let age_ms = now.saturating_sub(oldest);
        let max_age_ms = i64::try_from(self.max_age.as_millis()).unwrap_or(i64::MAX);
        if self.force || count >= self.min_records || (oldest > 0 && age_ms >= max_age_ms) {
            None
        } else {
            Some(format!(
                "{count} dirty rows < --min-records {} and oldest {}s < --max-age {}s",
                self.min_records,
                age_ms.max(0) / 1000,
                max_age_ms / 1000
            ))
        }
    }
}

/// The numbers compaction decides from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompactThresholds {
    /// Promote when the delta tier holds at least this many bytes.
    pub target_base_size: u64,
    /// Rewrite when delta rows / base rows exceeds this ratio.
    pub dirty_ratio: f64,
}

/// What compact decides for a schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Nothing to do.
    Noop,
    /// Relabel the deltas as base; no data rewritten.
    Promote,
    /// Merge every listed file into one new base.
    Rewrite,
}

/// The plan and the numbers behind it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// The decision.
    pub decision: Decision,
    /// Why, in words.
    pub reason: String,
    /// Base files, rows and bytes.
    pub base_files: usize,
    /// Rows in the base tier.
    pub base_rows: i64,
    /// Bytes in the base tier.
    pub base_bytes: i64,
    /// Delta files.
    pub delta_files: usize,
    /// Rows in the delta tier.
    pub delta_rows: i64,
    /// Bytes in the delta tier.
    pub delta_bytes: i64,
    /// delta rows / base rows (0 without base rows).
    pub dirty_ratio: f64,
}

impl CompactThresholds {
    /// Decides what to do with a manifest (no I/O).
    pub fn plan(&self, m: &Manifest) -> Plan {
        // Sums of numbers read from the lake saturate (docs/hazards.md S4).
        let sum = |tier: Tier| {
            (
                m.tier(tier).count(),
                Manifest::total_rows(m.tier(tier)),
                Manifest::total_bytes(m.tier(tier)),
            )
        };
        let (base_files, base_rows, base_bytes) = sum(Tier::Base);
        let (delta_files, delta_rows, delta_bytes) = sum(Tier::Delta);
        let dirty_ratio = if base_rows > 0 {
            delta_rows as f64 / base_rows as f64
        } else {
            0.0
        };
        let target = i64::try_from(self.target_base_size).unwrap_or(i64::MAX);
        let (decision, reason) = if delta_files == 0 {
            (Decision::Noop, "no deltas".to_string())
        } else if delta_bytes >= target {
            (
                Decision::Promote,
                format!("delta bytes {delta_bytes} >= --target-base-size {target}"),
            )
        } else if base_rows > 0 && dirty_ratio > self.dirty_ratio {
            (
                Decision::Rewrite,
                format!(
                    "delta rows / base rows {dirty_ratio:.4} > --dirty-ratio {}",
                    self.dirty_ratio
                ),
            )
        } else if base_rows == 0 {
            (
                Decision::Noop,
                format!(
                    "no base rows yet and delta bytes {delta_bytes} < --target-base-size {target}"
                ),
            )
        } else {
            (
                Decision::Noop,
                format!(
                    "delta rows / base rows {dirty_ratio:.4} <= --dirty-ratio {}",
                    self.dirty_ratio
                ),
            )
        };
        Plan {
            decision,
            reason,
            base_files,
            base_rows,
            base_bytes,
            delta_files,
            delta_rows,
            delta_bytes,
            dirty_ratio,
        }
    }
}
