//! Ranged compaction on SeaweedFS (docs/design.md §9): after init, random workloads, flushes
//! and compactions the lake equals PostgreSQL and the base tier keeps its invariant (disjoint
//! ranges, each file within the target, each file's rows sorted and inside its recorded
//! range); untouched ranges keep their keys and bytes; a pass below the ratio rewrites no base
//! and leaves one delta, whose tombstones keep deleted rows deleted; a failed upload of any
//! output publishes nothing and a clean rerun converges.

use std::collections::{BTreeMap, BTreeSet};

use lakecdc::compact::{CompactOptions, Decision, Outcome, SchemaCompact};
use lakecdc::init::InitOptions;
use lakecdc::store::ObjectStore;
use lakecdc::store::fault::{Action, Op};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::file::serialized_reader::ReadOptionsBuilder;
use serde_json::Value;
use uuid::Uuid;

use crate::support::oracle;
use crate::support::rig::{LakeKind, Rig, rig};
use crate::support::writer::{Customer, Rng};

const MANIFEST: &str = "manifest/100.json";

/// Compaction with these settings; new bases line up with base row groups of any size, so
/// that the copying of unchanged column chunks runs on these small files too.
fn opts(rig: &Rig, target: u64, ratio: f64, max_deltas: usize) -> CompactOptions {
    CompactOptions {
        min_repeat_rows: 1,
        schemas: vec!["customer".into()],
        work_dir: rig.opts.work_dir.clone(),
        target_base_size: target,
        dirty_ratio: ratio,
        max_deltas,
        ..CompactOptions::default()
    }
}

/// `o` with new bases lining up only with base row groups of the usual minimum
/// ([`lakecdc::compact::MIN_REPEAT_ROWS`]): these small files' rows are then cut by size
/// alone.
fn whole_groups(o: CompactOptions) -> CompactOptions {
    CompactOptions {
        min_repeat_rows: lakecdc::compact::MIN_REPEAT_ROWS,
        ..o
    }
}

async fn compact(rig: &Rig, o: &CompactOptions) -> SchemaCompact {
    let report = lakecdc::compact::run(&rig.job_context(), o).await.unwrap();
    report.schemas.into_iter().next().unwrap()
}

/// A lake of `n` rows written by init into files of `per_file` rows, and nothing dirty (the
/// rows were flushed first; init replaces those deltas).
async fn lake_from_init(seed: u64, n: usize, per_file: u64) -> (Rig, Rng) {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(seed);
    rig.seed(n, &mut r).await;
    rig.flush().await;
    let o = InitOptions {
        schemas: vec!["customer".into()],
        replace_delta: true,
        work_dir: rig.opts.work_dir.clone(),
        page_rows: per_file.min(100) as i64,
        max_file_rows: per_file,
        ..InitOptions::default()
    };
    lakecdc::init::run(&rig.ctx, &o).await.unwrap();
    assert!(files(&manifest(&rig).await, "delta").is_empty());
    (rig, r)
}

