//! What each job's report says per schema, in the terms of its metrics: the same numbers its
//! `--json` report gives.

use super::{SchemaRun, Written};
use crate::compact::{self, CompactReport};
use crate::flush::{self, FlushReport};
use crate::gc::{self, GcReport};
use crate::init::{self, InitReport};
use crate::verify::{self, VerifyReport};

fn run(schema_id: i16, schema: &str, failed: bool) -> SchemaRun {
    SchemaRun {
        schema_id,
        schema: schema.to_string(),
        failed,
        ..SchemaRun::default()
    }
}

/// flush: rows exported, delta files and bytes written; every schema in the run's scope that
/// it left alone wrote nothing (a series that vanished whenever a schema went idle would break
/// dashboards and `absent()` alerts, docs/operations.md, "Metrics").
pub fn of_flush(r: &FlushReport) -> Vec<SchemaRun> {
    let mut runs: Vec<SchemaRun> = r
        .schemas
        .iter()
        .map(|s| SchemaRun {
            written: Some(Written {
                rows: s.rows_exported,
                files: s.files.len() as u64,
                bytes: s.bytes,
            }),
            ..run(s.schema_id, &s.schema, s.outcome == flush::Outcome::Failed)
        })
        .chain(r.idle.iter().map(|(id, name)| SchemaRun {
            written: Some(Written::default()),
            ..run(*id, name, false)
        }))
        .collect();
    runs.sort_by_key(|r| r.schema_id);
    runs
}

/// init: rows exported, base files and bytes written.
pub fn of_init(r: &InitReport) -> Vec<SchemaRun> {
    r.schemas
        .iter()
        .map(|s| SchemaRun {
            written: Some(Written {
                rows: s.rows,
                files: s.files.len() as u64,
                bytes: s.bytes,
            }),
            ..run(
                s.schema_id,
                &s.schema,
                matches!(s.outcome, init::Outcome::Failed | init::Outcome::Refused),
            )
        })
        .collect()
}

/// compact: rows, files and bytes of the new files.
pub fn of_compact(r: &CompactReport) -> Vec<SchemaRun> {
    r.schemas
        .iter()
        .map(|s| SchemaRun {
            written: Some(Written {
                rows: s.rows_out,
                files: s.files_out as u64,
                bytes: s.bytes_out,
            }),
            ..run(
                s.schema_id,
                &s.schema,
                s.outcome == compact::Outcome::Failed,
            )
        })
        .collect()
}

/// gc: objects deleted and unlisted deltas whose rows the lake lacks.
pub fn of_gc(r: &GcReport) -> Vec<SchemaRun> {
    r.schemas
        .iter()
        .map(|s| SchemaRun {
            gc: Some((s.deleted.len() as u64, s.lost.len() as u64)),
            ..run(
                s.schema_id,
                &s.schema,
                matches!(s.outcome, Some(gc::Outcome::Failed | gc::Outcome::Refused)),
            )
        })
        .collect()
}

/// verify: files failing their checks plus rows diverging from the source (when compared).
pub fn of_verify(r: &VerifyReport) -> Vec<SchemaRun> {
    r.schemas
        .iter()
        .map(|s| {
            let checked = matches!(
                s.outcome,
                verify::Outcome::Intact | verify::Outcome::Diverged
            );
            let divergences =
                s.problems.len() as u64 + s.source.as_ref().map_or(0, |c| c.divergent());
            SchemaRun {
                divergences: checked.then_some(divergences),
                ..run(s.schema_id, &s.schema, s.outcome == verify::Outcome::Failed)
            }
        })
        .collect()
}
