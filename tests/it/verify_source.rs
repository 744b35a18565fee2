//! `verify --source` on PostgreSQL and SeaweedFS (docs/design.md §10): a clean lake with dirty
//! rows present exits 0; each planted divergence — a listed delta dropped from the manifest
//! (missing), a row deleted by SQL without a slot (extra), a slot marked flushed by hand after
//! an update (stale), a value changed without a version bump (values, `--deep` only) — is
//! found and classified, and nothing else; `--repair` + flush make it exit 0 with the oracle
//! holding.

use std::collections::BTreeSet;

use lakecdc::verify::{Outcome, SchemaVerify, SourceOptions, VerifyOptions};
use uuid::Uuid;

use crate::support::rig::{LakeKind, Rig, rig};
use crate::support::writer::{Customer, Rng};

const MANIFEST: &str = "manifest/100.json";

pub fn source_opts(rig: &Rig, deep: bool, repair: bool) -> VerifyOptions {
    VerifyOptions {
        schemas: vec!["customer".into()],
        parallelism: 2,
        work_dir: rig.opts.work_dir.clone(),
        source: Some(SourceOptions {
            deep,
            repair,
            max_ids: 1000,
            // Small pages: the keyset paging runs many times.
            page_rows: 37,
            readers: 2,
        }),
        engine: Default::default(),
    }
}

pub async fn verify_source(rig: &Rig, deep: bool, repair: bool) -> (SchemaVerify, i32) {
    let report = lakecdc::verify::run(&rig.job_context(), &source_opts(rig, deep, repair))
        .await
        .unwrap();
    let code = report.exit_code();
    (report.schemas.into_iter().next().unwrap(), code)
}

fn ids(c: &lakecdc::verify::Class) -> BTreeSet<Uuid> {
    c.ids.iter().map(|s| Uuid::parse_str(s).unwrap()).collect()
}

/// Makes row `id` stale: updated, then its slot marked flushed by hand, so the lake keeps its
/// older copy and nothing will flush the new one.
async fn make_stale(rig: &mut Rig, r: &mut Rng, id: Uuid) {
    rig.writer.update(id, Customer::random(r)).await;
    rig.writer
        .client
        .execute(
            "UPDATE change_log SET flushed_at = 1 WHERE schema_id = 100 AND row_id = $1 AND flushed_at = 0",
            &[&id],
        )
        .await
        .unwrap();
}

/// A lake after random work and several flushes, with some rows left dirty.
pub async fn worked_rig(seed: u64) -> (Rig, Rng) {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(seed);
    rig.seed(150, &mut r).await;
    for _ in 0..3 {
        for _ in 0..40 {
            rig.writer.random_op(&mut r).await;
        }
        assert!(!rig.flush().await.failed());
    }
    for _ in 0..15 {
        rig.writer.random_op(&mut r).await;
    }
    (rig, r)
}

#[tokio::test]
async fn a_clean_lake_with_dirty_rows_verifies_against_its_source() {
    let (rig, _) = worked_rig(71).await;
    let dirty = crate::support::oracle::dirty(&rig.writer).await;
    assert!(!dirty.is_empty(), "the test needs dirty rows");
    // With the schema holding all of the (analysed) table, it is read in heap order by chunks of
    // 4 × 37 rows, sorted and merged; once another schema's rows make it a minority, in row_id
    // order on the primary key. --deep reads init's pages, in row_id order.
    rig.writer
        .client
        .batch_execute("ANALYZE entity_main")
        .await
        .unwrap();
    for (deep, minority, order) in [
        (false, false, "heap"),
        (true, false, "index"),
        (false, true, "index"),
    ] {
        if minority {
            rig.writer
                .client
                .batch_execute(
                    "INSERT INTO entity_main (ltbase_schema_id, ltbase_row_id, ltbase_created_at, ltbase_updated_at) \
                     SELECT 999, gen_random_uuid(), 1, 1 FROM generate_series(1, 3000); ANALYZE entity_main",
                )
                .await
                .unwrap();
        }
        let (s, code) = verify_source(&rig, deep, false).await;
        assert_eq!(s.source.as_ref().unwrap().source_order, order, "{s:?}");
        let c = s.source.as_ref().unwrap();
        assert_eq!((s.outcome, code), (Outcome::Intact, 0), "{s:?}");
        assert_eq!(c.divergent(), 0, "{c:?}");
        assert_eq!(c.dirty_rows, dirty.len() as u64);
        let live = rig.writer.rows.values().filter(|m| !m.soft_deleted).count();
        assert_eq!(c.source_rows, live as u64, "{c:?}");
        // The lake's current state, live rows (the oracle's) and the hard deletes' tombstones
        // apart.
        let live = crate::support::oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
        assert_eq!(c.lake_live, live.len() as u64, "{c:?}");
        assert!(
            c.lake_tombstones > 0,
            "the test needs deleted rows in the lake: {c:?}"
        );
        assert_eq!(c.lake_rows, c.lake_live + c.lake_tombstones, "{c:?}");
        assert!(
            c.to_text().contains(&format!(
                "lake: {} live, {} tombstones",
                c.lake_live, c.lake_tombstones
            )),
            "{}",
            c.to_text()
        );
        assert_eq!(c.values.is_some(), deep);
    }
    // Nothing was written anywhere.
    assert_eq!(crate::support::oracle::dirty(&rig.writer).await, dirty);
}

