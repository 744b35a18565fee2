//! `lakecdc requeue` through the binary (docs/design.md §10): rows chosen by `--row-id`,
//! `--ids-from` and `--where` are re-exported by the next flush — exactly those rows, at new
//! versions, with their values unchanged; `--dry-run` changes nothing; an id the source never
//! held is reported and exits 3; choosing rows two ways is a usage error.

use std::collections::{BTreeMap, BTreeSet};

use uuid::Uuid;

use crate::support::harness;
use crate::support::oracle;
use crate::support::rig::{LakeKind, Rig, rig};
use crate::support::writer::Rng;

fn requeue(rig: &Rig, args: &[&str]) -> (i32, String, String) {
    // A local rig's lake (its copies give the floors); an S3 rig's is not named, so its
    // requeues see no lake.
    let lake = rig.work.path().join("lake");
    let lake = if lake.is_dir() {
        lake
    } else {
        rig.work.path().to_path_buf()
    };
    let out = harness::bin()
        .args(["requeue", "--schema", "customer", "--lake"])
        .arg(lake)
        .args(args)
        .env("DATABASE_URL", &rig.db.url)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn versions(rig: &Rig) -> BTreeMap<Uuid, i64> {
    rig.writer
        .client
        .query(
            "SELECT ltbase_row_id, ltbase_updated_at FROM entity_main WHERE ltbase_schema_id = 100",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test]
async fn requeued_rows_and_only_they_are_re_exported_at_new_versions() {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(4401);
    let ids = rig.seed(60, &mut r).await;
    assert!(!rig.flush().await.failed());
    let before = versions(&rig).await;

    // --row-id, repeatable and comma-separated.
    let by_id = [ids[0], ids[1], ids[2]];
    // --ids-from: a file with a comment and a blank line.
    let by_file = [ids[10], ids[11]];
    let file = rig.work.path().join("ids.txt");
    std::fs::write(
        &file,
        format!(
            "# rows to re-export\n{}\n\n{}  # and this one\n",
            by_file[0], by_file[1]
        ),
    )
    .unwrap();
    // --where: every entity row with one row's name.
    let name = rig
        .writer
        .rows
        .values()
        .find_map(|m| m.value.name.clone().filter(|n| !n.contains('\'')))
        .unwrap();
    let by_where: BTreeSet<Uuid> = rig
        .writer
        .rows
        .iter()
        .filter(|(_, m)| m.value.name.as_ref() == Some(&name))
        .map(|(id, _)| *id)
        .collect();
    let predicate = format!("text_01 = '{name}'");

    // A dry run lists and changes nothing.
    let (code, out, err) = requeue(
        &rig,
        &[
            "--dry-run",
            "--row-id",
            &format!("{},{}", by_id[0], by_id[1]),
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("would requeue 2 of 2"), "{out}");
    assert!(oracle::dirty(&rig.writer).await.is_empty());
    assert_eq!(versions(&rig).await, before);

    let a = format!("{},{}", by_id[0], by_id[1]);
    let b = by_id[2].to_string();
    for args in [
        vec!["--row-id", &a, "--row-id", &b],
        vec!["--ids-from", file.to_str().unwrap()],
        vec!["--where", &predicate],
    ] {
        let (code, out, err) = requeue(&rig, &args);
        assert_eq!(code, 0, "{args:?}: {out}{err}");
        assert!(out.starts_with("requeued"), "{out}");
    }
    let chosen: BTreeSet<Uuid> = by_id
        .iter()
        .chain(&by_file)
        .copied()
        .chain(by_where.iter().copied())
        .collect();
    assert_eq!(oracle::dirty(&rig.writer).await, chosen);
    // Versions bumped for exactly the chosen rows.
    let after = versions(&rig).await;
    for (id, v) in &after {
        if chosen.contains(id) {
            assert!(*v > before[id], "{id}: not bumped");
            rig.writer.rows.get_mut(id).unwrap().version = *v;
        } else {
            assert_eq!(*v, before[id], "{id}: touched");
        }
    }
    // The next flush writes exactly those rows, at their new versions, values unchanged.
    let listed: BTreeSet<String> = rig.listed().await.into_iter().collect();
    let report = rig.flush().await;
    assert_eq!(report.schemas[0].rows_marked as usize, chosen.len());
    let mut exported = BTreeMap::new();
    for path in rig.listed().await.iter().filter(|p| !listed.contains(*p)) {
        let bytes = lakecdc::store::ObjectStore::get_bytes(rig.store.as_ref(), path)
            .await
            .unwrap()
            .bytes;
        exported.extend(oracle::read_parquet(bytes));
    }
    assert_eq!(exported.keys().copied().collect::<BTreeSet<_>>(), chosen);
    for (id, row) in &exported {
        assert_eq!(row.changed_at, after[id], "{id}");
    }
    rig.assert_oracle().await;

    // An id the source never held is reported, not requeued.
    let stranger = Uuid::new_v4().to_string();
    let (code, out, _) = requeue(&rig, &["--row-id", &stranger]);
    assert_eq!(code, 3, "{out}");
    assert!(
        out.contains("1 unknown") && out.contains(&stranger),
        "{out}"
    );
    assert!(oracle::dirty(&rig.writer).await.is_empty());
    // Two ways of choosing at once: a usage error, one line.
    let (code, _, err) = requeue(&rig, &["--row-id", &b, "--where", "true"]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    // A predicate that closes its parenthesis still sees this schema's rows only (another
    // schema's row is in the table); columns may be qualified by the table's name.
    rig.writer
        .client
        .execute(
            "INSERT INTO entity_main (ltbase_schema_id, ltbase_row_id, ltbase_created_at, ltbase_updated_at) \
             VALUES (101, $1, 1, 1)",
            &[&Uuid::new_v4()],
        )
        .await
        .unwrap();
    let all = rig.writer.rows.len();
    for predicate in [
        "true) OR (true",
        "entity_main.ltbase_schema_id <> 100 OR true",
    ] {
        let (code, out, err) = requeue(&rig, &["--dry-run", "--where", predicate]);
        assert_eq!(code, 0, "{predicate}: {out}{err}");
        assert!(
            out.contains(&format!("would requeue {all} of {all} chosen rows")),
            "{predicate}: {out}"
        );
    }
    // A predicate the source cannot run is the user's input, as a query's SQL is: exit 2,
    // one line with the server's message.
    for predicate in ["nope = 1", "ltbase_row_id = 'x'", "true AND AND"] {
        let (code, _, err) = requeue(&rig, &["--dry-run", "--where", predicate]);
        assert_eq!(code, 2, "{predicate}: {err}");
        assert!(
            err.contains("--where cannot be run by the source: "),
            "{err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
}

#[tokio::test]
async fn a_row_made_again_while_it_is_requeued_keeps_the_applications_slot() {
    // docs/hazards.md L91: requeue found the row absent, then the application made it again
    // before requeue wrote: the tombstone overwrote the application's live slot (at a lower
    // version), and the next flush deleted a live row from the lake.
    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(4491);
    let ids = rig.seed(10, &mut r).await;
    let gone = ids[3];
    rig.writer.hard_delete(gone).await;
    assert!(!rig.flush().await.failed());
    assert!(
        !oracle::lake_state(rig.store.as_ref(), "manifest/100.json")
            .await
            .contains_key(&gone)
    );
    // The application makes it again, in a transaction still open while requeue runs.
    let mut app = harness::pg_client(&rig.db.url).await;
    let tx = app.transaction().await.unwrap();
    let version = next_version(&tx, gone).await;
    tx.execute(
        "INSERT INTO entity_main (ltbase_schema_id, ltbase_row_id, ltbase_created_at, ltbase_updated_at, text_01) \
         VALUES (100, $1, $2, $2, 'made again')",
        &[&gone, &version],
    )
    .await
    .unwrap();
    tx.execute(
        "INSERT INTO change_log (schema_id, row_id, flushed_at, changed_at) VALUES (100, $1, 0, $2)",
        &[&gone, &version],
    )
    .await
    .unwrap();
    let out = requeue_while_open(&rig, gone, tx, "INSERT INTO%change_log%").await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("requeued 0 of 1")
            && stdout.contains("1 written by the application meanwhile"),
        "{stdout}"
    );
    assert_eq!(dirty_slot(&rig, gone).await, (version, None));
    assert!(!rig.flush().await.failed());
    let lake = oracle::lake_state(rig.store.as_ref(), "manifest/100.json").await;
    assert_eq!(lake.get(&gone).map(|r| r.changed_at), Some(version));
}

/// The version the application's next write of `id` takes (the writer contract).
async fn next_version(tx: &tokio_postgres::Transaction<'_>, id: Uuid) -> i64 {
    tx.query_one(
        "SELECT GREATEST((extract(epoch FROM clock_timestamp()) * 1000)::int8, max(changed_at) + 1) \
         FROM change_log WHERE schema_id = 100 AND row_id = $1",
        &[&id],
    )
    .await
    .unwrap()
    .get(0)
}

/// `id`'s dirty slot: (changed_at, deleted_at).
async fn dirty_slot(rig: &Rig, id: Uuid) -> (i64, Option<i64>) {
    let slot = rig
        .writer
        .client
        .query_one(
            "SELECT changed_at, deleted_at FROM change_log WHERE schema_id = 100 AND row_id = $1 AND flushed_at = 0",
            &[&id],
        )
        .await
        .unwrap();
    (slot.get(0), slot.get(1))
}

/// Runs `requeue --row-id id` while the application's transaction `tx` is open, waits until
/// requeue's statement like `waits_in` waits on a lock `tx` holds, then commits `tx`.
async fn requeue_while_open(
    rig: &Rig,
    id: Uuid,
    tx: tokio_postgres::Transaction<'_>,
    waits_in: &str,
) -> std::process::Output {
    let run = {
        let (lake, url, id) = (
            rig.work.path().to_path_buf(),
            rig.db.url.clone(),
            id.to_string(),
        );
        std::thread::spawn(move || {
            harness::bin()
                .args(["requeue", "--schema", "customer", "--row-id", &id, "--lake"])
                .arg(lake)
                .env("DATABASE_URL", url)
                .output()
                .unwrap()
        })
    };
    let watch = harness::pg_client(&rig.db.url).await;
    let mut waited = false;
    for _ in 0..600 {
        let n: i64 = watch
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1",
                &[&waits_in],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            waited = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        waited,
        "requeue never waited on the application's transaction"
    );
    tx.commit().await.unwrap();
    run.join().unwrap()
}

#[tokio::test]
async fn a_row_deleted_while_it_is_requeued_is_left_to_the_applications_tombstone() {
    // A requeue failed ("a row was deleted meanwhile"), and one of more than a chunk ended
    // half done, whenever the application deleted a chosen row while it ran.
    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(4492);
    let ids = rig.seed(10, &mut r).await;
    assert!(!rig.flush().await.failed());
    let (id, other) = (ids[5], ids[6]);
    let mut app = harness::pg_client(&rig.db.url).await;
    let tx = app.transaction().await.unwrap();
    let version = next_version(&tx, id).await;
    for sql in [
        "DELETE FROM entity_main WHERE ltbase_schema_id = 100 AND ltbase_row_id = $1",
        "DELETE FROM eav_data WHERE schema_id = 100 AND row_id = $1",
    ] {
        tx.execute(sql, &[&id]).await.unwrap();
    }
    tx.execute(
        "INSERT INTO change_log (schema_id, row_id, flushed_at, changed_at, deleted_at) VALUES (100, $1, 0, $2, $2)",
        &[&id, &version],
    )
    .await
    .unwrap();
    let out = requeue_while_open(&rig, id, tx, "WITH ids AS%UPDATE%entity_main%").await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("1 written by the application meanwhile"),
        "{stdout}"
    );
    assert_eq!(dirty_slot(&rig, id).await, (version, Some(version)));
    assert!(!rig.flush().await.failed());
    let lake = oracle::lake_state(rig.store.as_ref(), "manifest/100.json").await;
    assert!(!lake.contains_key(&id) && lake.contains_key(&other));
}

#[tokio::test]
async fn a_row_only_the_lake_holds_is_requeued_as_a_tombstone_above_its_copy() {
    // docs/hazards.md L98: a row deleted from the source together with its change_log history
    // was "unknown" to requeue (exit 3), so only verify --source --repair could remove it.
    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(4493);
    let ids = rig.seed(10, &mut r).await;
    assert!(!rig.flush().await.failed());
    let id = ids[4];
    for sql in [
        "DELETE FROM entity_main WHERE ltbase_schema_id = 100 AND ltbase_row_id = $1",
        "DELETE FROM eav_data WHERE schema_id = 100 AND row_id = $1",
        "DELETE FROM change_log WHERE schema_id = 100 AND row_id = $1",
    ] {
        rig.writer.client.execute(sql, &[&id]).await.unwrap();
    }
    let before = oracle::lake_state(rig.store.as_ref(), "manifest/100.json").await;
    let copy = before[&id].changed_at;
    let (code, out, err) = requeue(&rig, &["--row-id", &id.to_string()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("1 as tombstones"), "{out}");
    let v: i64 = rig
        .writer
        .client
        .query_one(
            "SELECT changed_at FROM change_log WHERE schema_id = 100 AND row_id = $1 AND flushed_at = 0 AND deleted_at IS NOT NULL",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(v > copy, "{v} <= {copy}");
    assert!(!rig.flush().await.failed());
    let lake = oracle::lake_state(rig.store.as_ref(), "manifest/100.json").await;
    assert!(!lake.contains_key(&id));
    assert_eq!(lake.len(), before.len() - 1);
}

#[tokio::test]
async fn a_stop_request_ends_a_slow_where_selection_and_its_statement() {
    // A slow --where predicate held the run (and a SIGTERM) until the statement timeout.
    let mut rig = rig(LakeKind::Local).await;
    let mut r = Rng::new(4494);
    rig.seed(3, &mut r).await;
    assert!(!rig.flush().await.failed());
    let mut child = harness::bin()
        .args([
            "requeue",
            "--schema",
            "customer",
            "--where",
            "pg_sleep(60) IS NOT NULL",
            "--lake",
        ])
        .arg(rig.work.path())
        .env("DATABASE_URL", &rig.db.url)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let sleeping = || async {
        let n: i64 = rig
            .writer
            .client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(60)%' AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        n
    };
    for _ in 0..200 {
        if sleeping().await > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(sleeping().await, 1, "the selection never started");
    let term = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("a stop request did not end the selection");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_ne!(status.code(), Some(0));
    // The server ends the statement once its client is gone (client_connection_check_interval).
    for _ in 0..100 {
        if sleeping().await == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        sleeping().await,
        0,
        "the selection still runs on the server"
    );
    assert!(oracle::dirty(&rig.writer).await.is_empty());
}
