//! `lakecdc init-db`: creates the source tables and the `change_log` index when missing, and
//! registers every schema of the schema directory. All metadata is loaded and validated before
//! the first statement, so broken metadata changes nothing. Idempotent: a second run reports
//! every object as existing and every schema with its kept id. `--dry-run` reports the same
//! plan and changes nothing.

use std::path::Path;

use serde::Serialize;

use crate::config::Tables;
use crate::error::Result;
use crate::schema::dir;
use crate::source::Connector;
use crate::source::ddl::{self, ObjectStatus, Registration};

/// What `init-db` did (or, in a dry run, would do).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InitDbReport {
    /// True for `--dry-run`: nothing was changed.
    pub dry_run: bool,
    /// Tables and the index, with whether this run created them.
    pub objects: Vec<ObjectStatus>,
    /// Schemas with their ids, with whether this run registered them.
    pub schemas: Vec<Registration>,
}

impl InitDbReport {
    /// The human-readable report.
    pub fn to_text(&self) -> String {
        let mut out = String::from("OBJECT                              STATUS\n");
        let (created, registered) = if self.dry_run {
            ("would create", "would register")
        } else {
            ("created", "registered")
        };
        for o in &self.objects {
            let status = if o.created { created } else { "exists" };
            out.push_str(&format!("{:<35} {status}\n", o.name));
        }
        if !self.schemas.is_empty() {
            out.push_str("\nSCHEMA                              ID     STATUS\n");
            for s in &self.schemas {
                let status = if s.created { registered } else { "kept" };
                out.push_str(&format!("{:<35} {:<6} {status}\n", s.name, s.id));
            }
        }
        out
    }
}

/// Validates the schema directory (when given), then applies the DDL and registrations (in a
/// dry run: works out which it would apply, changing nothing).
pub async fn run(
    connector: &Connector,
    tables: &Tables,
    schema_dir: Option<&Path>,
    dry_run: bool,
) -> Result<InitDbReport> {
    let names = match schema_dir {
        Some(d) => {
            let names = dir::scan(d)?;
            for name in &names {
                dir::load(d, name)?;
            }
            names
        }
        None => Vec::new(),
    };
    let mut client = connector.connect().await?;
    let (objects, schemas) = ddl::apply(&mut client, tables, &names, dry_run).await?;
    tracing::info!(
        dry_run,
        created_objects = objects.iter().filter(|o| o.created).count(),
        registered = schemas.iter().filter(|s| s.created).count(),
        "init-db done"
    );
    Ok(InitDbReport {
        dry_run,
        objects,
        schemas,
    })
}