#[tokio::test]
async fn each_planted_divergence_is_classified_and_repair_puts_it_right() {
    let (mut rig, mut r) = worked_rig(72).await;
    // Read in heap order (sorted runs merged), as a large table is.
    rig.writer
        .client
        .batch_execute("ANALYZE entity_main")
        .await
        .unwrap();
    assert!(!rig.flush().await.failed());
    // Missing: new rows flushed in a delta of their own, which is then dropped from the
    // manifest (as a lost ambiguous save would leave it).
    let before: BTreeSet<String> = rig.listed().await.into_iter().collect();
    let lost = rig.seed(5, &mut r).await;
    assert!(!rig.flush().await.failed());
    let dropped: Vec<String> = rig
        .listed()
        .await
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    assert_eq!(dropped.len(), 1, "{dropped:?}");
    lakecdc::lake::manifest::commit(
        rig.store.as_ref(),
        MANIFEST,
        100,
        &lakecdc::clock::SystemClock,
        Default::default(),
        |m| {
            m.files.retain(|f| f.path != dropped[0]);
            Ok(())
        },
    )
    .await
    .unwrap();
    let live: Vec<Uuid> = rig
        .writer
        .rows
        .iter()
        .filter(|(id, m)| !m.soft_deleted && !lost.contains(id))
        .map(|(id, _)| *id)
        .collect();
    let (extra, stale, tampered) = (live[0], live[1], live[2]);
    // Extra: deleted by SQL, no slot.
    rig.writer
        .client
        .execute(
            "DELETE FROM entity_main WHERE ltbase_schema_id = 100 AND ltbase_row_id = $1",
            &[&extra],
        )
        .await
        .unwrap();
    rig.writer.rows.remove(&extra);
    rig.writer.deleted.push(extra);
    // Stale: updated, then its slot marked flushed by hand.
    make_stale(&mut rig, &mut r, stale).await;
    // Values: changed by SQL, no version bump.
    rig.writer
        .client
        .execute(
            "UPDATE entity_main SET text_01 = 'tampered' WHERE ltbase_schema_id = 100 AND ltbase_row_id = $1",
            &[&tampered],
        )
        .await
        .unwrap();
    rig.writer.rows.get_mut(&tampered).unwrap().value.name = Some("tampered".into());
    // And some honest dirty rows besides, which are not reported.
    for id in &live[3..8] {
        rig.writer.update(*id, Customer::random(&mut r)).await;
    }
    let dirty = crate::support::oracle::dirty(&rig.writer).await;
    let expect = |ids: &[Uuid]| -> BTreeSet<Uuid> {
        ids.iter().filter(|i| !dirty.contains(i)).copied().collect()
    };

    let (shallow, code) = verify_source(&rig, false, false).await;
    let c = shallow.source.as_ref().unwrap();
    assert_eq!((shallow.outcome, code), (Outcome::Diverged, 3), "{c:?}");
    assert_eq!(c.source_order, "heap");
    assert_eq!(ids(&c.missing), expect(&lost), "{c:?}");
    assert_eq!(ids(&c.extra), expect(&[extra]), "{c:?}");
    assert_eq!(ids(&c.stale), expect(&[stale]), "{c:?}");
    assert!(c.values.is_none());
    assert_eq!((c.missing.count, c.extra.count, c.stale.count), (5, 1, 1));

    let (deep, _) = verify_source(&rig, true, false).await;
    let d = deep.source.as_ref().unwrap();
    assert_eq!(
        (ids(&d.missing), ids(&d.extra), ids(&d.stale)),
        (ids(&c.missing), ids(&c.extra), ids(&c.stale))
    );
    assert_eq!(
        ids(d.values.as_ref().unwrap()),
        expect(&[tampered]),
        "{d:?}"
    );

    // Repair, flush, and the lake equals its source again.
    let (repaired, code) = verify_source(&rig, true, true).await;
    assert_eq!(code, 3, "a repair run still reports what it found");
    let requeued = repaired.source.as_ref().unwrap().repaired.clone().unwrap();
    assert_eq!(requeued.count() as u64, d.divergent(), "{requeued:?}");
    assert_eq!(requeued.tombstones, vec![extra]);
    // Requeue bumped versions but never touched values: the model follows the versions.
    let before: Vec<i64> = requeued
        .live
        .iter()
        .map(|id| rig.writer.rows[id].version)
        .collect();
    let after = rig.writer.follow_versions(&requeued.live).await;
    for (id, old) in requeued.live.iter().zip(before) {
        assert!(after[id] > old, "{id}: version bumped");
    }
    assert!(!rig.flush().await.failed());
    let (after, code) = verify_source(&rig, true, false).await;
    assert_eq!((after.outcome, code), (Outcome::Intact, 0), "{after:?}");
    rig.assert_oracle().await;
}

