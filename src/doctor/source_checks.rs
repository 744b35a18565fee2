//! The doctor's PostgreSQL checks (docs/operations.md, `doctor`): the server answers, the
//! role's privileges, the `change_log` index, and the schema directory against the registry.
//! What later checks need from the database (the server's clock, the registered schemas, the
//! source identity) is kept, or the reason it could not be had.

use std::path::Path;

use super::check::{Check, Kind};
use super::skew::Sample;
use crate::clock::Clock;
use crate::config::{TableName, Tables};
use crate::error::Error;
use crate::lake::SourceGuard;
use crate::schema::dir;
use crate::source::catalog::{self, Privilege};
use crate::source::registry::{self, Registered};
use crate::source::{Client, Connector, ddl};

/// What the PostgreSQL checks found.
pub(super) struct SourceFindings {
    /// Checks 1 to 4, in order.
    pub checks: Vec<Check>,
    /// The server's clock against this host's.
    pub clock: Option<Sample>,
    /// The selected registered schemas, or why there are none.
    pub schemas: Result<Vec<Registered>, String>,
    /// This database's identity (never adopting), or why it is unknown.
    pub guard: Result<SourceGuard, String>,
}

/// Runs the PostgreSQL checks on one connection.
pub(super) async fn run(
    connector: &Connector,
    tables: &Tables,
    schema_dir: Option<&Path>,
    selectors: &[String],
    clock: &dyn Clock,
) -> SourceFindings {
    let client = match connector.connect().await {
        Ok(c) => c,
        Err(e) => {
            let down = "PostgreSQL is unreachable (see above)";
            return SourceFindings {
                checks: vec![
                    Check::fail(
                        Kind::Postgres,
                        e.chain(),
                        "check --pg-url (or LAKECDC_PG_URL, DATABASE_URL, the PG* variables), that the server is up, and that this host and role may connect (pg_hba.conf)",
                    ),
                    Check::skip(Kind::Privileges, down),
                    Check::skip(Kind::ChangeLogIndex, down),
                    Check::skip(Kind::SchemaDir, down),
                ],
                clock: None,
                schemas: Err(down.to_string()),
                guard: Err(down.to_string()),
            };
        }
    };
    let (server, clock, role) = server_check(&client, clock).await;
    let guard = crate::job::guard_of(&client, false)
        .await
        .map_err(|e| format!("the source identity could not be read: {}", e.chain()));
    let schemas = registry::list(&client, &tables.registry)
        .await
        .and_then(|all| registry::select(&all, selectors));
    let checks = vec![
        server,
        privileges(&client, tables, role.as_deref()).await,
        index(&client, tables).await,
        schema_dir_check(&client, tables, schema_dir, &schemas).await,
    ];
    SourceFindings {
        checks,
        clock,
        schemas: schemas.map_err(|e| format!("the registry could not be read: {}", e.chain())),
        guard,
    }
}

/// The server check, the server's clock and the role connected.
async fn server_check(
    client: &Client,
    clock: &dyn Clock,
) -> (Check, Option<Sample>, Option<String>) {
    let before_ms = clock.now_ms();
    match catalog::server(client).await {
        Ok(s) => {
            let sample = Sample {
                before_ms,
                after_ms: clock.now_ms(),
                remote_ms: s.now_ms,
                resolution_ms: 1,
            };
            let detail = format!("PostgreSQL {}, connected as {:?}", s.version, s.role);
            (
                Check::ok(Kind::Postgres, detail),
                Some(sample),
                Some(s.role),
            )
        }
        Err(e) => (
            Check::fail(
                Kind::Postgres,
                e.chain(),
                "the server answers but not this query: check the role and the server's logs",
            ),
            None,
            None,
        ),
    }
}

/// SELECT on the four source tables, UPDATE on `change_log`, advisory locks; the fix names
/// `role` when known.
async fn privileges(client: &Client, t: &Tables, role: Option<&str>) -> Check {
    let role = role.map_or_else(|| "<role>".to_string(), |r| format!("{r:?}"));
    let mut problems = Vec::new();
    let mut grants = Vec::new();
    let mut missing_tables = false;
    let wanted: [(&TableName, &str); 5] = [
        (&t.registry, "SELECT"),
        (&t.entity, "SELECT"),
        (&t.eav, "SELECT"),
        (&t.change_log, "SELECT"),
        (&t.change_log, "UPDATE"),
    ];
    for (table, privilege) in wanted {
        match catalog::table_privilege(client, table, privilege).await {
            Ok(Privilege::Granted) => {}
            Ok(Privilege::Missing) => {
                problems.push(format!("no {privilege} on {}", table.quoted()));
                grants.push(format!(
                    "GRANT {privilege} ON {} TO {role};",
                    table.quoted()
                ));
            }
            Ok(Privilege::NoTable) if privilege == "SELECT" => {
                problems.push(format!("table {} does not exist", table.quoted()));
                missing_tables = true;
            }
            Ok(Privilege::NoTable) => {}
            Err(e) => problems.push(e.chain()),
        }
    }
    if let Err(e) = catalog::advisory_lock_usable(client).await {
        problems.push(format!("advisory locks: {}", e.chain()));
        grants.push(format!(
            "GRANT EXECUTE ON FUNCTION pg_try_advisory_lock(int, int), pg_advisory_unlock(int, int) TO {role};"
        ));
    }
    if problems.is_empty() {
        // The repairs (requeue, verify --source --repair, gc --repair) also write the
        // entity's version and new slots: without them the jobs run, and a repair fails only
        // after its whole comparison.
        let mut repair = Vec::new();
        for (table, privilege) in [(&t.entity, "UPDATE"), (&t.change_log, "INSERT")] {
            if let Ok(Privilege::Missing) = catalog::table_privilege(client, table, privilege).await
            {
                repair.push((privilege, table.quoted()));
            }
        }
        if !repair.is_empty() {
            let what: Vec<String> = repair
                .iter()
                .map(|(p, t)| format!("no {p} on {t}"))
                .collect();
            let grants: Vec<String> = repair
                .iter()
                .map(|(p, t)| format!("GRANT {p} ON {t} TO {role};"))
                .collect();
            return Check::warn(
                Kind::Privileges,
                format!(
                    "the jobs can run, but requeue and the --repair of verify --source and gc cannot: {}",
                    what.join("; ")
                ),
                format!("as the tables' owner: {}", grants.join(" ")),
            );
        }
        return Check::ok(
            Kind::Privileges,
            "SELECT on the registry, entity, eav and change_log tables, UPDATE on change_log, advisory locks; UPDATE on the entity table and INSERT on change_log for repairs",
        );
    }
    let mut fix = Vec::new();
    if missing_tables {
        fix.push("run lakecdc init-db (or fix the --*-table names)".to_string());
    }
    if !grants.is_empty() {
        fix.push(format!("as the tables' owner: {}", grants.join(" ")));
    }
    Check::fail(Kind::Privileges, problems.join("; "), fix.join("; "))
}

