//! When each job has work to do: flush's due thresholds and compaction's decision. Pure
//! functions of the numbers (no I/O), shared by the jobs that act on them and by inspect, which
//! reports what they would do.

use std::time::Duration;

use serde::Serialize;

use crate::lake::manifest::{Manifest, Tier};
use crate::lake::ranges::{Ranges, parse_key};

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
    /// Which threshold makes a due schema due: the one line inspect shows.
    pub fn due_because(&self, count: i64, oldest: i64, now: i64) -> String {
        let age_s = now.saturating_sub(oldest).max(0) / 1000;
        if self.force {
            format!("{count} dirty rows; --force")
        } else if count >= self.min_records {
            format!("{count} dirty rows >= --min-records {}", self.min_records)
        } else {
            format!(
                "{count} dirty rows; the oldest is {age_s}s old, >= --max-age {}s",
                self.max_age.as_secs()
            )
        }
    }

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

/// The numbers compaction decides from (docs/design.md §4.3, §9).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompactThresholds {
    /// The most bytes a base file may hold; with no base tier yet, deltas holding this many
    /// bytes become bases.
    pub target_base_size: u64,
    /// A base range is rewritten once delta rows in it / its rows reach this share.
    pub dirty_ratio: f64,
    /// More listed deltas than this are folded into one even when no range is rewritten.
    pub max_deltas: usize,
    /// The most bytes a pass reads: every delta, and the bases of the ranges it rewrites.
    /// Ranges past the ratio that would pass it wait for a later pass (their delta rows go
    /// to the consolidated delta meanwhile), the least dirty first; a pass rewrites at least
    /// one range whatever its size.
    pub max_rewrite_bytes: u64,
}

/// The default of [`CompactThresholds::max_rewrite_bytes`]: a pass reading this many bytes
/// ends well within the commit lease at the merge's measured rate (docs/benchmarks.md),
/// with room for a store several times slower.
pub const MAX_REWRITE_BYTES: u64 = 8 * 1024 * 1024 * 1024;

/// What compact decides for a schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Nothing to do.
    Noop,
    /// Relabel the deltas as base; no data rewritten (no base tier yet, deltas disjoint).
    Promote,
    /// Rewrite the base ranges past the ratio (with no base tier: merge the deltas into
    /// bases) and fold the other delta rows into one consolidated delta.
    Rewrite,
    /// Fold every delta into one consolidated delta; no base is rewritten.
    Consolidate,
}

/// A base range and its share of delta rows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RangeShare {
    /// The range's position in row-id order.
    pub index: usize,
    /// Its base files.
    pub files: usize,
    /// Smallest row id of its files (empty for the tier still to be written).
    pub row_id_min: String,
    /// Largest row id of its files.
    pub row_id_max: String,
    /// Rows in its files.
    pub rows: i64,
    /// Delta rows that fall in it (a row in several deltas counts once per copy).
    pub touched: i64,
    /// touched / rows (1 for a range without rows).
    pub share: f64,
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
    /// Ranges of the base tier.
    pub ranges: usize,
    /// The ranges a rewrite rewrites, in row-id order.
    pub rewrite: Vec<RangeShare>,
    /// Ranges past the ratio left for a later pass by `--max-rewrite-bytes`.
    pub deferred: usize,
    /// Base files a rewrite keeps, keys and bytes unchanged.
    pub bases_kept: usize,
    /// Delta rows a rewrite or consolidation folds into the consolidated delta (an upper
    /// bound: copies of one row count once each).
    pub consolidated_rows: i64,
}