#[tokio::test]
async fn a_repair_whose_lock_session_ends_requeues_nothing_and_a_rerun_does() {
    // docs/hazards.md L68: the database ends the session holding the schema's lock while
    // `verify --source --repair` reads the lake. The comparison is reported, but nothing is
    // requeued — what it found was found under a lock it no longer holds — and the schema fails
    // naming the lost lock. The next run repairs.
    use crate::support::harness;
    use lakecdc::store::fault::Op;
    let (mut rig, mut r) = worked_rig(73).await;
    assert!(!rig.flush().await.failed());
    // Stale: updated, then its slot marked flushed by hand.
    let stale = *rig
        .writer
        .rows
        .iter()
        .find(|(_, m)| !m.soft_deleted)
        .unwrap()
        .0;
    make_stale(&mut rig, &mut r, stale).await;
    let dirty = crate::support::oracle::dirty(&rig.writer).await;
    assert!(!dirty.contains(&stale));

    let (ctx, opts) = (rig.job_context(), source_opts(&rig, false, true));
    let report = harness::with_lock_session_ended(
        &rig.store,
        &rig.db.url,
        100,
        (Op::GetRange, "data/100/"),
        async move { lakecdc::verify::run(&ctx, &opts).await },
    )
    .await
    .unwrap();
    let s = &report.schemas[0];
    assert_eq!(s.outcome, Outcome::Failed, "{s:?}");
    harness::assert_lock_lost(s.error.as_deref(), 100);
    let c = s.source.as_ref().unwrap();
    assert_eq!(ids(&c.stale), BTreeSet::from([stale]), "{c:?}");
    assert!(c.repaired.is_none(), "{c:?}");
    assert_eq!(crate::support::oracle::dirty(&rig.writer).await, dirty);

    let (s, code) = verify_source(&rig, false, true).await;
    assert_eq!(code, 3, "{s:?}");
    let requeued = s.source.as_ref().unwrap().repaired.clone().unwrap();
    assert_eq!(requeued.live, vec![stale], "{requeued:?}");
    rig.writer.follow_versions(&requeued.live).await;
    assert!(!rig.flush().await.failed());
    let (after, code) = verify_source(&rig, false, false).await;
    assert_eq!((after.outcome, code), (Outcome::Intact, 0), "{after:?}");
    rig.assert_oracle().await;
}

#[tokio::test]
async fn a_listed_file_gone_or_resized_is_a_divergence_naming_it_not_a_failure() {
    use lakecdc::store::ObjectStore;
    // docs/hazards.md L94: verify --source failed the schema (exit 1, "read compaction
    // source … not found") and named no row, so the divergence alert stayed silent.
    let (rig, _) = worked_rig(74).await;
    let listed = rig.listed().await;
    let (gone, grown) = (&listed[0], &listed[1]);
    let mut bytes = rig.store.get_bytes(grown).await.unwrap().bytes.to_vec();
    bytes.extend_from_slice(b"appended");
    rig.store
        .put_bytes(
            grown,
            bytes::Bytes::from(bytes),
            lakecdc::store::PutMode::Overwrite,
        )
        .await
        .unwrap();
    rig.store.delete(gone).await.unwrap();
    for repair in [false, true] {
        let (s, code) = verify_source(&rig, false, repair).await;
        assert_eq!((s.outcome, code), (Outcome::Diverged, 3), "{s:?}");
        let mut named: Vec<(&str, &str)> = s
            .problems
            .iter()
            .map(|p| (p.kind, p.path.as_str()))
            .collect();
        named.sort();
        let mut want = vec![("dangling", gone.as_str()), ("size", grown.as_str())];
        want.sort();
        assert_eq!(named, want);
        assert!(
            s.problems
                .iter()
                .all(|p| p.detail.contains("init --replace-delta")),
            "{s:?}"
        );
    }
}