fn files(m: &Value, tier: &str) -> Vec<Value> {
    m["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["tier"] == tier)
        .cloned()
        .collect()
}

async fn manifest(rig: &Rig) -> Value {
    oracle::manifest_json(rig.store.as_ref(), MANIFEST)
        .await
        .unwrap()
}

fn id(v: &Value) -> Uuid {
    Uuid::parse_str(v.as_str().unwrap()).unwrap()
}

/// Asserts the base tier's invariant (docs/design.md §9) and returns the base entries by path:
/// each file within `target`, its rows sorted by row id (one copy each) and inside its
/// recorded range, whose ends are its first and last row; the ranges pairwise disjoint.
async fn assert_base_tier(rig: &Rig, target: u64) -> BTreeMap<String, Value> {
    let m = manifest(rig).await;
    let mut ranges = Vec::new();
    let mut out = BTreeMap::new();
    for f in files(&m, "base") {
        let path = f["path"].as_str().unwrap().to_string();
        let size = f["size_bytes"].as_u64().unwrap();
        assert!(size <= target, "{path}: {size} bytes > target {target}");
        let bytes = rig.store.get_bytes(&path).await.unwrap().bytes;
        let rows = oracle::read_parquet(bytes);
        if rows.is_empty() {
            assert_eq!(f["row_count"], 0, "{path}");
        } else {
            let ids: Vec<Uuid> = rows.iter().map(|(id, _)| *id).collect();
            assert!(
                ids.windows(2).all(|w| w[0] < w[1]),
                "{path}: rows not sorted by row id"
            );
            let (min, max) = (id(&f["row_id_min"]), id(&f["row_id_max"]));
            assert_eq!(
                (ids[0], ids[ids.len() - 1]),
                (min, max),
                "{path}: recorded range"
            );
            ranges.push((min, max, path.clone()));
        }
        out.insert(path, f);
    }
    ranges.sort();
    for w in ranges.windows(2) {
        assert!(w[0].1 < w[1].0, "overlapping bases: {w:?}");
    }
    out
}

/// Live model rows whose ids fall in `[min, max]`.
fn rows_in(rig: &Rig, min: Uuid, max: Uuid) -> Vec<Uuid> {
    rig.writer
        .rows
        .iter()
        .filter(|(id, m)| !m.soft_deleted && **id >= min && **id <= max)
        .map(|(id, _)| *id)
        .collect()
}

/// The oracle: init, then rounds of random work (inserts anywhere, new tail and head ids,
/// updates, soft and hard deletes, recreations) flushed in several deltas and compacted with
/// different settings; after every round the lake equals PostgreSQL and the base tier holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rounds_of_work_and_ranged_compactions_keep_the_lake_equal_to_postgres() {
    let (mut rig, mut r) = lake_from_init(2101, 240, 24).await;
    let target = 32 * 1024;
    assert_base_tier(&rig, u64::MAX).await;
    let settings = [
        (0.05, 32, "ratio 5%"),
        (0.1, 2, "some ranges past the ratio, the rest consolidated"),
        (0.0, 32, "every touched range rewritten"),
        (1.0, 0, "nothing past the ratio, consolidate"),
        (0.05, 32, "ratio 5% over a consolidated delta"),
        (0.2, 1, "a mixed pass"),
    ];
    let mut tail = u128::MAX;
    let mut head = 1u128;
    let mut copied = 0;
    for (round, (ratio, max_deltas, what)) in settings.into_iter().enumerate() {
        for flush in 0..3 {
            for _ in 0..25 {
                rig.writer.random_op(&mut r).await;
            }
            if round % 2 == 0 && flush == 0 {
                // New ids past both ends of the id space.
                for _ in 0..4 {
                    rig.writer
                        .create(Uuid::from_u128(tail), Customer::random(&mut r))
                        .await;
                    rig.writer
                        .create(Uuid::from_u128(head), Customer::random(&mut r))
                        .await;
                    tail -= 1;
                    head += 1;
                }
            }
            rig.flush().await;
        }
        let s = compact(&rig, &opts(&rig, target, ratio, max_deltas)).await;
        assert_eq!(s.outcome, Outcome::Done, "round {round} ({what}): {s:?}");
        copied += s.chunks_copied;
        let plan = s.plan.clone().unwrap();
        assert_ne!(plan.decision, Decision::Noop, "round {round} ({what})");
        assert_ne!(plan.decision, Decision::Promote, "round {round} ({what})");
        let live = rig.writer.rows.values().filter(|m| !m.soft_deleted).count();
        assert_eq!(
            rig.assert_oracle().await,
            (live, 0),
            "round {round} ({what})"
        );
        assert_base_tier(&rig, target).await;
        let m = manifest(&rig).await;
        assert!(
            files(&m, "delta").len() <= 1,
            "round {round} ({what}): one consolidated delta at most"
        );
        if plan.decision == Decision::Consolidate {
            assert_eq!(s.bases_rewritten, 0, "round {round} ({what})");
        }
    }
    // Some rewritten row groups came out row for row and kept chunks as they were.
    assert!(copied > 0, "no column chunk was copied");
}

