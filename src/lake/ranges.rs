//! The base tier's row-id ranges (docs/design.md §9): which base files cover which part of the
//! `row_id` space, and to which range any row id belongs. Pure data, shared by compaction's
//! plan, its merge and `inspect`.
//!
//! Base files normally have disjoint `[row_id_min, row_id_max]` ranges. A base tier written
//! before ranged compaction may hold overlapping files (promoted deltas); overlapping files
//! form one range, which a rewrite turns into disjoint files. A base without a readable range
//! but with rows covers everything (its range is unknown), so the whole tier is one range.
//! Zero-row bases cover nothing and belong to no range.
//!
//! Every row id belongs to exactly one range: the space between two ranges is split at its
//! midpoint, everything below the first range belongs to the first and everything above the
//! last to the last (so new tail ids extend the last range). With no range at all, every row
//! belongs to range 0, the tier still to be written.

use std::sync::Arc;

use arrow::array::AsArray;
use serde::Serialize;
use uuid::Uuid;

use super::keys::Layout;
use super::manifest::{FileEntry, Manifest, Tier};
use super::streamed;
use crate::error::{Error, Result};
use crate::store::ObjectStore;

/// A row id as a number whose order is UUID byte order.
pub type Key = u128;

/// The key of a 16-byte row id.
pub fn key(bytes: &[u8; 16]) -> Key {
    u128::from_be_bytes(*bytes)
}

/// The key of a row id written as text (a manifest's `row_id_min` / `row_id_max`).
pub fn parse_key(text: &str) -> Option<Key> {
    Uuid::parse_str(text).ok().map(|u| u.as_u128())
}

/// The text of a key, as manifests record row ids.
pub fn key_text(k: Key) -> String {
    Uuid::from_u128(k).hyphenated().to_string()
}

/// One range of the base tier: the files covering it and where it starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Range {
    /// The base files of the range, by their smallest row id.
    pub files: Vec<String>,
    /// The smallest row id of its files.
    pub row_id_min: String,
    /// The largest row id of its files.
    pub row_id_max: String,
    /// Rows in its files (tombstones included).
    pub rows: i64,
    /// Bytes of its files.
    pub bytes: i64,
    /// Its files overlap one another (written before ranged compaction).
    pub overlapping: bool,
}

/// The base tier cut into disjoint ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranges {
    ranges: Vec<Range>,
    /// `starts[i]`: the smallest key range `i` owns (`starts[0]` is 0).
    starts: Vec<Key>,
    /// Zero-row bases: they cover nothing.
    empty: Vec<String>,
}

/// A base file with its parsed bounds.
struct Bounded<'a> {
    entry: &'a FileEntry,
    min: Key,
    max: Key,
}

impl Ranges {
    /// The ranges of a manifest's base tier.
    pub fn of(m: &Manifest) -> Self {
        let mut empty = Vec::new();
        let mut bounded = Vec::new();
        let mut unknown = false;
        for f in m.tier(Tier::Base) {
            match (parse_key(&f.row_id_min), parse_key(&f.row_id_max)) {
                (Some(min), Some(max)) if min <= max => {
                    bounded.push(Bounded { entry: f, min, max })
                }
                _ if f.row_count == 0 => empty.push(f.path.clone()),
                _ => {
                    unknown = true;
                    bounded.push(Bounded {
                        entry: f,
                        min: 0,
                        max: Key::MAX,
                    });
                }
            }
        }
        if unknown {
            // One file of unknown range: it may hold any row, so it overlaps every file.
            for b in &mut bounded {
                (b.min, b.max) = (0, Key::MAX);
            }
        }
        bounded.sort_by(|a, b| (a.min, a.max, &a.entry.path).cmp(&(b.min, b.max, &b.entry.path)));
        let mut groups: Vec<(Key, Key, Vec<&FileEntry>)> = Vec::new();
        for b in bounded {
            match groups.last_mut() {
                Some((_, max, files)) if b.min <= *max => {
                    *max = (*max).max(b.max);
                    files.push(b.entry);
                }
                _ => groups.push((b.min, b.max, vec![b.entry])),
            }
        }
        let mut starts = Vec::with_capacity(groups.len());
        for (i, (min, _, _)) in groups.iter().enumerate() {
            starts.push(match i {
                0 => 0,
                _ => {
                    let below = groups[i - 1].1;
                    below + (min - below) / 2 + 1
                }
            });
        }
        let ranges = groups
            .into_iter()
            .map(|(min, max, files)| Range {
                overlapping: files.len() > 1,
                rows: Manifest::total_rows(files.iter().copied()),
                bytes: Manifest::total_bytes(files.iter().copied()),
                files: files.iter().map(|f| f.path.clone()).collect(),
                row_id_min: key_text(min),
                row_id_max: key_text(max),
            })
            .collect();
        Ranges {
            ranges,
            starts,
            empty,
        }
    }