impl Plan {
    /// One line on the ranges a rewrite or consolidation touches, `None` for other decisions.
    pub fn ranges_line(&self) -> Option<String> {
        if !matches!(self.decision, Decision::Rewrite | Decision::Consolidate) {
            return None;
        }
        if self.ranges == 0 {
            // No base tier yet: the deltas merge into the first bases.
            return Some("no base tier yet: every delta row merges into new bases".to_string());
        }
        let shown = 8;
        let mut shares: Vec<String> = self
            .rewrite
            .iter()
            .take(shown)
            .map(|r| format!("#{} {:.1}%", r.index, r.share * 100.0))
            .collect();
        if self.rewrite.len() > shown {
            shares.push(format!("{} more", self.rewrite.len() - shown));
        }
        Some(format!(
            "rewrite {} of {} ranges{}{}; keep {} bases; {} delta rows to one consolidated delta",
            self.rewrite.len(),
            self.ranges,
            if shares.is_empty() {
                String::new()
            } else {
                format!(" ({})", shares.join(", "))
            },
            if self.deferred > 0 {
                format!(
                    "; {} more past the ratio wait for a later pass (--max-rewrite-bytes)",
                    self.deferred
                )
            } else {
                String::new()
            },
            self.bases_kept,
            self.consolidated_rows
        ))
    }
}

/// How many delta rows fall in each slot of a [`Ranges`] ([`Ranges::slots`] entries), from
/// the deltas' row ids.
pub type Touched = [i64];