/// Deltas touching 2 of about 10 base files rewrite those two only: the others keep their
/// entries (keys, bytes, checksums). Then a pass whose changes are all below the ratio
/// rewrites no base and leaves exactly one delta, holding the tombstone of a row deleted in a
/// range that is not rewritten: the row stays deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_touched_ranges_are_rewritten_and_the_rest_fold_into_one_delta() {
    let (mut rig, mut r) = lake_from_init(2102, 200, 20).await;
    // Its bases (a few KiB) are not small for this target, which would merge them all.
    let target = 24 << 10;
    let before = assert_base_tier(&rig, target).await;
    let n = before.len();
    assert!(n >= 8, "{n} bases");
    let bases: Vec<&Value> = before.values().collect();
    let (a, b) = (bases[2], bases[7]);
    for f in [a, b] {
        let ids = rows_in(&rig, id(&f["row_id_min"]), id(&f["row_id_max"]));
        for id in ids.iter().take(3) {
            rig.writer.update(*id, Customer::random(&mut r)).await;
        }
    }
    rig.flush().await;
    let s = compact(&rig, &opts(&rig, target, 0.05, 32)).await;
    assert_eq!(s.outcome, Outcome::Done, "{s:?}");
    let plan = s.plan.clone().unwrap();
    assert_eq!(plan.decision, Decision::Rewrite, "{}", plan.reason);
    assert_eq!(plan.rewrite.len(), 2, "{plan:?}");
    assert_eq!((s.bases_rewritten, s.bases_kept), (2, n - 2));
    // Each rewritten base comes out row for row: its unchanged columns (row_id among them)
    // are copied, not encoded again.
    assert!(s.chunks_copied >= 2, "{s:?}");
    let after = assert_base_tier(&rig, target).await;
    let a_path = a["path"].as_str().unwrap();
    let b_path = b["path"].as_str().unwrap();
    for (path, entry) in &before {
        if path == a_path || path == b_path {
            assert!(!after.contains_key(path), "{path} was rewritten");
        } else {
            assert_eq!(after.get(path), Some(entry), "{path} kept its entry");
        }
    }
    assert_eq!(after.len(), n, "two new bases for two rewritten: {s:?}");
    assert!(files(&manifest(&rig).await, "delta").is_empty());
    let retired = oracle::retired_paths(rig.store.as_ref(), MANIFEST).await;
    assert!(
        retired.contains(a_path) && retired.contains(b_path),
        "{retired:?}"
    );
    assert_eq!(rig.assert_oracle().await.1, 0);

    // One change in each of three other ranges, in two flushes; one row hard-deleted.
    let kept: Vec<&Value> = after
        .iter()
        .filter(|(p, _)| before.contains_key(*p))
        .map(|(_, f)| f)
        .take(3)
        .collect();
    let mut deleted = None;
    for (i, f) in kept.iter().enumerate() {
        let ids = rows_in(&rig, id(&f["row_id_min"]), id(&f["row_id_max"]));
        if i == 0 {
            rig.writer.hard_delete(ids[0]).await;
            deleted = Some(ids[0]);
        } else {
            rig.writer.update(ids[0], Customer::random(&mut r)).await;
        }
        if i == 1 {
            rig.flush().await;
        }
    }
    rig.flush().await;
    let deltas = files(&manifest(&rig).await, "delta");
    assert_eq!(deltas.len(), 2);
    let s = compact(&rig, &opts(&rig, target, 0.1, 1)).await;
    assert_eq!(s.outcome, Outcome::Done, "{s:?}");
    let plan = s.plan.clone().unwrap();
    assert_eq!(plan.decision, Decision::Consolidate, "{}", plan.reason);
    assert_eq!((s.bases_rewritten, s.bases_kept), (0, n));
    let m = manifest(&rig).await;
    let deltas = files(&m, "delta");
    assert_eq!(deltas.len(), 1, "exactly one delta");
    assert_eq!(
        assert_base_tier(&rig, target).await,
        after,
        "no base rewritten"
    );
    // The consolidated delta keeps the tombstone: the base below still holds the row.
    let deleted = deleted.unwrap();
    let path = deltas[0]["path"].as_str().unwrap();
    let rows = oracle::read_parquet(rig.store.get_bytes(path).await.unwrap().bytes);
    assert_eq!(rows.len(), 3, "{rows:?}");
    let tomb = rows.iter().find(|(id, _)| *id == deleted).unwrap();
    assert!(tomb.1.deleted_at > 0, "{tomb:?}");
    let state = oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
    assert!(
        !state.contains_key(&deleted),
        "the deleted row stays deleted"
    );
    let live = rig.writer.rows.values().filter(|m| !m.soft_deleted).count();
    assert_eq!(rig.assert_oracle().await, (live, 0));
}