async fn index(client: &Client, t: &Tables) -> Check {
    match ddl::change_log_dirty_index(client, t).await {
        Ok(ddl::DirtyIndex::DirtyOnly) => Check::ok(
            Kind::ChangeLogIndex,
            format!(
                "{} has its (schema_id, flushed_at, …) index of the dirty slots",
                t.change_log.quoted()
            ),
        ),
        Ok(ddl::DirtyIndex::WholeTable(name)) => Check::warn(
            Kind::ChangeLogIndex,
            format!(
                "{name} indexes every slot of {}, flushed ones too: each flush adds an entry per row it marks, and the index grows with the table",
                t.change_log.quoted()
            ),
            format!(
                "index the dirty slots only, without blocking writers: {}",
                ddl::dirty_index_migration(t, &name)
            ),
        ),
        Ok(ddl::DirtyIndex::Missing) => Check::fail(
            Kind::ChangeLogIndex,
            ddl::change_log_index_missing(t),
            format!(
                "run lakecdc init-db (it creates only what is missing), or: {};",
                ddl::change_log_index_ddl(t)
            ),
        ),
        Err(e) => Check::fail(Kind::ChangeLogIndex, e.chain(), "see the privileges check"),
    }
}

/// Every selected registered schema has a valid metadata file, and every column it binds an
/// attribute to exists in the entity table.
async fn schema_dir_check(
    client: &Client,
    t: &Tables,
    schema_dir: Option<&Path>,
    schemas: &Result<Vec<Registered>, Error>,
) -> Check {
    let schemas = match schemas {
        Ok(s) => s,
        Err(e) => {
            return Check::fail(
                Kind::SchemaDir,
                e.chain(),
                "run lakecdc init-db --schema-dir DIR to create and fill the registry, or fix --registry-table / --schema",
            );
        }
    };
    if schemas.is_empty() {
        return Check::warn(
            Kind::SchemaDir,
            format!("no schema is registered in {}", t.registry.quoted()),
            "register the schemas: lakecdc init-db --schema-dir DIR",
        );
    }
    let Some(dir) = schema_dir else {
        return Check::warn(
            Kind::SchemaDir,
            format!(
                "no --schema-dir given: the metadata of {} registered schemas was not checked",
                schemas.len()
            ),
            "pass the --schema-dir (LAKECDC_SCHEMA_DIR) flush and init are given",
        );
    };
    let columns = match catalog::columns(client, &t.entity).await {
        Ok(c) => c,
        Err(e) => {
            return Check::fail(Kind::SchemaDir, e.chain(), "see the privileges check");
        }
    };
    let mut problems = Vec::new();
    let mut bound = 0;
    for reg in schemas {
        match dir::load(dir, &reg.name) {
            Ok(def) => {
                for a in &def.attributes {
                    let Some(b) = &a.binding else { continue };
                    bound += 1;
                    if !columns.contains(&b.column) {
                        problems.push(format!(
                            "schema {:?}: attribute {:?} is bound to column {}, which {} lacks",
                            reg.name,
                            a.name,
                            b.column,
                            t.entity.quoted()
                        ));
                    }
                }
            }
            Err(e) => problems.push(format!(
                "schema {:?} (id {}): {}",
                reg.name,
                reg.id,
                e.chain()
            )),
        }
    }
    if problems.is_empty() {
        let regs: Vec<&Registered> = schemas.iter().collect();
        let clashes: Vec<String> = crate::job::catalog::view_name_clashes(&regs)
            .into_iter()
            .map(|(_, _, clash)| clash.to_string())
            .collect();
        if !clashes.is_empty() {
            // The writers do not mind; the readers refuse to read both at once
            // (docs/hazards.md R7).
            return Check::warn(
                Kind::SchemaDir,
                format!(
                    "query and view will not read these together: {}",
                    clashes.join("; ")
                ),
                "rename one schema of each pair in the registry (each manifest takes the new name at its next save), or read them one at a time with --schema",
            );
        }
        return Check::ok(
            Kind::SchemaDir,
            format!(
                "{} registered schemas have their metadata in {}; their {bound} bound columns exist",
                schemas.len(),
                dir.display()
            ),
        );
    }
    Check::fail(
        Kind::SchemaDir,
        problems.join("; "),
        "add each schema's <name>_attributes.json to --schema-dir (or point it at the directory flush and init use), and bind attributes only to columns the entity table has",
    )
}