impl CompactThresholds {
    /// Decides what to do with a manifest whose deltas put `touched` rows in each of the base
    /// tier's ranges (no I/O).
    pub fn plan(&self, m: &Manifest, ranges: &Ranges, touched: &Touched) -> Plan {
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
        let mut plan = Plan {
            decision: Decision::Noop,
            reason: String::new(),
            base_files,
            base_rows,
            base_bytes,
            delta_files,
            delta_rows,
            delta_bytes,
            dirty_ratio,
            ranges: ranges.ranges().len(),
            rewrite: Vec::new(),
            deferred: 0,
            bases_kept: base_files,
            consolidated_rows: 0,
        };
        let target = i64::try_from(self.target_base_size).unwrap_or(i64::MAX);
        let too_many = delta_files > self.max_deltas;
        let small = small_runs(ranges, target);
        if delta_files == 0 && small.is_none() {
            plan.reason = "no deltas".into();
            return plan;
        }
        if ranges.ranges().is_empty() {
            if delta_bytes < target && !too_many {
                plan.reason = format!(
                    "no base rows yet; delta bytes {delta_bytes} < --target-base-size {target} and {delta_files} deltas <= --max-deltas {}",
                    self.max_deltas
                );
                return plan;
            }
            let why = if too_many {
                format!("{delta_files} deltas > --max-deltas {}", self.max_deltas)
            } else {
                format!("delta bytes {delta_bytes} >= --target-base-size {target}")
            };
            plan.bases_kept = 0;
            match promotion(m, target) {
                Ok(()) => {
                    plan.decision = Decision::Promote;
                    plan.reason = format!(
                        "no base tier yet, {why}; the deltas are disjoint and each within the target"
                    );
                }
                Err(why_not) => {
                    plan.decision = Decision::Rewrite;
                    plan.reason = format!(
                        "no base tier yet, {why}; {why_not}: the deltas are merged into bases"
                    );
                    plan.rewrite.push(RangeShare {
                        index: 0,
                        files: 0,
                        row_id_min: String::new(),
                        row_id_max: String::new(),
                        rows: 0,
                        touched: delta_rows,
                        share: 1.0,
                    });
                }
            }
            return plan;
        }
        let mut kept_rows = 0i64;
        let mut due = Vec::new();
        let mut coalesce = Vec::new();
        let small_ranges = small.as_ref().map_or(&[][..], |s| &s.ranges[..]);
        for (i, r) in ranges.ranges().iter().enumerate() {
            let touched = touched.get(i).copied().unwrap_or(0);
            let share = if r.rows > 0 {
                touched as f64 / r.rows as f64
            } else {
                1.0
            };
            let range = RangeShare {
                index: i,
                files: r.files.len(),
                row_id_min: r.row_id_min.clone(),
                row_id_max: r.row_id_max.clone(),
                rows: r.rows,
                touched,
                share,
            };
            // Overlapping files (written before ranged compaction) are made disjoint by the
            // first rewrite that touches them.
            if touched > 0 && (share >= self.dirty_ratio || r.overlapping) {
                due.push(range);
            } else if small_ranges.binary_search(&i).is_ok() {
                coalesce.push(range);
            } else {
                kept_rows = kept_rows.saturating_add(touched);
            }
        }
        // The pass's bytes stay within --max-rewrite-bytes: the dirtiest ranges first, at
        // least one; the others wait (docs/design.md §9).
        due.sort_by(|a, b| b.share.total_cmp(&a.share).then(a.index.cmp(&b.index)));
        let mut bytes = u64::try_from(delta_bytes).unwrap_or(0);
        for r in due {
            let size = range_bytes(ranges, &r);
            if plan.rewrite.is_empty() || bytes.saturating_add(size) <= self.max_rewrite_bytes {
                bytes = bytes.saturating_add(size);
                plan.bases_kept = plan.bases_kept.saturating_sub(r.files);
                plan.rewrite.push(r);
            } else {
                plan.deferred += 1;
                kept_rows = kept_rows.saturating_add(r.touched);
            }
        }
        let dirty = plan.rewrite.len();
        let coalesced = coalesce_within(
            &mut plan,
            coalesce,
            ranges,
            &mut bytes,
            self.max_rewrite_bytes,
        );
        // What a pass that does not merge small neighbours leaves for later.
        for r in coalesced.left {
            kept_rows = kept_rows.saturating_add(r.touched);
        }
        plan.rewrite.sort_by_key(|r| r.index);
        // Zero-row bases go with any pass that writes.
        plan.consolidated_rows = kept_rows;
        let small_clause = small.as_ref().map(|small| {
            let what = format!(
                "{} small bases lie side by side where about {} would hold them",
                small.ranges.len(),
                small.merged
            );
            match coalesced.merged {
                0 => format!(
                    "{what}; they wait for a pass with room (--max-rewrite-bytes {})",
                    self.max_rewrite_bytes
                ),
                n => format!("{what}: {n} of them merge"),
            }
        });
        if !plan.rewrite.is_empty() {
            plan.bases_kept = plan.bases_kept.saturating_sub(ranges.empty_files().len());
            plan.decision = Decision::Rewrite;
            let mut why = Vec::new();
            if dirty + plan.deferred > 0 {
                let mut clause = format!(
                    "{} of {} ranges have a delta share >= --dirty-ratio {}",
                    dirty + plan.deferred,
                    plan.ranges,
                    self.dirty_ratio
                );
                if plan.deferred > 0 {
                    clause.push_str(&format!(
                        "; {} of them wait for a later pass (--max-rewrite-bytes {})",
                        plan.deferred, self.max_rewrite_bytes
                    ));
                }
                why.push(clause);
            }
            why.extend(small_clause.clone());
            plan.reason = why.join("; ");
        } else if too_many && delta_files > 1 {
            // (One delta folded into one would only be copied.)
            plan.bases_kept = plan.bases_kept.saturating_sub(ranges.empty_files().len());
            plan.decision = Decision::Consolidate;
            plan.reason = format!(
                "no range has a delta share >= --dirty-ratio {}; {delta_files} deltas > --max-deltas {}",
                self.dirty_ratio, self.max_deltas
            );
        } else if too_many {
            plan.consolidated_rows = 0;
            plan.reason = format!(
                "no range has a delta share >= --dirty-ratio {}; one delta is not folded into itself",
                self.dirty_ratio
            );
        } else {
            plan.consolidated_rows = 0;
            plan.reason = format!(
                "no range has a delta share >= --dirty-ratio {}; {delta_files} deltas <= --max-deltas {}",
                self.dirty_ratio, self.max_deltas
            );
        }
        if plan.decision != Decision::Rewrite
            && let Some(clause) = small_clause
        {
            plan.reason = format!("{}; {clause}", plan.reason);
        }
        plan
    }
}

/// The bytes of the base range `r` is about (0 when unknown).
fn range_bytes(ranges: &Ranges, r: &RangeShare) -> u64 {
    (ranges.ranges().get(r.index)).map_or(0, |x| u64::try_from(x.bytes).unwrap_or(0))
}