/// `--max-rewrite-bytes` bounds a pass (docs/design.md §9): of three ranges past the ratio, a
/// budget holding the delta and one base rewrites the dirtiest alone and folds the others'
/// rows into one delta, which keeps them current; the next passes take the rest, one each,
/// and the lake equals PostgreSQL after each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_byte_budget_spreads_a_rewrite_over_passes_that_converge() {
    let (mut rig, mut r) = lake_from_init(2105, 200, 20).await;
    // Its bases (a few KiB) are not small for this target, which would merge them all.
    let target = 24 << 10;
    let before = assert_base_tier(&rig, target).await;
    let bases: Vec<&Value> = before.values().collect();
    // Ranges 1, 4 and 8, the first the dirtiest.
    let picked = [(bases[1], 6), (bases[4], 4), (bases[8], 3)];
    for (f, n) in picked {
        let ids = rows_in(&rig, id(&f["row_id_min"]), id(&f["row_id_max"]));
        for id in ids.iter().take(n) {
            rig.writer.update(*id, Customer::random(&mut r)).await;
        }
    }
    rig.flush().await;
    let delta_bytes: u64 = files(&manifest(&rig).await, "delta")
        .iter()
        .map(|f| f["size_bytes"].as_u64().unwrap())
        .sum();
    let largest = picked
        .iter()
        .map(|(f, _)| f["size_bytes"].as_u64().unwrap())
        .max()
        .unwrap();
    let mut o = opts(&rig, target, 0.05, 32);
    // Room for the deltas and one base, never two.
    o.max_rewrite_bytes = delta_bytes + largest;
    let mut rewritten = Vec::new();
    for pass in 0..3 {
        let s = compact(&rig, &o).await;
        assert_eq!(s.outcome, Outcome::Done, "pass {pass}: {s:?}");
        let plan = s.plan.clone().unwrap();
        assert_eq!(
            plan.decision,
            Decision::Rewrite,
            "pass {pass}: {}",
            plan.reason
        );
        assert_eq!(
            (plan.rewrite.len(), plan.deferred),
            (1, 2 - pass),
            "pass {pass}: {}",
            plan.reason
        );
        rewritten.push(plan.rewrite[0].row_id_min.clone());
        let after = assert_base_tier(&rig, target).await;
        assert_eq!(after.len(), before.len(), "pass {pass}");
        let deltas = files(&manifest(&rig).await, "delta");
        assert_eq!(
            deltas.len(),
            usize::from(pass < 2),
            "pass {pass}: {deltas:?}"
        );
        assert_eq!(rig.assert_oracle().await.1, 0, "pass {pass}");
        // The consolidated delta is smaller than the first: the next pass's budget holds it
        // and one base again.
        o.max_rewrite_bytes = deltas
            .iter()
            .map(|f| f["size_bytes"].as_u64().unwrap())
            .sum::<u64>()
            + largest;
    }
    // The dirtiest range went first, then by share.
    let want: Vec<String> = picked
        .iter()
        .map(|(f, _)| f["row_id_min"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(rewritten, want);
    let s = compact(&rig, &o).await;
    assert_eq!(s.plan.unwrap().decision, Decision::Noop);
}

/// Compaction cuts its output at the target: a rewrite of a whole tier into small files
/// gives several bases, each within the target, disjoint and sorted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outputs_are_cut_at_the_target_size() {
    let (mut rig, mut r) = lake_from_init(2103, 300, 300).await;
    assert_base_tier(&rig, u64::MAX).await;
    for _ in 0..60 {
        rig.writer.random_op(&mut r).await;
    }
    rig.flush().await;
    let target = 32 * 1024;
    let s = compact(&rig, &whole_groups(opts(&rig, target, 0.0, 32))).await;
    assert_eq!(s.outcome, Outcome::Done, "{s:?}");
    let bases = assert_base_tier(&rig, target).await;
    assert!(bases.len() >= 3, "{} bases: {bases:?}", bases.len());
    // Not cut needlessly small: most files are more than half the target.
    let big = bases
        .values()
        .filter(|f| f["size_bytes"].as_u64().unwrap() > target / 3)
        .count();
    assert!(big * 2 >= bases.len(), "{bases:?}");
    let live = rig.writer.rows.values().filter(|m| !m.soft_deleted).count();
    assert_eq!(rig.assert_oracle().await, (live, 0));
}

