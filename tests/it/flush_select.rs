//! A flush whose batch selection itself fails — on the first batch, and on later ones — after
//! dirty-schema discovery and the dirty count have succeeded. A PostgreSQL-side trap makes
//! exactly one selection statement raise: an operator in the `public` schema shadows the
//! built-in one the selection uses (the database's `search_path` puts `public` before
//! `pg_catalog` for the flush's new sessions), and raises only for that selection. Right after
//! the failure: the error names the step, the manifest lists exactly the batches committed
//! before it, those rows are marked and in the lake, every other row is still dirty; a clean
//! run converges.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::FutureExt;
use lakecdc::flush::{FlushHooks, Outcome};
use uuid::Uuid;

use crate::support::oracle;
use crate::support::rig::{LakeKind, Rig, rig};
use crate::support::writer::Rng;

const MANIFEST: &str = "manifest/100.json";
const ROWS: usize = 200;
const BATCH: usize = 40;

/// The SQL that makes the selection of batch `k` (1-based) fail, given the dirty versions in
/// selection order. Batch 1 runs the first-page statement (`flushed_at = 0`, no cursor);
/// batch k > 1 pages after the last version of batch k - 1 (`changed_at >= $3`), so a trap on
/// that comparison raising once its cursor reaches the last version of batch k - 1 fails
/// batch k and no earlier one.
fn trap_sql(k: usize, versions: &[i64]) -> String {
    if k == 1 {
        "CREATE FUNCTION public.trap_eq(a bigint, b integer) RETURNS boolean
           LANGUAGE plpgsql SET search_path = pg_catalog AS $$
         BEGIN
           IF current_query() LIKE '%ORDER BY changed_at, row_id LIMIT%' THEN
             RAISE EXCEPTION 'batch selection trapped';
           END IF;
           RETURN a = b;
         END $$;
         CREATE OPERATOR public.= (LEFTARG = bigint, RIGHTARG = integer, FUNCTION = public.trap_eq);"
            .to_string()
    } else {
        let cursor = versions[(k - 1) * BATCH - 1];
        format!(
            "CREATE FUNCTION public.trap_ge(a bigint, b bigint) RETURNS boolean
               LANGUAGE plpgsql SET search_path = pg_catalog AS $$
             BEGIN
               IF b >= {cursor} THEN
                 RAISE EXCEPTION 'batch selection trapped';
               END IF;
               RETURN a >= b;
             END $$;
             CREATE OPERATOR public.>= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = public.trap_ge);"
        )
    }
}

const UNTRAP: &str = "DROP OPERATOR IF EXISTS public.= (bigint, integer);
     DROP OPERATOR IF EXISTS public.>= (bigint, bigint);
     DROP FUNCTION IF EXISTS public.trap_eq(bigint, integer);
     DROP FUNCTION IF EXISTS public.trap_ge(bigint, bigint);";

async fn selection_fails_at(k: usize) {
    let mut rig = rig(LakeKind::S3).await;
    let mut r = Rng::new(3000 + k as u64);
    rig.seed(ROWS, &mut r).await;
    assert_eq!(rig.opts.batch_size as usize, BATCH);
    // One batch per selection window: the window selection is the batch's selection.
    rig.opts.window_batches = 1;
    // The dirty slots in selection order.
    let order: Vec<(Uuid, i64)> = rig
        .writer
        .client
        .query(
            "SELECT row_id, changed_at FROM change_log WHERE flushed_at = 0 ORDER BY changed_at, row_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(order.len(), ROWS);
    let versions: Vec<i64> = order.iter().map(|(_, v)| *v).collect();
    if k > 2 {
        // Batch k - 1's cursor must stay below the trap.
        assert!(versions[(k - 2) * BATCH - 1] < versions[(k - 1) * BATCH - 1]);
    }
    let db = rig.db.url.rsplit_once('/').unwrap().1.to_string();
    let admin = rig.db.client().await;
    admin.batch_execute(&trap_sql(k, &versions)).await.unwrap();
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {db} SET search_path = public, pg_catalog"
        ))
        .await
        .unwrap();
    // Hooks that count the batches selected and committed.
    let (selected, committed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let count = |n: &Arc<AtomicUsize>| {
        let n = n.clone();
        Rig::hook(move || {
            n.fetch_add(1, Ordering::SeqCst);
            async {}.boxed()
        })
    };
    let hooks = FlushHooks {
        before_export: Some(count(&selected)),
        before_mark: Some(count(&committed)),
        ..Default::default()
    };
    let report = rig.flush_with(&hooks).await;
    admin
        .batch_execute(&format!("ALTER DATABASE {db} RESET search_path; {UNTRAP}"))
        .await
        .unwrap();
    let what = format!("batch {k}");
    assert_eq!(report.schemas.len(), 1, "{report:?}");
    let s = &report.schemas[0];
    assert_eq!(s.outcome, Outcome::Failed, "{what}: {s:?}");
    // Discovery and the dirty count ran; the selection failed, and the error says so.
    assert_eq!(s.dirty_rows as usize, ROWS, "{what}: {s:?}");
    let reason = s.reason.as_deref().unwrap();
    assert!(
        reason.contains("select batch") && reason.contains("batch selection trapped"),
        "{what}: {reason}"
    );
    // Exactly the batches before k were selected, committed and marked.
    let done = k - 1;
    assert_eq!(selected.load(Ordering::SeqCst), done, "{what}: selections");
    assert_eq!(committed.load(Ordering::SeqCst), done, "{what}: commits");
    assert_eq!(s.batches as usize, done, "{what}: {s:?}");
    assert_eq!(s.rows_marked as usize, done * BATCH, "{what}: {s:?}");
    let reported: Vec<String> = s.files.iter().map(|f| f.path.clone()).collect();
    assert_eq!(rig.listed().await, reported, "{what}: the manifest");
    if done == 0 {
        assert!(
            oracle::manifest_json(rig.store.as_ref(), MANIFEST)
                .await
                .is_none()
        );
    }
    let exported: BTreeSet<Uuid> = order[..done * BATCH].iter().map(|(id, _)| *id).collect();
    let rest: BTreeSet<Uuid> = order[done * BATCH..].iter().map(|(id, _)| *id).collect();
    assert_eq!(oracle::dirty(&rig.writer).await, rest, "{what}: dirty rows");
    let lake = oracle::lake_state(rig.store.as_ref(), MANIFEST).await;
    assert_eq!(
        lake.keys().copied().collect::<BTreeSet<_>>(),
        exported,
        "{what}: the lake"
    );
    assert_eq!(
        rig.assert_oracle().await,
        (done * BATCH, ROWS - done * BATCH),
        "{what}"
    );
    // No delta is left unlisted.
    let deltas: BTreeSet<String> = rig
        .keys("data/100/")
        .await
        .into_iter()
        .filter(|key| !key.ends_with("_owner.json"))
        .collect();
    assert_eq!(
        deltas,
        reported.iter().cloned().collect::<BTreeSet<_>>(),
        "{what}: objects"
    );
    // A clean run converges.
    let retry = rig.flush().await;
    let s = &retry.schemas[0];
    assert_eq!(s.outcome, Outcome::Flushed, "{what}: {s:?}");
    assert_eq!(s.rows_marked as usize, ROWS - done * BATCH, "{what}");
    assert_eq!(rig.assert_oracle().await, (ROWS, 0), "{what}");
    let _ = &mut rig;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_selection_of_the_first_batch_publishes_nothing() {
    selection_fails_at(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_selection_of_a_later_batch_keeps_the_committed_ones() {
    selection_fails_at(2).await;
    selection_fails_at(4).await;
}