/// The small ranges a pass merges and the ones it leaves.
struct Coalesced {
    /// How many it merges.
    merged: usize,
    /// The ones it leaves for a later pass.
    left: Vec<RangeShare>,
}

/// Adds to `plan` the small ranges of `coalesce` (in row-id order) that fit in what is left of
/// the byte budget, up to the first that does not — a run is merged from its start, never in
/// scattered pieces — and of those only the ones next to another range the pass rewrites:
/// one rewritten alone would only be copied, and picked again by every pass.
fn coalesce_within(
    plan: &mut Plan,
    coalesce: Vec<RangeShare>,
    ranges: &Ranges,
    bytes: &mut u64,
    budget: u64,
) -> Coalesced {
    let size = |r: &RangeShare| range_bytes(ranges, r);
    let mut fits = Vec::new();
    let mut left = Vec::new();
    let mut room = true;
    for r in coalesce {
        room = room && bytes.saturating_add(size(&r)) <= budget;
        match room {
            true => {
                *bytes = bytes.saturating_add(size(&r));
                fits.push(r);
            }
            false => left.push(r),
        }
    }
    let rewritten: Vec<usize> = (plan.rewrite.iter().chain(&fits))
        .map(|r| r.index)
        .collect();
    let beside = |i: usize| {
        rewritten
            .iter()
            .any(|&j| j.checked_add(1) == Some(i) || i.checked_add(1) == Some(j))
    };
    let mut merged = 0;
    for r in fits {
        match beside(r.index) {
            true => {
                plan.bases_kept = plan.bases_kept.saturating_sub(r.files);
                plan.rewrite.push(r);
                merged += 1;
            }
            false => {
                *bytes = bytes.saturating_sub(size(&r));
                left.push(r);
            }
        }
    }
    Coalesced { merged, left }
}

/// A base range under this share of `--target-base-size` is small (1/4) ...
pub const SMALL_BASE_DIVISOR: i64 = 4;

/// ... when it also holds fewer rows than this: a quarter of the rows init writes per base
/// (`--max-file-rows`, 200,000), so that init's bases of narrow rows, a few MiB each, are not
/// all merged again by the first compaction after it.
pub const SMALL_BASE_ROWS: i64 = 50_000;

/// The small base ranges worth merging with their neighbours, and how many bases would hold
/// them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SmallRuns {
    /// Positions of the ranges, ascending.
    ranges: Vec<usize>,
    /// Bases a merge of each run would write, summed.
    merged: usize,
}

/// The base tier's small ranges (under a quarter of the target) that have a small neighbour,
/// when there are more of them than twice the bases their runs would merge into plus
/// [`PROMOTE_SLACK`]: the rule a promotion follows (docs/design.md §4.3, "Small bases"). Bases
/// promoted before that rule, or shrunk by deletes, are never touched enough by deltas to be
/// rewritten, so without this they would stay small for good. A small range between two
/// large ones is left alone: merging it would rewrite a large neighbour.
fn small_runs(ranges: &Ranges, target: i64) -> Option<SmallRuns> {
    let limit = target / SMALL_BASE_DIVISOR;
    let small: Vec<bool> = (ranges.ranges().iter())
        // A size of 0 is unknown (an entry written without one), not small.
        .map(|r| !r.files.is_empty() && r.bytes > 0 && r.bytes < limit && r.rows < SMALL_BASE_ROWS)
        .collect();
    let mut picked = Vec::new();
    let mut merged = 0usize;
    let mut run_bytes: Option<i64> = None;
    for (i, r) in ranges.ranges().iter().enumerate() {
        let next_small = small.get(i + 1).copied().unwrap_or(false);
        let previous_small = i > 0 && small.get(i - 1).copied().unwrap_or(false);
        if small[i] && (previous_small || next_small) {
            picked.push(i);
            run_bytes = Some(run_bytes.unwrap_or(0).saturating_add(r.bytes.max(0)));
        }
        if !next_small && let Some(b) = run_bytes.take() {
            merged = merged.saturating_add(bases_holding(b, target));
        }
    }
    too_many_small(picked.len(), merged).then_some(SmallRuns {
        ranges: picked,
        merged,
    })
}