/// docs/design.md §9 (runs), docs/hazards.md L82: bases written at the target size, each one
/// row group of several pages, come out of a full rewrite after updates cut into runs at the
/// page starts of their `row_id` column: no file past the target, the unchanged columns
/// copied page by page, and the lake equal to PostgreSQL. A second full rewrite, after inserts
/// and deletes too, converges as well.
///
/// Its lake needs row groups of several pages, which at the writer's 20,000 rows a page would
/// take tens of thousands of rows: it runs [`runs_of_pages`] in a process of its own with
/// pages of 400 rows (`LAKECDC_TEST_PAGE_ROWS`, a seam of the `testing` feature, process-wide).
#[test]
fn bases_at_the_target_are_rewritten_in_runs_of_their_pages() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "compact_ranges::runs_of_pages",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env("LAKECDC_TEST_PAGE_ROWS", "400")
        .env("LAKECDC_TEST_DICTIONARY_BYTES", "1024")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("test result: ok. 1 passed"), "{text}");
}

/// [`bases_at_the_target_are_rewritten_in_runs_of_their_pages`], in its own process.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "run by bases_at_the_target_are_rewritten_in_runs_of_their_pages, with small pages"]
async fn runs_of_pages() {
    assert_eq!(
        std::env::var("LAKECDC_TEST_PAGE_ROWS").as_deref(),
        Ok("400")
    );
    assert_eq!(
        std::env::var("LAKECDC_TEST_DICTIONARY_BYTES").as_deref(),
        Ok("1024")
    );
    // 3,000 rows: a base holds one row group of several pages.
    let (mut rig, mut r) = lake_from_init(2107, 3_000, 3_000).await;
    let before = assert_base_tier(&rig, u64::MAX).await;
    let (largest_path, largest) = before
        .iter()
        .map(|(p, f)| (p.clone(), f["size_bytes"].as_u64().unwrap()))
        .max_by_key(|(_, size)| *size)
        .unwrap();
    // The largest base fits the target, with less than the writer's 5% to spare.
    let target = largest + largest / 50;
    // Where its row_id column's pages start: the runs' possible ends.
    let largest_file = rig.store.get_bytes(&largest_path).await.unwrap().bytes;
    let row_ids = column_pages(&largest_file, "row_id");
    assert_eq!(row_ids.len(), 1);
    let rows = row_ids[0].rows;
    let starts: Vec<i64> = row_ids[0].starts.iter().copied().chain([rows]).collect();
    assert!(starts.len() > 2, "{starts:?}");
    // The e-mail column's pages: its dictionary fell back after a quarter page, so they start
    // elsewhere than row_id's.
    let mut emails = BTreeSet::new();
    for path in before.keys() {
        let file = rig.store.get_bytes(path).await.unwrap().bytes;
        emails.extend(
            column_pages(&file, "email")
                .into_iter()
                .flat_map(|c| c.pages),
        );
    }
    // Updates of one column only: every run comes out row for row, the others unchanged.
    let ids: Vec<Uuid> = rig.writer.rows.keys().copied().collect();
    for id in ids.iter().step_by(100) {
        let mut c = rig.writer.rows[id].value.clone();
        c.age = Some(c.age.map_or(1, |a| (a + 1) % 120));
        rig.writer.update(*id, c).await;
    }
    rig.flush().await;
    let s = compact(&rig, &opts(&rig, target, 0.0, 32)).await;
    assert_eq!(s.outcome, Outcome::Done, "{s:?}");
    let bases = assert_base_tier(&rig, target).await;
    let live = rig.writer.rows.values().filter(|m| !m.soft_deleted).count();
    assert_eq!(rig.assert_oracle().await, (live, 0));
    // Runs of the largest base: row groups of whole pages, their unchanged columns copied.
    let mut groups = Vec::new();
    for path in bases.keys() {
        let r = SerializedFileReader::new(rig.store.get_bytes(path).await.unwrap().bytes).unwrap();
        groups.extend(r.metadata().row_groups().iter().map(|g| g.num_rows()));
    }
    let runs: Vec<i64> = starts
        .iter()
        .enumerate()
        .flat_map(|(i, a)| starts[i + 1..].iter().map(move |b| b - a))
        .filter(|&n| n < rows)
        .collect();
    assert!(
        groups.iter().any(|n| runs.contains(n)),
        "{groups:?}, runs {runs:?}"
    );
    assert!(groups.iter().all(|&n| n < rows), "{groups:?}");
    assert!(s.chunks_copied > 0, "{s:?}");
    // A run's e-mail chunk: the source's plain pages copied between pages encoded anew, no
    // dictionary page.
    let mut mixed = 0;
    for path in bases.keys() {
        let file = rig.store.get_bytes(path).await.unwrap().bytes;
        for c in column_pages(&file, "email") {
            let copied = c.pages.iter().filter(|p| emails.contains(*p)).count();
            if !c.dictionary && copied > 0 && copied < c.pages.len() {
                mixed += 1;
            }
        }
    }
    assert!(mixed > 0, "no e-mail chunk mixes copied and new pages");
    // Inserts, deletes and updates, and every base rewritten again.
    for _ in 0..300 {
        rig.writer.random_op(&mut r).await;
    }
    rig.flush().await;
    let s = compact(&rig, &opts(&rig, target, 0.0, 32)).await;
    assert_eq!(s.outcome, Outcome::Done, "{s:?}");
    assert_base_tier(&rig, target).await;
    let live = rig.writer.rows.values().filter(|m| !m.soft_deleted).count();
    assert_eq!(rig.assert_oracle().await, (live, 0));
}

