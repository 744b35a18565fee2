//! `lakecdc init-db`: creates the source tables and the `change_log` index when missing, and
//! registers every schema of the schema directory. All metadata is loaded and validated before
//! the first statement, so broken metadata changes nothing. Idempotent: a second run reports
//! every object as existing and every schema with its kept id.

use std::path::Path;

use serde::Serialize;

use crate::config::Tables;
use crate::error::Result;
use crate::schema::dir;
use crate::source::Connector;
use crate::source::ddl::{self, ObjectStatus, Registration};

/// What `init-db` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InitDbReport {
    /// Tables and the index, with whether this run created them.
    pub objects: Vec<ObjectStatus>,
    /// Schemas with their ids, with whether this run registered them.
    pub schemas: Vec<Registration>,
}

impl InitDbReport {
    /// The human-readable report.
    pub fn to_text(&self) -> String {
        let mut out = String::from("OBJECT                              STATUS\n");
        for o in &self.objects {
            let status = if o.created { "created" } else { "exists" };
            out.push_str(&format!("{:<35} {status}\n", o.name));
        }
        if !self.schemas.is_empty() {
            out.push_str("\nSCHEMA                              ID     STATUS\n");
            for s in &self.schemas {
                let status = if s.created { "registered" } else { "kept" };
                out.push_str(&format!("{:<35} {:<6} {status}\n", s.name, s.id));
            }
        }
        out
    }
}

/// Validates the schema directory (when given), then applies the DDL and registrations.
pub async fn run(
    connector: &Connector,
    tables: &Tables,
    schema_dir: Option<&Path>,
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
    let (objects, schemas) = ddl::apply(&mut client, tables, &names).await?;
    tracing::info!(
        created_objects = objects.iter().filter(|o| o.created).count(),
        registered = schemas.iter().filter(|s| s.created).count(),
        "init-db done"
    );
    Ok(InitDbReport { objects, schemas })
}