/// Small files a promotion may list beyond twice the bases a merge would write: a few small
/// bases cost readers little, while the batches of one large flush (a hundred 1.5 MB files,
/// disjoint when read in one heap pass) would stay a hundred bases for good, as a base range
/// is only rewritten once deltas touch it (docs/design.md §9, "Promotion").
pub const PROMOTE_SLACK: usize = 8;

/// The bases a merge of `bytes` writes at `target` each: at least one.
fn bases_holding(bytes: i64, target: i64) -> usize {
    let bases = (bytes.max(1) as u64).div_ceil(target.max(1) as u64);
    usize::try_from(bases).unwrap_or(usize::MAX)
}

/// Whether `files` small files are too many to keep where a merge would write `merged`: more
/// than twice as many, plus [`PROMOTE_SLACK`] (for promotion and small bases alike).
fn too_many_small(files: usize, merged: usize) -> bool {
    files > merged.saturating_mul(2).saturating_add(PROMOTE_SLACK)
}

/// Whether the deltas may simply become the base tier: each within the target size, each
/// with a readable range, no two overlapping, and not many more files than a merge would
/// write (at most twice as many, plus [`PROMOTE_SLACK`]). `Err`: why not, in words.
fn promotion(m: &Manifest, target: i64) -> Result<(), String> {
    let mut bounds = Vec::new();
    for f in m.tier(Tier::Delta) {
        match (parse_key(&f.row_id_min), parse_key(&f.row_id_max)) {
            (Some(min), Some(max)) if min <= max && f.size_bytes <= target => {
                bounds.push((min, max))
            }
            (Some(_), Some(_)) if f.size_bytes > target => {
                return Err(format!("{} is larger than the target", f.path));
            }
            _ => return Err(format!("{} has no readable row-id range", f.path)),
        }
    }
    bounds.sort_unstable();
    if !bounds.windows(2).all(|w| w[0].1 < w[1].0) {
        return Err("the deltas overlap".into());
    }
    let merged = bases_holding(Manifest::total_bytes(m.tier(Tier::Delta)), target);
    if too_many_small(bounds.len(), merged) {
        return Err(format!(
            "{} small deltas would stay {} bases where a merge writes about {merged}",
            bounds.len(),
            bounds.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lake::manifest::FileEntry;
    use crate::lake::ranges::key_text;

    fn entry(tier: Tier, name: &str, range: (u128, u128), rows: i64, bytes: i64) -> FileEntry {
        FileEntry {
            tier,
            path: name.into(),
            row_id_min: key_text(range.0),
            row_id_max: key_text(range.1),
            created_min: 0,
            created_max: 0,
            size_bytes: bytes,
            row_count: rows,
            checksum: None,
            columns: None,
            extra: Default::default(),
        }
    }

    const T: CompactThresholds = CompactThresholds {
        target_base_size: 1000,
        dirty_ratio: 0.05,
        max_deltas: 3,
        max_rewrite_bytes: MAX_REWRITE_BYTES,
    };

    fn plan(files: Vec<FileEntry>, touched: &[i64]) -> Plan {
        let m = Manifest {
            files,
            ..Manifest::empty(7)
        };
        T.plan(&m, &Ranges::of(&m), touched)
    }

    #[test]
    fn without_a_base_tier_deltas_wait_for_the_target_then_promote_or_merge() {
        assert_eq!(plan(vec![], &[0]).decision, Decision::Noop);
        let small = plan(vec![entry(Tier::Delta, "d1", (1, 5), 5, 999)], &[0]);
        assert_eq!(small.decision, Decision::Noop, "{}", small.reason);
        let one = plan(vec![entry(Tier::Delta, "d1", (1, 5), 5, 1000)], &[0]);
        assert_eq!(one.decision, Decision::Promote, "{}", one.reason);
        // Overlapping deltas cannot become disjoint bases by relabelling.
        let overlapping = plan(
            vec![
                entry(Tier::Delta, "d1", (1, 5), 5, 600),
                entry(Tier::Delta, "d2", (3, 9), 5, 600),
            ],
            &[0],
        );
        assert_eq!(overlapping.decision, Decision::Rewrite);
        assert_eq!(overlapping.rewrite.len(), 1);
        // No "rewrite 1 of 0 ranges": there is no range yet.
        assert_eq!(
            overlapping.ranges_line().unwrap(),
            "no base tier yet: every delta row merges into new bases"
        );
        // Nor can one larger than the target.
        let big = plan(vec![entry(Tier::Delta, "d1", (1, 5), 5, 5000)], &[0]);
        assert_eq!(big.decision, Decision::Rewrite);
        // Too many small ones are merged.
        let many: Vec<_> = (0..4u128)
            .map(|i| entry(Tier::Delta, &format!("d{i}"), (i * 10, i * 10 + 1), 2, 10))
            .collect();
        // Four disjoint deltas, each within the target: relabelled.
        assert_eq!(plan(many, &[0]).decision, Decision::Promote);
        // A hundred small disjoint ones (one large flush's batches) would stay a hundred
        // bases: merged into about one.
        let hundred: Vec<_> = (0..100u128)
            .map(|i| entry(Tier::Delta, &format!("d{i}"), (i * 10, i * 10 + 1), 2, 5))
            .collect();
        let p = plan(hundred, &[0]);
        assert_eq!(p.decision, Decision::Rewrite, "{}", p.reason);
        assert!(
            p.reason
                .contains("100 small deltas would stay 100 bases where a merge writes about 1"),
            "{}",
            p.reason
        );
        // As many as a merge would write (ten near the target): relabelled.
        let full: Vec<_> = (0..10u128)
            .map(|i| entry(Tier::Delta, &format!("d{i}"), (i * 10, i * 10 + 1), 2, 900))
            .collect();
        assert_eq!(plan(full, &[0]).decision, Decision::Promote);
        // Two more than twice the merge's one plus the slack: merged.
        let edge = |n: u128| -> Vec<FileEntry> {
            (0..n)
                .map(|i| entry(Tier::Delta, &format!("d{i}"), (i * 10, i * 10 + 1), 2, 1))
                .collect()
        };
        assert_eq!(plan(edge(10), &[0]).decision, Decision::Promote);
        assert_eq!(plan(edge(11), &[0]).decision, Decision::Rewrite);
    }

    fn tier_of_ten() -> Vec<FileEntry> {
        (0..10u128)
            .map(|i| {
                entry(
                    Tier::Base,
                    &format!("b{i}"),
                    (i * 100, i * 100 + 50),
                    100,
                    100,
                )
            })
            .collect()
    }

    #[test]
    fn small_bases_side_by_side_merge_once_they_are_many() {
        // Bases of 50 bytes against a target of 1000: small (under 250).
        let base = |i: u128, bytes: i64| {
            entry(
                Tier::Base,
                &format!("b{i:03}"),
                (i * 100, i * 100 + 50),
                10,
                bytes,
            )
        };
        let small = |n: u128| -> Vec<FileEntry> { (0..n).map(|i| base(i, 50)).collect() };
        // Ten of them, which one base would hold: at most twice that plus 8, left alone.
        let p = plan(small(10), &[0; 10]);
        assert_eq!(
            (p.decision, p.reason.as_str()),
            (Decision::Noop, "no deltas")
        );
        // Twenty of unknown size (entries without one) are not known to be small.
        let unknown: Vec<FileEntry> = (0..20).map(|i| base(i, 0)).collect();
        let p = plan(unknown, &[0; 20]);
        assert_eq!(
            (p.decision, p.reason.as_str()),
            (Decision::Noop, "no deltas")
        );
        // Eleven, with no delta at all: all of them merge.
        let p = plan(small(11), &[0; 11]);
        assert_eq!(p.decision, Decision::Rewrite, "{}", p.reason);
        let merged: Vec<usize> = p.rewrite.iter().map(|r| r.index).collect();
        assert_eq!(merged, (0..11).collect::<Vec<_>>());
        assert_eq!((p.bases_kept, p.consolidated_rows), (0, 0));
        assert_eq!(
            p.reason,
            "11 small bases lie side by side where about 1 would hold them: 11 of them merge"
        );
        // A small base between two large ones stays, and so do the large ones. Thirteen small
        // ones in two runs (one base each): 13 > 2 * 2 + 8.
        let mut files = small(14);
        files[7] = base(7, 900);
        files.extend([base(14, 900), base(15, 50), base(16, 900)]);
        let p = plan(files.clone(), &[0; 17]);
        let merged: Vec<usize> = p.rewrite.iter().map(|r| r.index).collect();
        let runs: Vec<usize> = (0..7).chain(8..14).collect();
        assert_eq!(merged, runs, "{}", p.reason);
        assert_eq!(p.bases_kept, 4);
        // Dirty ranges come first within the byte budget; small ones fill what is left.
        files.push(entry(Tier::Delta, "d", (1600, 1600), 1, 10));
        let mut touched = [0i64; 17];
        touched[16] = 1;
        let budget = CompactThresholds {
            max_rewrite_bytes: 10 + 900 + 250,
            ..T
        };
        let m = Manifest {
            files,
            ..Manifest::empty(7)
        };
        let p = budget.plan(&m, &Ranges::of(&m), &touched);
        let merged: Vec<usize> = p.rewrite.iter().map(|r| r.index).collect();
        assert_eq!(merged, [0, 1, 2, 3, 4, 16], "{}", p.reason);
        assert_eq!(
            p.reason,
            "1 of 17 ranges have a delta share >= --dirty-ratio 0.05; \
             13 small bases lie side by side where about 2 would hold them: 5 of them merge"
        );
        // Room for one small base only: rewritten alone it would merge with nothing and be
        // picked again by every pass, so it waits.
        let one = CompactThresholds {
            max_rewrite_bytes: 10 + 900 + 50,
            ..T
        };
        let p = one.plan(&m, &Ranges::of(&m), &touched);
        let merged: Vec<usize> = p.rewrite.iter().map(|r| r.index).collect();
        assert_eq!(merged, [16], "{}", p.reason);
        assert!(
            p.reason.ends_with("13 small bases lie side by side where about 2 would hold them; they wait for a pass with room (--max-rewrite-bytes 960)"),
            "{}",
            p.reason
        );
        // Bases of as many rows as init writes are not small, however few their bytes.
        let wide: Vec<FileEntry> = (0..20u128)
            .map(|i| {
                entry(
                    Tier::Base,
                    &format!("b{i:03}"),
                    (i * 100, i * 100 + 50),
                    200_000,
                    50,
                )
            })
            .collect();
        let p = plan(wide, &[0; 20]);
        assert_eq!(
            (p.decision, p.reason.as_str()),
            (Decision::Noop, "no deltas")
        );
    }

    #[test]
    fn only_ranges_past_the_ratio_are_rewritten() {
        let mut files = tier_of_ten();
        files.push(entry(Tier::Delta, "d", (0, 999), 12, 10));
        let mut touched = vec![0i64; 10];
        touched[2] = 5;
        touched[7] = 6;
        touched[9] = 1;
        let p = plan(files.clone(), &touched);
        assert_eq!(p.decision, Decision::Rewrite, "{}", p.reason);
        let rewritten: Vec<usize> = p.rewrite.iter().map(|r| r.index).collect();
        assert_eq!(rewritten, vec![2, 7]);
        assert_eq!((p.bases_kept, p.consolidated_rows, p.ranges), (8, 1, 10));
        assert!((p.rewrite[1].share - 0.06).abs() < 1e-9);
        // All below the ratio, few deltas: nothing to do.
        let p = plan(files.clone(), &[1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
        assert_eq!(p.decision, Decision::Noop, "{}", p.reason);
        // One delta past --max-deltas 0 is not "1 deltas <= --max-deltas 0".
        let m = Manifest {
            files: files.clone(),
            ..Manifest::empty(7)
        };
        let zero = CompactThresholds { max_deltas: 0, ..T };
        let p = zero.plan(&m, &Ranges::of(&m), &[1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
        assert_eq!(p.decision, Decision::Noop, "{}", p.reason);
        assert!(
            p.reason.ends_with("one delta is not folded into itself"),
            "{}",
            p.reason
        );
        // All below the ratio, too many deltas: one consolidated delta, no base rewritten.
        for i in 0..3u128 {
            files.push(entry(Tier::Delta, &format!("e{i}"), (i, i), 1, 10));
        }
        let p = plan(files, &[1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
        assert_eq!(p.decision, Decision::Consolidate, "{}", p.reason);
        assert_eq!((p.bases_kept, p.consolidated_rows), (10, 10));
        assert!(p.rewrite.is_empty());
    }

    /// A pass reads at most --max-rewrite-bytes: the dirtiest ranges first, at least one;
    /// the others' delta rows go to the consolidated delta and their ranges wait.
    #[test]
    fn a_pass_rewrites_the_dirtiest_ranges_its_byte_budget_holds() {
        let mut files = tier_of_ten();
        files.push(entry(Tier::Delta, "d", (0, 999), 30, 10));
        let mut touched = vec![0i64; 10];
        touched[1] = 6;
        touched[4] = 9;
        touched[6] = 7;
        touched[8] = 1;
        // The delta (10 bytes) and two bases of 100 bytes.
        let budget = |max_rewrite_bytes: u64| {
            let m = Manifest {
                files: files.clone(),
                ..Manifest::empty(7)
            };
            let t = CompactThresholds {
                max_rewrite_bytes,
                ..T
            };
            t.plan(&m, &Ranges::of(&m), &touched)
        };
        let p = budget(210);
        assert_eq!(p.decision, Decision::Rewrite, "{}", p.reason);
        let rewritten: Vec<usize> = p.rewrite.iter().map(|r| r.index).collect();
        assert_eq!(rewritten, vec![4, 6], "{}", p.reason);
        assert_eq!((p.deferred, p.bases_kept, p.consolidated_rows), (1, 8, 7));
        assert!(p.reason.contains("3 of 10 ranges"), "{}", p.reason);
        assert!(p.reason.contains("1 of them wait"), "{}", p.reason);
        assert!(
            p.ranges_line().unwrap().contains("1 more past the ratio"),
            "{:?}",
            p.ranges_line()
        );
        // One byte short of the second range: the dirtiest alone.
        let p = budget(209);
        let rewritten: Vec<usize> = p.rewrite.iter().map(|r| r.index).collect();
        assert_eq!((rewritten, p.deferred), (vec![4], 2));
        // A budget below any range still rewrites the dirtiest one.
        let p = budget(1);
        let rewritten: Vec<usize> = p.rewrite.iter().map(|r| r.index).collect();
        assert_eq!(
            (rewritten, p.deferred, p.consolidated_rows),
            (vec![4], 2, 14)
        );
        // The default holds them all.
        let p = budget(MAX_REWRITE_BYTES);
        assert_eq!((p.rewrite.len(), p.deferred), (3, 0));
    }

    #[test]
    fn a_touched_range_of_overlapping_bases_is_rewritten_whatever_its_share() {
        let files = vec![
            entry(Tier::Base, "a", (0, 60), 1000, 10),
            entry(Tier::Base, "b", (50, 90), 1000, 10),
            entry(Tier::Delta, "d", (55, 55), 1, 10),
        ];
        let p = plan(files, &[1]);
        assert_eq!(p.decision, Decision::Rewrite);
        assert_eq!((p.rewrite[0].files, p.bases_kept), (2, 0));
    }
}