/// A column chunk of a lake file, as its pages lie.
struct ChunkPages {
    /// Whether it has a dictionary page.
    dictionary: bool,
    /// Its row group's rows.
    rows: i64,
    /// The first row of each data page.
    starts: Vec<i64>,
    /// The bytes of each data page.
    pages: Vec<bytes::Bytes>,
}

/// Column `name`'s chunks in a lake file, one per row group.
fn column_pages(file: &bytes::Bytes, name: &str) -> Vec<ChunkPages> {
    let options = ReadOptionsBuilder::new().with_page_index().build();
    let reader = SerializedFileReader::new_with_options(file.clone(), options).unwrap();
    let meta = reader.metadata();
    let leaf = meta
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .position(|c| c.name() == name)
        .unwrap();
    let index = meta.offset_index().unwrap();
    meta.row_groups()
        .iter()
        .enumerate()
        .map(|(rg, group)| {
            let locations = &index[rg][leaf].page_locations;
            ChunkPages {
                dictionary: group.column(leaf).dictionary_page_offset().is_some(),
                rows: group.num_rows(),
                starts: locations.iter().map(|p| p.first_row_index).collect(),
                pages: locations
                    .iter()
                    .map(|p| {
                        let at = p.offset as usize;
                        file.slice(at..at + p.compressed_page_size as usize)
                    })
                    .collect(),
            }
        })
        .collect()
}