    /// The ranges, in row-id order.
    pub fn ranges(&self) -> &[Range] {
        &self.ranges
    }

    /// Zero-row base files (they belong to no range).
    pub fn empty_files(&self) -> &[String] {
        &self.empty
    }

    /// How many ranges a row can belong to: the ranges, or 1 (the tier still to be written)
    /// when there is none.
    pub fn slots(&self) -> usize {
        self.ranges.len().max(1)
    }

    /// The range `k` belongs to.
    pub fn locate(&self, k: Key) -> usize {
        self.starts.partition_point(|s| *s <= k).saturating_sub(1)
    }

    /// The first key past range `i`, `None` for the last range.
    pub fn end(&self, i: usize) -> Option<Key> {
        self.starts.get(i + 1).copied()
    }

    /// The range holding every key of `[min, max]`, if one does.
    pub fn covering(&self, min: Key, max: Key) -> Option<usize> {
        let i = self.locate(min);
        (self.locate(max) == i).then_some(i)
    }
}

/// The ranges of a schema's base tier and how many delta rows fall in each (one count per
/// [`Ranges::slots`] entry): a delta whose listed range lies inside one range counts there
/// whole; any other has its `row_id` column read (that column only, by ranged reads) and each
/// row counted where it belongs. Reading the deltas needs every listed path to be a data file
/// of this schema, or the survey is refused (docs/hazards.md #417, S1).
pub async fn survey(
    store: &dyn ObjectStore,
    layout: &Layout,
    schema_id: i16,
    m: &Manifest,
) -> Result<(Ranges, Vec<i64>)> {
    let ranges = Ranges::of(m);
    let mut counts = vec![0i64; ranges.slots()];
    if m.tier(Tier::Delta).next().is_none() {
        return Ok((ranges, counts));
    }
    for f in &m.files {
        if let Err(foreign) = layout.check_listed(schema_id, &f.path) {
            return Err(foreign.refusal(&layout.manifest_key(schema_id), "plan its compaction"));
        }
    }
    // Without a base tier every row belongs to the tier still to be written.
    if ranges.ranges().is_empty() {
        counts[0] = Manifest::total_rows(m.tier(Tier::Delta));
        return Ok((ranges, counts));
    }
    for f in m.tier(Tier::Delta) {
        if let (Some(min), Some(max)) = (parse_key(&f.row_id_min), parse_key(&f.row_id_max))
            && let Some(r) = ranges.covering(min, max)
        {
            counts[r] = counts[r].saturating_add(f.row_count.max(0));
            continue;
        }
        let src = Arc::new(streamed::open(store, f).await?);
        src.row_ids(store, |batch| {
            let ids = batch
                .column(0)
                .as_fixed_size_binary_opt()
                .ok_or_else(|| Error::Parquet {
                    path: f.path.clone(),
                    message: "row_id is not a UUID column".into(),
                })?;
            for v in ids.iter().flatten() {
                if let Ok(bytes) = <&[u8; 16]>::try_from(v) {
                    let r = ranges.locate(key(bytes));
                    counts[r] = counts[r].saturating_add(1);
                }
            }
            Ok(())
        })
        .await?;
    }
    Ok((ranges, counts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(path: &str, min: u128, max: u128, rows: i64) -> FileEntry {
        FileEntry {
            tier: Tier::Base,
            path: path.into(),
            row_id_min: key_text(min),
            row_id_max: key_text(max),
            created_min: 0,
            created_max: 0,
            size_bytes: 10,
            row_count: rows,
            checksum: None,
            columns: None,
            extra: Default::default(),
        }
    }

    fn manifest(files: Vec<FileEntry>) -> Manifest {
        Manifest {
            files,
            ..Manifest::empty(7)
        }
    }

    #[test]
    fn keys_follow_uuid_byte_order_and_round_trip() {
        let a = parse_key("00000000-0000-0000-0000-0000000000ff").unwrap();
        let b = parse_key("00000000-0000-0000-0000-000000000100").unwrap();
        assert!(a < b);
        assert_eq!(key_text(b), "00000000-0000-0000-0000-000000000100");
        let bytes = *Uuid::from_u128(b).as_bytes();
        assert_eq!(key(&bytes), b);
        assert_eq!(parse_key("not a uuid"), None);
    }

    #[test]
    fn gaps_split_at_their_midpoint_and_the_ends_extend_the_outer_ranges() {
        let r = Ranges::of(&manifest(vec![
            base("b", 100, 200, 5),
            base("a", 10, 20, 5),
            base("c", 300, 300, 1),
        ]));
        let files: Vec<_> = r.ranges().iter().map(|x| x.files.clone()).collect();
        assert_eq!(files, vec![vec!["a"], vec!["b"], vec!["c"]]);
        assert_eq!(r.locate(0), 0, "below the first range");
        assert_eq!(r.locate(20), 0);
        assert_eq!(r.locate(60), 0, "the midpoint of 20..100 stays below");
        assert_eq!(r.locate(61), 1);
        assert_eq!(r.locate(250), 1);
        assert_eq!(r.locate(251), 2);
        assert_eq!(r.locate(u128::MAX), 2, "new tail ids extend the last range");
        assert_eq!((r.end(0), r.end(1), r.end(2)), (Some(61), Some(251), None));
        assert_eq!(r.covering(100, 250), Some(1));
        assert_eq!(r.covering(20, 100), None);
    }

    #[test]
    fn overlapping_bases_form_one_range_and_empty_bases_none() {
        let r = Ranges::of(&manifest(vec![
            base("a", 10, 50, 5),
            base("b", 40, 60, 5),
            base("c", 100, 200, 5),
            FileEntry {
                row_id_min: String::new(),
                row_id_max: String::new(),
                ..base("zero", 0, 0, 0)
            },
        ]));
        assert_eq!(r.ranges().len(), 2);
        assert_eq!(r.ranges()[0].files, vec!["a", "b"]);
        assert!(r.ranges()[0].overlapping && !r.ranges()[1].overlapping);
        assert_eq!(r.ranges()[0].rows, 10);
        assert_eq!(r.ranges()[0].row_id_max, key_text(60));
        assert_eq!(r.empty_files(), ["zero"]);
    }

    #[test]
    fn a_base_of_unknown_range_makes_the_tier_one_range() {
        let r = Ranges::of(&manifest(vec![
            base("a", 10, 50, 5),
            FileEntry {
                row_id_min: "?".into(),
                ..base("b", 0, 0, 3)
            },
        ]));
        assert_eq!(r.ranges().len(), 1);
        assert_eq!(r.ranges()[0].files.len(), 2);
        assert_eq!(r.slots(), 1);
        let none = Ranges::of(&manifest(vec![]));
        assert_eq!(
            (none.ranges().len(), none.slots(), none.locate(5)),
            (0, 1, 0)
        );
    }
}
