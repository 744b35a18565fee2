//! `lakecdc requeue`: makes the next flush re-export chosen rows of one schema or table source
//! (docs/design.md §10). A schema follows the writer contract ([`crate::source::requeue`]): a
//! row present in the source gets a bumped version and a dirty slot, so its re-export wins over
//! every copy in the lake; a row absent from the source gets a tombstone slot. A table source
//! gets touches ([`crate::source::table_requeue`]). Values are never touched. Rows are chosen
//! by id (`--row-id`), by a file of ids (`--ids-from`, one per line, `#` comments) or by a
//! predicate over the entity table or the source's table (`--where`, run read-only).
//! `--dry-run` lists what would be requeued.

use std::path::{Path, PathBuf};

use serde::Serialize;
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::job::{self, Context};
use crate::lake::current::listed_copies;
use crate::source::requeue::{self, Requeue, Requeued};
use crate::source::{table_requeue, table_source};

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
    /// Chosen rows the application wrote while they were requeued: its own write re-exports
    /// them, so nothing was written for them.
    pub changed: usize,
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
        if self.changed > 0 {
            out.push_str(&format!(
                "; {} written by the application meanwhile (its own write re-exports them)",
                self.changed
            ));
        }
        out.push('\n');
        for (name, ids) in [
            ("re-exported", &self.ids.live),
            ("tombstones", &self.ids.tombstones),
            ("unknown", &self.ids.unknown),
            ("written meanwhile", &self.ids.changed),
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
    let mut client = ctx.connector.connect().await?;
    // A table source is requeued through its touch log (docs/design.md §10).
    let table = match reg.kind {
        crate::source::registry::Kind::Table => {
            Some(table_source::load(&client, &ctx.tables, reg.id).await?)
        }
        crate::source::registry::Kind::Schema => None,
    };
    let ids = match (&opts.selection, &table) {
        (Selection::Ids(ids), _) => ids.clone(),
        (Selection::File(path), _) => read_ids(path)?,
        (Selection::Where(predicate), table) => {
            // A slow predicate gives way to a stop request: the selection is read-only, and
            // the dropped connection ends its statement.
            let select = async {
                match table {
                    None => {
                        requeue::select_where(&mut client, &ctx.tables, reg.id, predicate).await
                    }
                    Some(src) => table_requeue::select_where(&mut client, src, predicate).await,
                }
            };
            tokio::select! {
                biased;
                () = ctx.shutdown.requested() => return Err(Error::Stopped),
                ids = select => ids?,
            }
        }
    };
    let chosen: Vec<Requeue> = ids
        .iter()
        .map(|id| Requeue {
            row_id: *id,
            floor: 0,
        })
        .collect();
    let mut rows = requeue::merged(&chosen);
    // Each row's floor is its lake copy's version: a row the source no longer holds but the
    // lake does is requeued as a tombstone above that copy (a table keeps no history of its
    // rows; an entity's `change_log` history may be gone with it, docs/hazards.md L98), and a
    // row the lake holds at a newer version than the source (a restored database) is bumped
    // above it (docs/design.md §10).
    if let Some((files, _)) = job::listed(ctx, reg.id).await? {
        let ids: Vec<u128> = rows.iter().map(|r| r.row_id.as_u128()).collect();
        let copies = listed_copies(ctx.lake.store.clone(), &files, &ids).await?;
        for (r, copy) in rows.iter_mut().zip(copies) {
            if let Some((version, _)) = copy {
                r.floor = version;
            }
        }
    }
    let now = ctx.clock.now_ms();
    let mut done = match &table {
        Some(src) => table_requeue::requeue(&mut client, src, &rows, now, opts.dry_run).await?,
        None => {
            requeue::requeue(&mut client, &ctx.tables, reg.id, &rows, now, opts.dry_run).await?
        }
    };
    let report = RequeueReport {
        schema_id: reg.id,
        schema: reg.name.clone(),
        dry_run: opts.dry_run,
        selected: ids.len(),
        live: done.live.len(),
        tombstones: done.tombstones.len(),
        unknown: done.unknown.len(),
        changed: done.changed.len(),
        ids: {
            done.live.truncate(opts.max_ids);
            done.tombstones.truncate(opts.max_ids);
            done.unknown.truncate(opts.max_ids);
            done.changed.truncate(opts.max_ids);
            done
        },
    };
    tracing::info!(
        schema = %report.schema,
        selected = report.selected,
        live = report.live,
        tombstones = report.tombstones,
        unknown = report.unknown,
        changed = report.changed,
        dry_run = report.dry_run,
        "requeue done"
    );
    Ok(report)
}

/// The most of an `--ids-from` file read (about five million ids of 37 bytes and more).
const IDS_LIMIT: u64 = 192 * 1024 * 1024;

/// The ids of a file: one UUID per line; blank lines and `#` comments are skipped.
fn read_ids(path: &Path) -> Result<Vec<Uuid>> {
    let cannot = |why: String| {
        Error::setting(
            "ids-from",
            format!("{}: cannot read it ({why})", path.display()),
        )
    };
    let bytes = std::fs::File::open(path)
        .and_then(|f| crate::config::read_at_most(f, IDS_LIMIT))
        .map_err(|e| cannot(e.to_string()))?
        .ok_or_else(|| {
            cannot(format!(
                "longer than {} MiB, about five million ids: requeue them in parts",
                IDS_LIMIT >> 20
            ))
        })?;
    let text = String::from_utf8(bytes).map_err(|_| cannot("not UTF-8 text".into()))?;
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
        // An endless file is refused once past the limit, not read until memory runs out.
        let err = read_ids(Path::new("/dev/zero")).unwrap_err();
        assert!(err.to_string().contains("longer than 192 MiB"), "{err}");
        assert_eq!(err.exit_code(), 2);
    }
}
