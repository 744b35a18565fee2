//! `lakecdc requeue`: makes the next flush re-export chosen rows of one schema (docs/design.md
//! §10), following the writer contract ([`crate::source::requeue`]): a row present in the
//! source gets a bumped version and a dirty slot, so its re-export wins over every copy in the
//! lake; a row absent from the source gets a tombstone slot. Values are never touched. Rows are
//! chosen by id (`--row-id`), by a file of ids (`--ids-from`, one per line, `#` comments) or by
//! a predicate over the entity table (`--where`, run read-only). `--dry-run` lists what would
//! be requeued.

use std::path::{Path, PathBuf};

use serde::Serialize;
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::job::{self, Context};
use crate::source::requeue::{self, Requeue, Requeued};

/// How the rows are chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// These ids.
    Ids(Vec<Uuid>),
    /// The ids listed in this file.
    File(PathBuf),
    /// The entity rows matching this SQL predicate.
    Where(String),
}

/// `requeue` options.
#[derive(Debug, Clone)]
pub struct RequeueOptions {
    /// The schema (name or id).
    pub schema: String,
    /// Which rows.
    pub selection: Selection,
    /// List what would be requeued; change nothing.
    pub dry_run: bool,
    /// Ids listed per class in the report.
    pub max_ids: usize,
}

/// What was requeued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RequeueReport {
    /// Schema id.
    pub schema_id: i16,
    /// Schema name.
    pub schema: String,
    /// True for `--dry-run`.
    pub dry_run: bool,
    /// Rows chosen.
    pub selected: usize,
    /// Rows given a bumped version (re-exported with their values).
    pub live: usize,
    /// Rows given a tombstone slot.
    pub tombstones: usize,
    /// Chosen ids the source has never held: nothing was requeued for them.
    pub unknown: usize,
    /// The ids of each class, up to `--max-ids`.
    pub ids: Requeued,
}

impl RequeueReport {
    /// 0 when every chosen row was requeued, 3 when some ids were unknown to the source.
    pub fn exit_code(&self) -> i32 {
        if self.unknown > 0 { 3 } else { 0 }
    }

    /// The human-readable report.
    pub fn to_text(&self) -> String {
        let verb = if self.dry_run {
            "would requeue"
        } else {
            "requeued"
        };
        let mut out = format!(
            "{verb} {} of {} chosen rows of schema {} ({}): {} re-exported at a bumped version, {} as tombstones",
            self.live + self.tombstones,
            self.selected,
            self.schema,
            self.schema_id,
            self.live,
            self.tombstones
        );
        if self.unknown > 0 {
            out.push_str(&format!(
                "; {} unknown to the source (nothing to requeue)",
                self.unknown
            ));
        }
        out.push('\n');
        for (name, ids) in [
            ("re-exported", &self.ids.live),
            ("tombstones", &self.ids.tombstones),
            ("unknown", &self.ids.unknown),
        ] {
            if !ids.is_empty() {
                let list: Vec<String> = ids.iter().map(Uuid::to_string).collect();
                out.push_str(&format!("    {name}: {}\n", list.join(" ")));
            }
        }
        if !self.dry_run && self.live + self.tombstones > 0 {
            out.push_str("    the next flush exports them\n");
        }
        out
    }
}

/// Requeues the chosen rows.
pub async fn run(ctx: &Context, opts: &RequeueOptions) -> Result<RequeueReport> {
    let targets = job::select_schemas(ctx, std::slice::from_ref(&opts.schema)).await?;
    let [reg] = targets.as_slice() else {
        return Err(Error::setting("schema", "names no registered schema"));
    };
    if reg.kind == crate::source::registry::Kind::Table {
        return Err(Error::setting(
            "schema",
            format!(
                "names table source {}: requeue works on schemas; an UPDATE of the rows in the table re-exports them",
                reg.name
            ),
        ));
    }
    let mut client = ctx.connector.connect().await?;
    let ids = match &opts.selection {
        Selection::Ids(ids) => ids.clone(),
        Selection::File(path) => read_ids(path)?,
        Selection::Where(predicate) => {
            requeue::select_where(&mut client, &ctx.tables, reg.id, predicate).await?
        }
    };
    let rows: Vec<Requeue> = ids
        .iter()
        .map(|id| Requeue {
            row_id: *id,
            floor: 0,
        })
        .collect();
    let now = ctx.clock.now_ms();
    let mut done =
        requeue::requeue(&mut client, &ctx.tables, reg.id, &rows, now, opts.dry_run).await?;
    let report = RequeueReport {
        schema_id: reg.id,
        schema: reg.name.clone(),
        dry_run: opts.dry_run,
        selected: ids.len(),
        live: done.live.len(),
        tombstones: done.tombstones.len(),
        unknown: done.unknown.len(),
        ids: {
            done.live.truncate(opts.max_ids);
            done.tombstones.truncate(opts.max_ids);
            done.unknown.truncate(opts.max_ids);
            done
        },
    };
    tracing::info!(
        schema = %report.schema,
        selected = report.selected,
        live = report.live,
        tombstones = report.tombstones,
        unknown = report.unknown,
        dry_run = report.dry_run,
        "requeue done"
    );
    Ok(report)
}

/// The ids of a file: one UUID per line; blank lines and `#` comments are skipped.
fn read_ids(path: &Path) -> Result<Vec<Uuid>> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::setting(
            "ids-from",
            format!("{}: cannot read it ({e})", path.display()),
        )
    })?;
    let mut ids = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let id = Uuid::parse_str(line).map_err(|_| {
            Error::setting(
                "ids-from",
                format!(
                    "{}:{}: {:?} is not a row id (one UUID per line)",
                    path.display(),
                    n + 1,
                    line.chars().take(60).collect::<String>()
                ),
            )
        })?;
        ids.push(id);
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ids_file_skips_comments_and_names_a_bad_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ids.txt");
        let a = Uuid::new_v4();
        std::fs::write(&path, format!("# lost rows\n{a}  # the first\n\n")).unwrap();
        assert_eq!(read_ids(&path).unwrap(), vec![a]);
        std::fs::write(&path, format!("{a}\nnot-a-uuid\n")).unwrap();
        let err = read_ids(&path).unwrap_err().to_string();
        assert!(err.contains(":2: \"not-a-uuid\""), "{err}");
        assert_eq!(read_ids(&path).unwrap_err().exit_code(), 2);
    }
}