/// Any one upload of a pass with several outputs failing, and the splice failing: the
/// manifest is unchanged, the outputs staged before the failure are deleted, and a clean
/// rerun converges to the same state.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_output_or_splice_publishes_nothing_and_a_rerun_converges() {
    let (mut rig, mut r) = lake_from_init(2104, 300, 300).await;
    for _ in 0..60 {
        rig.writer.random_op(&mut r).await;
    }
    rig.flush().await;
    let target = 32 * 1024;
    let cases = [
        (Op::PutFile, 1, "upload merged base"),
        (Op::PutFile, 3, "upload merged base"),
        (Op::GetRange, 5, "read compaction source"),
        (Op::PutBytes, 1, "manifest"),
    ];
    for (op, nth, step) in cases {
        let what = format!("{op:?} #{nth}");
        let manifest_before = rig.store.get_bytes(MANIFEST).await.unwrap().bytes;
        let state = oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
        let objects: BTreeSet<String> = rig.keys("data/100/").await.into_iter().collect();
        let key = match op {
            Op::PutBytes => Some("manifest/"),
            _ => None,
        };
        rig.store.arm(op, key, nth, Action::Fail);
        let s = compact(&rig, &whole_groups(opts(&rig, target, 0.0, 32))).await;
        assert_eq!(s.outcome, Outcome::Failed, "{what}: {s:?}");
        let err = s.error.clone().unwrap();
        assert!(err.contains("injected fault"), "{what}: {err}");
        assert!(err.to_lowercase().contains(step), "{what}: {err}");
        assert_eq!(
            rig.store.get_bytes(MANIFEST).await.unwrap().bytes,
            manifest_before,
            "{what}: the manifest changed"
        );
        let now: BTreeSet<String> = rig.keys("data/100/").await.into_iter().collect();
        let left: Vec<&String> = now.difference(&objects).collect();
        if op == Op::PutBytes {
            // An unanswered save may have landed: its outputs stay, named, for gc.
            assert!(!left.is_empty(), "{what}");
            for k in &left {
                assert!(err.contains(k.as_str()), "{what}: {k} not named in {err}");
            }
        } else {
            assert!(
                left.is_empty(),
                "{what}: staged outputs left behind: {left:?}"
            );
        }
        assert_eq!(
            oracle::lake_state(rig.store.as_ref(), MANIFEST).await,
            state
        );
    }
    let s = compact(&rig, &whole_groups(opts(&rig, target, 0.0, 32))).await;
    assert_eq!(s.outcome, Outcome::Done, "{s:?}");
    assert!(s.files_out >= 3, "{s:?}");
    assert_base_tier(&rig, target).await;
    let live = rig.writer.rows.values().filter(|m| !m.soft_deleted).count();
    assert_eq!(rig.assert_oracle().await, (live, 0));
}