#[tokio::test]
async fn a_lost_manifest_leaves_every_flushed_row_missing_not_proven() {
    // docs/hazards.md L95: with its manifest gone, a schema whose rows were all flushed
    // passed verify --source as `no_manifest`, exit 0.
    use lakecdc::store::ObjectStore;
    let (rig, _) = worked_rig(75).await;
    let dirty = crate::support::oracle::dirty(&rig.writer).await;
    rig.store.delete("manifest/100.json").await.unwrap();
    let (s, code) = verify_source(&rig, false, false).await;
    assert_eq!((s.outcome, code), (Outcome::Diverged, 3), "{s:?}");
    let c = s.source.as_ref().unwrap();
    let live = rig
        .writer
        .rows
        .iter()
        .filter(|(id, m)| !m.soft_deleted && !dirty.contains(id));
    assert_eq!(c.missing.count, live.count() as u64, "{c:?}");
    assert_eq!((c.lake_rows, c.extra.count, c.stale.count), (0, 0, 0));
}

#[tokio::test]
async fn dirty_rows_below_the_lakes_copy_are_divergent_and_one_repair_converges() {
    // docs/hazards.md L96: after a database restore, a dirty row whose version is below the
    // lake's copy was left to the next flush, which exported it at a version that loses; the
    // documented repair, flush and verify took two rounds.
    let (mut rig, _) = worked_rig(76).await;
    assert!(!rig.flush().await.failed());
    let lake = crate::support::oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
    let live: Vec<Uuid> = rig
        .writer
        .rows
        .iter()
        .filter(|(id, m)| !m.soft_deleted && lake.contains_key(id))
        .map(|(id, _)| *id)
        .collect();
    let (older, gone) = (live[0], live[1]);
    // "Restored": the row is back at an older version, dirty; the other is deleted, with a
    // dirty tombstone older than the lake's live copy.
    for (id, deleted) in [(older, false), (gone, true)] {
        let v = lake[&id].changed_at - 1000;
        let c = &rig.writer.client;
        if deleted {
            c.execute(
                "DELETE FROM entity_main WHERE ltbase_schema_id = 100 AND ltbase_row_id = $1",
                &[&id],
            )
            .await
            .unwrap();
        } else {
            c.execute(
                "UPDATE entity_main SET ltbase_updated_at = $2 WHERE ltbase_schema_id = 100 AND ltbase_row_id = $1",
                &[&id, &v],
            )
            .await
            .unwrap();
        }
        c.execute(
            "DELETE FROM change_log WHERE schema_id = 100 AND row_id = $1",
            &[&id],
        )
        .await
        .unwrap();
        c.execute(
            "INSERT INTO change_log (schema_id, row_id, flushed_at, changed_at, deleted_at) VALUES (100, $1, 0, $2, $3)",
            &[&id, &v, &deleted.then_some(v)],
        )
        .await
        .unwrap();
    }
    rig.writer.rows.remove(&gone);
    rig.writer.deleted.push(gone);
    let (s, code) = verify_source(&rig, false, true).await;
    assert_eq!((s.outcome, code), (Outcome::Diverged, 3), "{s:?}");
    let c = s.source.as_ref().unwrap();
    assert_eq!(ids(&c.stale), BTreeSet::from([older]), "{c:?}");
    assert_eq!(ids(&c.extra), BTreeSet::from([gone]), "{c:?}");
    assert_eq!(c.divergent(), 2, "{c:?}");
    // One repair, one flush: intact.
    assert!(!rig.flush().await.failed());
    let (s, code) = verify_source(&rig, false, false).await;
    assert_eq!((s.outcome, code), (Outcome::Intact, 0), "{s:?}");
    let lake = crate::support::oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
    assert!(lake.contains_key(&older) && !lake.contains_key(&gone));
}
