//! SIGKILLs at random moments (docs/hazards.md L63), and the database or the S3 server cutting
//! the runs off (L68, L69): the binary's flush (of a schema and of table
//! sources), ranged compaction, init, gc and `verify --source --repair` are killed, alone or a
//! flush and a compaction at once, at a random point of their run, between random writes to an
//! entity schema and to tables with a uuid, a bigint and a composite key, made before and while
//! the jobs run. Whatever was cut short,
//! the next flush catches up and the lake then equals PostgreSQL (the schema by its model, each
//! table typed through `query`), every listed file is intact, gc finds no loss and leaves only
//! listed objects and no unfinished write, no scratch directory is left, and a full compaction
//! keeps it all.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lakecdc::store::ObjectStore;

use crate::support::harness;
use crate::support::oracle;
use crate::support::proxy::Proxy;
use crate::support::rig::{LakeKind, Rig, rig};
use crate::support::writer::Rng;
use crate::table_source::{
    TABLES, assert_equal, attach, create_sql, insert_sql, random_statement, touches_pending,
};

const MANIFEST: &str = "manifest/100.json";
const ROUNDS: usize = 50;

/// The binary on the rig's database and lake (an S3 bucket or a local directory).
fn command(rig: &Rig, args: &[String]) -> std::process::Command {
    command_via(rig, args, &harness::s3_endpoint())
}

/// [`command`], reaching an S3 lake through `endpoint`.
fn command_via(rig: &Rig, args: &[String], endpoint: &str) -> std::process::Command {
    let described = rig.store.describe();
    let mut cmd = harness::bin();
    cmd.args(args).args(["-q", "--pg-url", &rig.db.url]);
    match described.strip_prefix("s3://") {
        Some(bucket) => cmd
            .args(["--lake", &format!("s3://{}", bucket.trim_end_matches('/'))])
            .args(["--s3-path-style", "--s3-endpoint", endpoint]),
        None => cmd.args(["--lake", &described]),
    };
    cmd.arg("--schema-dir")
        .arg(harness::examples_dir())
        .stdout(std::process::Stdio::null());
    cmd
}

/// The files under `dir` (relative names) and their sizes.
fn walkdir(dir: &std::path::Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if m.is_dir() {
            out.extend(
                walkdir(&e.path())
                    .into_iter()
                    .map(|(f, len)| (format!("{name}/{f}"), len)),
            );
        } else {
            out.push((name, m.len()));
        }
    }
    out
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

/// A job of the random phase: its kind (which keys the learnt run length) and arguments.
fn random_job(r: &mut Rng, work: &std::path::Path) -> Vec<(&'static str, Vec<String>)> {
    let work = work.display().to_string();
    let flush = (
        "flush",
        words(&format!("flush --force --batch-size 9 --work-dir {work}")),
    );
    let compact = |r: &mut Rng| {
        let ratio = ["0", "0.05", "0.5"][r.below(3) as usize];
        (
            "compact",
            words(&format!(
                "compact --max-deltas 1 --dirty-ratio {ratio} --target-base-size 8KiB --work-dir {work}"
            )),
        )
    };
    // A flush in heap passes (docs/design.md §4.1): killed in its scan, its spill or its drain.
    let heap_flush = (
        "flush in heap passes",
        words(&format!(
            "flush --force --batch-size 9 --read-order heap --work-dir {work}"
        )),
    );
    match r.below(100) {
        0..=17 => vec![flush],
        18..=29 => vec![heap_flush],
        30..=41 => vec![(
            "flush one table",
            words(&format!(
                "flush --force --schema t_comp --batch-size 25 --work-dir {work}"
            )),
        )],
        42..=59 => vec![compact(r)],
        60..=71 => vec![flush, compact(r)],
        72..=81 => {
            let source = ["customer", "t_uuid", "t_big", "t_comp"][r.below(4) as usize];
            vec![(
                "init",
                words(&format!(
                    "init --schema {source} --replace-delta --max-file-rows 25 --page-rows 11 --work-dir {work}"
                )),
            )]
        }
        // Young orphans wait out the grace: this gc settles, records sightings and deletes
        // retired files past it, which a kill may cut short too.
        82..=91 => vec![("gc", words("gc --grace 10m"))],
        _ => vec![(
            "verify --source --repair",
            words(&format!("verify --source --repair --work-dir {work}")),
        )],
    }
}