/// The consolidated delta goes to the store while it is written, never to local disk
/// (docs/design.md §9). Its upload refused, its upload landed then reported failed, and a
/// merged base's upload failing while it is under way: each time the manifest is unchanged
/// and nothing of the pass is left in the store (no object, no unfinished upload); a clean
/// rerun rewrites the dirty base, folds the other changes into one delta and converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_streamed_delta_publishes_nothing_and_leaves_nothing() {
    let (mut rig, mut r) = lake_from_init(2106, 200, 20).await;
    // Its bases (a few KiB) are not small for this target, which would merge them all.
    let target = 24 << 10;
    let before = assert_base_tier(&rig, target).await;
    let n = before.len();
    let bases: Vec<&Value> = before.values().collect();
    // Three changes in one base (past the ratio), one in each of two others (below it).
    for (f, changes) in [(bases[2], 3), (bases[5], 1), (bases[7], 1)] {
        let ids = rows_in(&rig, id(&f["row_id_min"]), id(&f["row_id_max"]));
        for id in ids.iter().take(changes) {
            rig.writer.update(*id, Customer::random(&mut r)).await;
        }
    }
    rig.flush().await;
    let cases = [
        (Op::PutParts, Action::Fail, "upload consolidated delta"),
        (Op::PutParts, Action::FailAfter, "upload consolidated delta"),
        (Op::PutFile, Action::Fail, "upload merged base"),
    ];
    for (op, action, step) in cases {
        let what = format!("{op:?} {action:?}");
        let manifest_before = rig.store.get_bytes(MANIFEST).await.unwrap().bytes;
        let objects = rig.keys("data/100/").await;
        let calls = rig.store.calls().len();
        rig.store.arm(op, None, 1, action);
        let s = compact(&rig, &opts(&rig, target, 0.1, 32)).await;
        assert_eq!(s.outcome, Outcome::Failed, "{what}: {s:?}");
        let err = s.error.clone().unwrap();
        assert!(err.contains("injected fault"), "{what}: {err}");
        assert!(err.contains(step), "{what}: {err}");
        // The pass did stream a delta.
        assert!(
            rig.store.calls()[calls..]
                .iter()
                .any(|c| c.op == Op::PutParts && c.key.starts_with("data/100/")),
            "{what}"
        );
        assert_eq!(
            rig.store.get_bytes(MANIFEST).await.unwrap().bytes,
            manifest_before,
            "{what}: the manifest changed"
        );
        assert_eq!(rig.keys("data/100/").await, objects, "{what}: objects left");
        assert_eq!(
            rig.store.abandoned_writes("data/100/").await.unwrap(),
            vec![],
            "{what}: an unfinished upload left"
        );
    }
    let s = compact(&rig, &opts(&rig, target, 0.1, 32)).await;
    assert_eq!(s.outcome, Outcome::Done, "{s:?}");
    assert_eq!((s.bases_rewritten, s.bases_kept), (1, n - 1), "{s:?}");
    let deltas = files(&manifest(&rig).await, "delta");
    assert_eq!(deltas.len(), 1, "{deltas:?}");
    assert_eq!(deltas[0]["row_count"], 2, "{deltas:?}");
    let listed = deltas[0]["path"].as_str().unwrap();
    let stored = rig.store.get_bytes(listed).await.unwrap().bytes;
    assert_eq!(deltas[0]["size_bytes"], stored.len() as u64);
    assert_eq!(
        deltas[0]["checksum"],
        format!("sha256:{}", hex::encode(lakecdc::store::sha256(&stored)))
    );
    assert_base_tier(&rig, target).await;
    let live = rig.writer.rows.values().filter(|m| !m.soft_deleted).count();
    assert_eq!(rig.assert_oracle().await, (live, 0));
    // A pass that only consolidates deltas writes nothing to local disk.
    for f in [bases[4], bases[6]] {
        let ids = rows_in(&rig, id(&f["row_id_min"]), id(&f["row_id_max"]));
        rig.writer.update(ids[1], Customer::random(&mut r)).await;
        rig.flush().await;
    }
    let s = compact(&rig, &opts(&rig, target, 0.5, 1)).await;
    assert_eq!(s.outcome, Outcome::Done, "{s:?}");
    assert_eq!(s.plan.clone().unwrap().decision, Decision::Consolidate);
    assert_eq!((s.bases_rewritten, s.scratch_peak_bytes), (0, 0), "{s:?}");
    let deltas = files(&manifest(&rig).await, "delta");
    assert_eq!(deltas.len(), 1, "{deltas:?}");
    assert_eq!(deltas[0]["row_count"], 4, "{deltas:?}");
    let live = rig.writer.rows.values().filter(|m| !m.soft_deleted).count();
    assert_eq!(rig.assert_oracle().await, (live, 0));
}