/// The sessions of lakecdc's runs on the test's database (`FROM … WHERE …`).
const RUNS_SESSIONS: &str = "FROM pg_stat_activity WHERE datname = current_database() \
     AND application_name = 'lakecdc' AND pid <> pg_backend_pid()";

/// Waits (at most 30 s) until no session of a killed run is left on the database. A killed
/// run's backend may still be finishing a statement, and so still hold its source's lock, when
/// the next run starts; that run would find the source locked and skip it (an error line, not a
/// loss), which the rounds below count as a failure of a run that ran alone.
async fn until_killed_sessions_end(client: &tokio_postgres::Client) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left: i64 = client
            .query_one(&format!("SELECT count(*) {RUNS_SESSIONS}"), &[])
            .await
            .unwrap()
            .get(0);
        if left == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{left} sessions of killed runs linger"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `cmd` to its end; its stderr on failure.
fn run_to_end(rig: &Rig, args: &str) {
    let out = command(rig, &words(args)).output().unwrap();
    assert!(
        out.status.success(),
        "lakecdc {args}: exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The schema's and every table's lake equal PostgreSQL, nothing is pending, and every listed
/// file's bytes match its recorded hash.
async fn assert_lake_equals_postgres(rig: &Rig, when: &str) {
    let (compared, dirty) = oracle::assert_matches(&rig.writer, rig.store.as_ref(), MANIFEST).await;
    assert_eq!(dirty, 0, "{when}: the schema has dirty rows");
    assert!(compared > 0, "{when}");
    for t in &TABLES {
        assert_equal(rig, t, when).await;
    }
    assert_eq!(touches_pending(&rig.writer.client).await, 0, "{when}");
    run_to_end(rig, "verify");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkills_at_random_moments_lose_nothing() {
    kills_lose_nothing(LakeKind::S3, Cut::Sigkill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkills_at_random_moments_lose_nothing_in_a_local_lake() {
    kills_lose_nothing(LakeKind::Local, Cut::Sigkill).await;
}

/// The database ends the runs' sessions at random moments (`pg_terminate_backend`, as an
/// administrator, a failover or a pooler would): each run ends by itself with an error line and
/// an exit code, never a hang or a panic, removes its own scratch directory, and leaves nothing
/// the next runs cannot put right (docs/hazards.md L68).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_ended_by_the_database_at_random_moments_lose_nothing() {
    kills_lose_nothing(LakeKind::S3, Cut::Sessions).await;
}

/// The S3 server goes away at random moments, as in a crash and restart: every connection is
/// cut mid-request (an upload, a copy, a manifest save, a download) and new ones are turned
/// away for 0.5–4 s, longer than the client's retries last. Each run rides it out or ends by
/// itself with an error line and an exit code, never a hang or a panic, removes its own
/// scratch directory, and leaves nothing the next runs cannot put right (docs/hazards.md L69).
///
/// LAKECDC_CRASH_SEED varies the moments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_object_store_cut_off_at_random_moments_loses_nothing() {
    kills_lose_nothing(LakeKind::S3, Cut::Store).await;
}

/// How a round cuts its runs short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// SIGKILL the process: no cleanup at all.
    Sigkill,
    /// End every lakecdc session on the database; the process carries on by itself.
    Sessions,
    /// Cut the runs off the S3 server for a while; the processes carry on by themselves.
    Store,
}

/// A run that ended by itself after its sessions were ended must end in at most this (its
/// flushes run with a 5 s time budget).
const ENDS_WITHIN: Duration = Duration::from_secs(60);

/// Ends every session of lakecdc's runs on the database; how many there were.
async fn end_sessions(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one(
            &format!("SELECT count(pg_terminate_backend(pid)) {RUNS_SESSIONS}"),
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

async fn kills_lose_nothing(kind: LakeKind, cut: Cut) {
    let mut rig = rig(kind).await;
    // A Store cut's runs reach the S3 server through a proxy that cuts them off; the other
    // cuts' runs reach it directly, as before.
    let proxy = Proxy::start(&harness::s3_endpoint()).await;
    let endpoint = match cut {
        Cut::Store => proxy.url.clone(),
        Cut::Sigkill | Cut::Sessions => harness::s3_endpoint(),
    };
    let work = rig.work.path().join("runs");
    std::fs::create_dir(&work).unwrap();
    let client = rig.db.client().await;
    // LAKECDC_CRASH_SEED replays another sequence of writes, jobs and kill moments.
    let seed = std::env::var("LAKECDC_CRASH_SEED").map_or(63, |s| s.parse().unwrap());
    let mut r = Rng::new(seed);
    rig.seed(60, &mut r).await;
    for (i, t) in TABLES.iter().enumerate() {
        client.batch_execute(&create_sql(t)).await.unwrap();
        client
            .batch_execute(&insert_sql(t, &(t.new_key)("g"), 1, 40, 7 + i as u64))
            .await
            .unwrap();
        attach(&rig, t.name);
    }
    // The lake starts equal to PostgreSQL: what is in the tables from before the attach is
    // exported by init, so that `verify --source` finds nothing but what a kill could cause.
    run_to_end(&rig, &format!("init --work-dir {}", work.display()));
    run_to_end(
        &rig,
        &format!("flush --force --work-dir {}", work.display()),
    );
    assert_lake_equals_postgres(&rig, "before the kills").await;
    // Each kind of job runs once to its end first, which gives its length; later ones are
    // killed at a uniformly random moment within 1.2 times the median length of its whole runs
    // (at most 3 s: a flush of a backlog built while it runs can take far longer).
    // The scratch directories in the work dir: a killed run's, until a later run sweeps it.
    let left_over = || -> Vec<String> {
        std::fs::read_dir(&work)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("lakecdc-"))
            .collect()
    };
    let mut rounds_leaving_scratch = 0;
    // Each kind's whole runs' lengths; a kill moment comes from their median, which one slow
    // run (a compaction waiting on a flush) does not move.
    let mut lengths: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
    let median = |runs: &Vec<Duration>| {
        let mut sorted = runs.clone();
        sorted.sort_unstable();
        sorted[sorted.len() / 2]
    };
    let mut next = 1_000;
    let (mut killed, mut finished) = (0, 0);
    // The error line of each run cut short by the database (a sample of what an operator sees).
    let mut errors = std::collections::BTreeSet::new();
    // Runs cut short by the database that failed with an error line.
    let mut cut_failed = 0usize;
    let mut stalled = 0usize;
    for round in 0..ROUNDS {
        for _ in 0..4 {
            rig.writer.random_op(&mut r).await;
        }
        for t in &TABLES {
            for _ in 0..2 {
                random_statement(&client, t, &mut r, &mut next).await;
            }
        }
        let mut jobs = random_job(&mut r, &work);
        if cut != Cut::Sigkill {
            // A run cut off goes on with the schemas it has not reached (on new sessions, or
            // once the S3 server is back), and a flush chases the writes below for its whole time budget
            // (50 s by default, per schema): a shorter one keeps its end within ENDS_WITHIN.
            for (_, args) in &mut jobs {
                if args[0] == "flush" {
                    args.extend(words("--time-budget 5s"));
                }
            }
        }
        until_killed_sessions_end(&client).await;
        // A round's runs start with the S3 server back (a cut's outage may outlast its run).
        proxy.until_up().await;
        let start = Instant::now();
        let mut children = Vec::new();
        for (kind, args) in &jobs {
            let log = work.join(format!("round-{round}-{}.stderr", kind.replace(' ', "-")));
            let mut child = command_via(&rig, args, &endpoint);
            if cut == Cut::Store {
                // Each S3 attempt in the run's log, to show what a run that outlives
                // ENDS_WITHIN waits for (docs/operations.md, Logging).
                child.env("LAKECDC_LOG", "warn,lakecdc::store::s3=debug");
            }
            let child = child
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap();
            let kill_at = lengths.get(kind).map(|runs| {
                median(runs)
                    .min(Duration::from_secs(3))
                    .mul_f64(1.2 * (r.below(1000) as f64) / 1000.0)
            });
            children.push((*kind, child, kill_at, log, None::<(Instant, i64)>));
        }
        // The application keeps writing while the jobs run (a write every few milliseconds
        // of the run): commits land before, during and after each job's snapshot and mark.
        let mut running: Vec<_> = children.into_iter().map(Some).collect();
        while running.iter().any(Option::is_some) {
            for slot in &mut running {
                let Some((kind, child, kill_at, log, ended_at)) = slot else {
                    continue;
                };
                let status = if let Some(status) = child.try_wait().unwrap() {
                    Some(status)
                } else if ended_at.is_none() && kill_at.is_some_and(|at| start.elapsed() >= at) {
                    match cut {
                        Cut::Sigkill => {
                            child.kill().unwrap();
                            child.wait().unwrap();
                            None
                        }
                        Cut::Sessions => {
                            // A run between sessions (uploading, merging) has none to end:
                            // the cut waits for its next one, or for its end.
                            let ended = end_sessions(&client).await;
                            if ended > 0 {
                                *ended_at = Some((Instant::now(), ended));
                            }
                            continue;
                        }
                        Cut::Store => {
                            let down = Duration::from_millis(500 + r.below(3500));
                            proxy.cut(down);
                            // One cut, counted as the sessions ended are.
                            *ended_at = Some((Instant::now(), 1));
                            continue;
                        }
                    }
                } else {
                    if let Some((at, _)) = ended_at
                        && at.elapsed() > ENDS_WITHIN
                    {
                        child.kill().unwrap();
                        let stderr = std::fs::read_to_string(log).unwrap();
                        let lines: Vec<&str> = stderr.lines().collect();
                        panic!(
                            "round {round}: lakecdc {kind} still runs {ENDS_WITHIN:?} after it \
                             was cut off; the last lines of its log:\n{}",
                            lines[lines.len().saturating_sub(40)..].join("\n")
                        );
                    }
                    continue;
                };
                match (status, *ended_at) {
                    (None, _) => killed += 1,
                    (Some(status), Some((_, sessions))) => {
                        // Cut short by the database: an exit code and an error line of its
                        // own, never a signal or a panic.
                        killed += usize::from(sessions > 0);
                        let stderr = std::fs::read_to_string(&log).unwrap();
                        // S3 attempts given up on their time limit (a Store cut's runs log
                        // each attempt): a stalled request the run got past.
                        stalled += stderr
                            .lines()
                            .filter(|l| l.contains("s3 request failed") && l.contains("timeout"))
                            .count();
                        assert!(
                            status.code().is_some() && !stderr.contains("panicked"),
                            "round {round}: lakecdc {kind} exited {status}: {stderr}"
                        );
                        // A failed schema's `ERROR … failed` log line, or the run's own
                        // `lakecdc: error:` line.
                        let error_line =
                            |l: &&str| l.contains("ERROR ") || l.contains("lakecdc: error:");
                        if let Some(line) = stderr.lines().find(error_line) {
                            // Without its timestamp.
                            let line = line.split_once(' ').map_or(line, |(_, rest)| rest);
                            errors.insert(format!("{kind} exited {status}: {line}"));
                        }
                        assert!(
                            status.success() || stderr.lines().any(|l| error_line(&l)),
                            "round {round}: lakecdc {kind} exited {status} without an error \
                             line: {stderr}"
                        );
                        cut_failed += usize::from(!status.success());
                    }
                    (Some(status), None) => {
                        finished += 1;
                        lengths.entry(*kind).or_default().push(start.elapsed());
                        // A run alone ends well; a flush and a compaction at once may not (one
                        // waits on or conflicts with the other), which is an error line, not a
                        // loss.
                        assert!(
                            status.success() || jobs.len() > 1,
                            "round {round}: lakecdc {kind} exited {status}: {}",
                            std::fs::read_to_string(log).unwrap()
                        );
                    }
                }
                *slot = None;
            }
            match r.below(10) {
                0 => {
                    rig.writer.random_op(&mut r).await;
                }
                1 => {
                    let t = &TABLES[r.below(TABLES.len() as u64) as usize];
                    random_statement(&client, t, &mut r, &mut next).await;
                }
                _ => tokio::time::sleep(Duration::from_millis(2)).await,
            }
        }
        rounds_leaving_scratch += usize::from(!left_over().is_empty());
    }
    eprintln!(
        "seed {seed}: {killed} runs killed, {finished} ran to their end, {rounds_leaving_scratch} \
         rounds left a scratch directory, {stalled} S3 attempts timed out; median lengths {:?}",
        lengths
            .iter()
            .map(|(kind, runs)| (*kind, median(runs)))
            .collect::<BTreeMap<_, _>>()
    );
    for e in &errors {
        eprintln!("  {e}");
    }
    assert!(killed >= ROUNDS / 2, "{killed} kills in {ROUNDS} rounds");

    match cut {
        // What every killed run left behind, the next runs put right, their scratch
        // directories included (docs/hazards.md L64).
        Cut::Sigkill => assert!(
            rounds_leaving_scratch > 0,
            "no killed run left a scratch directory"
        ),
        // A run that failed by itself removed its own, and the cut runs did fail (with the
        // error lines printed above), not merely outlive the sessions or the outage.
        Cut::Sessions | Cut::Store => {
            assert_eq!(
                rounds_leaving_scratch, 0,
                "a run cut off ({cut:?}) left its scratch directory"
            );
            assert!(
                cut_failed >= 5,
                "only {cut_failed} runs failed when they were cut off ({cut:?})"
            );
        }
    }
    until_killed_sessions_end(&client).await;
    run_to_end(
        &rig,
        &format!("flush --force --work-dir {}", work.display()),
    );
    assert_lake_equals_postgres(&rig, "after the kills and a flush").await;
    run_to_end(&rig, "verify --source");

    // gc finds no loss and leaves only what the manifests list.
    let (clock, gctx, mut gopts) = rig.gc_on_a_manual_clock();
    gopts.schemas.clear();
    // Past the grace and the hour after which unfinished writes are undone.
    for pass in 0..2 {
        let gc = lakecdc::gc::run(&gctx, &gopts).await.unwrap();
        assert_eq!(gc.exit_code(), 0, "gc pass {pass}: {gc:?}");
        clock.advance(61 * 60 * 1000);
    }
    assert_lake_equals_postgres(&rig, "after gc").await;
    for prefix in ["data/", "manifest/"] {
        let unfinished = rig.store.abandoned_writes(prefix).await.unwrap();
        assert!(
            unfinished.is_empty(),
            "unfinished writes after gc: {unfinished:?}"
        );
    }
    let mut listed = std::collections::BTreeSet::new();
    for key in rig.keys("manifest/").await {
        if !key.ends_with(".json") || key.contains(".history/") {
            continue;
        }
        if let Some(m) = oracle::manifest_json(rig.store.as_ref(), &key).await {
            for f in m["files"].as_array().unwrap() {
                listed.insert(f["path"].as_str().unwrap().to_string());
            }
        }
    }
    let stray: Vec<String> = rig
        .keys("data/")
        .await
        .into_iter()
        .filter(|k| !listed.contains(k) && !k.ends_with("/_owner.json"))
        .collect();
    assert!(
        stray.is_empty(),
        "objects no manifest lists after gc: {stray:?}"
    );

    // A full compaction of every source keeps every row.
    run_to_end(
        &rig,
        &format!(
            "compact --max-deltas 0 --dirty-ratio 0 --target-base-size 8KiB --work-dir {}",
            work.display()
        ),
    );
    assert_lake_equals_postgres(&rig, "after a full compaction").await;
    // A run killed in the instant between making its directory and locking it leaves it
    // empty (nothing is staged before the lock), and no sweep may take an unlocked directory
    // for a dead run's: such a leftover holds no byte.
    for name in left_over() {
        let files = walkdir(&work.join(&name));
        assert!(
            files
                .iter()
                .all(|(f, len)| *len == 0 && !f.ends_with(".lakecdc-scratch.lock")),
            "scratch left by a killed run: {name}: {files:?}"
        );
    }
}
