//! Attaching and detaching a table source (docs/design.md §9): the table's shape from the
//! catalog, the checks a table must pass (a primary key of types whose text is the same in every
//! session, excluded columns that exist and are not key columns, a free name), the source id
//! (shared with the schemas' ids), and the capture DDL ([`super::capture`]) run in one
//! transaction — or printed.

use tokio_postgres::{Client, GenericClient};

use super::capture::{Capture, KEY_TYPES, KeyColumn, RowIdRule, SourceColumn};
use super::connect::timed;
use super::ddl::{FIRST_SCHEMA_ID, INIT_DB_LOCK};
use super::table_types::{CatalogType, LakeType};
use crate::config::{TableName, Tables, check_schema_name};
use crate::error::{Error, Result};

const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// What `attach` is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachRequest {
    /// The table, `name` or `schema.name`.
    pub table: TableName,
    /// The source's name (default: the table's name).
    pub name: Option<String>,
    /// Columns left out of the lake.
    pub exclude: Vec<String>,
}

/// What an attach did (or, dry, would do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    /// The capture of the source.
    pub capture: Capture,
    /// The table was attached already, its triggers in place: nothing was changed.
    pub unchanged: bool,
    /// The exported columns (key included), with their types in PostgreSQL and in the lake.
    pub columns: Vec<SourceColumn>,
}

/// The table as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Shape {
    pub(super) table: TableName,
    pub(super) columns: Vec<SourceColumn>,
    /// Each column's `attnum`, in the order of `columns`: it survives a rename.
    pub(super) attnums: Vec<i16>,
    pub(super) key: Vec<KeyColumn>,
}

impl Shape {
    /// The `attnum`s of the columns named in `names` that the table has.
    pub(super) fn attnums_of(&self, names: &[String]) -> Vec<i16> {
        self.columns
            .iter()
            .zip(&self.attnums)
            .filter(|(c, _)| names.contains(&c.name))
            .map(|(_, n)| *n)
            .collect()
    }
}

/// The `attnum`s of a source's excluded columns as `lakecdc_sources.excluded_attnums` holds
/// them (read as JSON, so a registry made before the column existed reads `None`).
pub(super) fn parse_excluded_attnums(json: Option<&str>) -> Result<Option<Vec<i16>>> {
    match json {
        None | Some("null") => Ok(None),
        Some(text) => serde_json::from_str(text)
            .map(Some)
            .map_err(|e| Error::decode("read lakecdc_sources: excluded_attnums", e.to_string())),
    }
}

pub(super) async fn describe(client: &impl GenericClient, table: &TableName) -> Result<Shape> {
    let found = timed(
        TIMEOUT,
        "find the table",
        client.query_opt(
            "SELECT c.oid::int8, n.nspname::text, c.relname::text, \
                    EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid), \
                    EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhparent = c.oid) \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.oid = to_regclass($1) AND c.relkind = 'r'",
            &[&table.quoted()],
        ),
    )
    .await?
    .ok_or_else(|| {
        Error::config(format!(
            "table {} does not exist or is not a plain table (partitioned tables are not attached: a write aimed at a partition would bypass the parent's triggers): check the name and the search_path",
            table.quoted()
        ))
    })?;
    let (oid, schema, name): (i64, String, String) = (found.get(0), found.get(1), found.get(2));
    // Statement-level triggers fire only for the table a statement names (docs/hazards.md L72):
    // writes through a parent would bypass a partition's or child's capture, and a parent's
    // rows include its children's, whose own writes its triggers never see.
    let (has_parent, has_children): (bool, bool) = (found.get(3), found.get(4));
    if has_parent || has_children {
        return Err(Error::config(format!(
            "table {} {}: statement-level triggers fire only for the table a statement names, so writes through {} would not be captured; attach a table outside any inheritance or partitioning",
            table.quoted(),
            if has_parent {
                "is a partition or inheritance child of another table"
            } else {
                "has inheritance children"
            },
            if has_parent {
                "its parent"
            } else {
                "its children"
            },
        )));
    }
    let qualified = TableName::parse("table", &format!("{schema}.{name}")).map_err(|_| {
        Error::config(format!(
            "table {schema}.{name}: lakecdc attaches tables named with letters, digits and _ only"
        ))
    })?;
    // A domain is resolved to its base type (and modifier); an array's element type is named.
    let columns = timed(
        TIMEOUT,
        "read the table's columns",
        client.query(
            "WITH c AS (SELECT a.attnum, a.attname::text AS name, \
                   format_type(a.atttypid, a.atttypmod) AS shown, \
                   CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE a.atttypid END AS base, \
                   CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE a.atttypmod END AS typmod, \
                   a.atthasdef OR a.attgenerated <> '' AS filled \
               FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
               WHERE a.attrelid = $1::int8::oid AND a.attnum > 0 AND NOT a.attisdropped) \
             SELECT c.name, c.shown, b.typname::text, b.typtype::text, c.typmod, \
                    e.typname::text, e.typtype::text, c.attnum, c.filled \
             FROM c JOIN pg_type b ON b.oid = c.base \
             LEFT JOIN pg_type e ON e.oid = b.typelem AND b.typcategory = 'A' \
             ORDER BY c.attnum",
            &[&oid],
        ),
    )
    .await?;
    let attnums = columns.iter().map(|r| r.get::<_, i16>(7)).collect();
    let columns = columns
        .iter()
        .map(|r| {
            let element: Option<String> = r.get(5);
            let lake = LakeType::of(&CatalogType {
                name: r.get(2),
                kind: r.get(3),
                typmod: r.get(4),
                element: element
                    .map(|name| (name, r.get::<_, Option<String>>(6).unwrap_or_default())),
            });
            let name: String = r.get(0);
            SourceColumn {
                lake_name: super::capture::lake_name(&name),
                name,
                pg_type: r.get(1),
                lake_type: lake.describe(),
                lake,
                filled: r.get(8),
            }
        })
        .collect();
    let key = timed(
        TIMEOUT,
        "read the table's primary key",
        client.query(
            "SELECT a.attname::text, format_type(a.atttypid, NULL) FROM pg_index i \
             CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
             WHERE i.indrelid = $1::int8::oid AND i.indisprimary ORDER BY k.ord",
            &[&oid],
        ),
    )
    .await?
    .iter()
    .map(|r| KeyColumn {
        name: r.get(0),
        type_name: r.get(1),
    })
    .collect();
    Ok(Shape {
        table: qualified,
        columns,
        attnums,
        key,
    })
}

/// Whether `table` exists.
async fn exists(client: &impl GenericClient, table: &TableName) -> Result<bool> {
    Ok(timed(
        TIMEOUT,
        "check table",
        client.query_one("SELECT to_regclass($1) IS NOT NULL", &[&table.quoted()]),
    )
    .await?
    .get(0))
}

/// The registry of sources and the touch log, qualified with the connection's schema when the
/// registry's name is not (the trigger function runs with a pinned `search_path`).
pub(super) async fn qualified_tables(
    client: &impl GenericClient,
    tables: &Tables,
) -> Result<(TableName, TableName)> {
    let schema: Option<String> = timed(
        TIMEOUT,
        "read current_schema",
        client.query_one("SELECT current_schema()::text", &[]),
    )
    .await?
    .try_get(0)
    .map_err(Error::postgres("read current_schema"))?;
    let schema = schema.ok_or_else(|| {
        Error::config(
            "no schema of the search_path exists, so lakecdc_sources and lakecdc_touch have no place: set the role's search_path or qualify --registry-table",
        )
    })?;
    let unfit = || {
        Error::config(format!(
            "the connection's current schema {schema:?} is not a plain identifier (letters, digits and _), so lakecdc_sources and lakecdc_touch cannot be named in it: set the role's search_path to such a schema or qualify --registry-table"
        ))
    };
    let sources = tables.sources().qualified_in(&schema).ok_or_else(unfit)?;
    let touch_log = tables.touch_log().qualified_in(&schema).ok_or_else(unfit)?;
    Ok((sources, touch_log))
}

/// The row-id rule of the key `names` as the source's recorded `columns` (its JSON array)
/// typed them when it was attached (or last initialised); `None` when they do not say.
pub(super) fn recorded_rule(columns: &[serde_json::Value], names: &[String]) -> Option<RowIdRule> {
    let key = names
        .iter()
        .map(|n| {
            let c = columns
                .iter()
                .find(|c| c.get("name").and_then(|v| v.as_str()) == Some(n.as_str()))?;
            let shown = c.get("pg_type")?.as_str()?;
            // format_type with modifiers (`numeric(10,2)`); the rule reads the bare name.
            let type_name = shown.split('(').next().unwrap_or(shown).trim().to_string();
            Some(KeyColumn {
                name: n.clone(),
                type_name,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(RowIdRule::of(&key))
}

/// A source already attached to the table: its id and name.
async fn attached_to(
    client: &impl GenericClient,
    sources: &TableName,
    table: &TableName,
) -> Result<Option<(i16, String)>> {
    if !exists(client, sources).await? {
        return Ok(None);
    }
    let sql = format!(
        "SELECT source_id, name FROM {} WHERE table_schema = $1 AND table_name = $2",
        sources.quoted()
    );
    let row = timed(
        TIMEOUT,
        "read lakecdc_sources",
        client.query_opt(&sql, &[&table.schema().unwrap_or("public"), &table.name()]),
    )
    .await?;
    Ok(row.map(|r| (r.get(0), r.get(1))))
}

/// Every name and id taken by a schema or a source.
async fn taken(
    client: &impl GenericClient,
    tables: &Tables,
    sources: &TableName,
) -> Result<Vec<(String, i16)>> {
    let mut out = Vec::new();
    if exists(client, &tables.registry).await? {
        let sql = format!(
            "SELECT schema_name, schema_id FROM {}",
            tables.registry.quoted()
        );
        for r in timed(TIMEOUT, "read schema registry", client.query(&sql, &[])).await? {
            // A registry table of another shape is an error, not a panic.
            let column = |c: &'static str| Error::postgres(format!("read schema registry: {c}"));
            out.push((
                r.try_get(0).map_err(column("schema_name"))?,
                r.try_get(1).map_err(column("schema_id"))?,
            ));
        }
    }
    if exists(client, sources).await? {
        let sql = format!("SELECT name, source_id FROM {}", sources.quoted());
        for r in timed(TIMEOUT, "read lakecdc_sources", client.query(&sql, &[])).await? {
            out.push((r.get(0), r.get(1)));
        }
    }
    Ok(out)
}

/// How much of a capture is installed on its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CaptureParts {
    /// Its triggers present, of the four.
    pub triggers: i64,
    /// Of them, enabled (`tgenabled` other than `D`): they fire for the application's writes.
    pub enabled: i64,
    /// Of them, enabled `ALWAYS`: they fire under `session_replication_role = replica` too (a
    /// subscription's apply, `pg_restore --disable-triggers`).
    pub always: i64,
    /// Whether its function exists.
    pub function: bool,
}

impl CaptureParts {
    /// Whether nothing of the capture is installed: detached (or never attached).
    pub(super) fn absent(&self) -> bool {
        self.triggers == 0 && !self.function
    }

    /// Whether every write to the table is recorded: all four triggers enabled.
    pub(super) fn recording(&self) -> bool {
        self.enabled == Capture::TRIGGERS
    }
}

/// How much of a capture is installed: its triggers on the table and their state, and
/// whether its function exists.
pub(super) async fn capture_parts(
    client: &impl GenericClient,
    capture: &Capture,
) -> Result<CaptureParts> {
    let names = Capture::trigger_names();
    let row = timed(
        TIMEOUT,
        "check the capture triggers",
        client.query_one(
            "SELECT count(*), count(*) FILTER (WHERE tgenabled <> 'D'), count(*) FILTER (WHERE tgenabled = 'A'), \
                    to_regprocedure($3 || '()') IS NOT NULL \
             FROM pg_trigger WHERE tgrelid = to_regclass($1) AND tgname = ANY($2)",
            &[&capture.table.quoted(), &names, &capture.function().quoted()],
        ),
    )
    .await?;
    let column = |c: &'static str| Error::postgres(format!("check the capture triggers: {c}"));
    Ok(CaptureParts {
        triggers: row.try_get(0).map_err(column("triggers"))?,
        enabled: row.try_get(1).map_err(column("enabled"))?,
        always: row.try_get(2).map_err(column("always"))?,
        function: row.try_get(3).map_err(column("function"))?,
    })
}

/// Whether the table's function, as this build writes it (body and settings), and its four
/// triggers, enabled `ALWAYS`, are all in place: a capture an earlier build installed is
/// replaced by `attach`.
async fn capture_installed(client: &impl GenericClient, capture: &Capture) -> Result<bool> {
    let parts = capture_parts(client, capture).await?;
    if !parts.function || parts.always != Capture::TRIGGERS {
        return Ok(false);
    }
    Ok(installed_function_matches(client, capture).await? == Some(true))
}

/// Whether the capture's installed trigger function is the one this build writes for
/// `capture` (its body and settings); `None` when no such function is installed.
pub(super) async fn installed_function_matches(
    client: &impl GenericClient,
    capture: &Capture,
) -> Result<Option<bool>> {
    let row = timed(
        TIMEOUT,
        "read the capture function",
        client.query_opt(
            "SELECT prosrc, coalesce(proconfig, '{}') FROM pg_proc \
             WHERE oid = to_regprocedure($1 || '()')",
            &[&capture.function().quoted()],
        ),
    )
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let column = |c: &'static str| Error::postgres(format!("read the capture function: {c}"));
    let body: String = row.try_get(0).map_err(column("prosrc"))?;
    let settings: Vec<String> = row.try_get(1).map_err(column("proconfig"))?;
    Ok(Some(
        body == capture.function_body() && settings == Capture::FUNCTION_SETTINGS,
    ))
}

/// Refuses to attach a table again with another key or other excluded columns than it was
/// attached with: its touch log and lake hold row ids and columns of the recorded ones.
async fn same_as_recorded(
    client: &impl GenericClient,
    sources: &TableName,
    id: i16,
    table: &str,
    key: &[KeyColumn],
    exclude: &[String],
    exclude_attnums: &[i16],
) -> Result<bool> {
    let sql = format!(
        "SELECT key_columns, excluded_columns, columns::text, (to_jsonb(s) -> 'excluded_attnums')::text FROM {} s WHERE source_id = $1",
        sources.quoted()
    );
    let row = timed(
        TIMEOUT,
        "read lakecdc_sources",
        client.query_one(&sql, &[&id]),
    )
    .await?;
    let column = |c: &'static str| Error::postgres(format!("read lakecdc_sources: {c}"));
    let recorded_key: Vec<String> = row.try_get(0).map_err(column("key_columns"))?;
    let mut recorded_excluded: Vec<String> = row.try_get(1).map_err(column("excluded_columns"))?;
    let current_key: Vec<String> = key.iter().map(|k| k.name.clone()).collect();
    let recorded_columns: String = row.try_get(2).map_err(column("columns"))?;
    let recorded_columns: Vec<serde_json::Value> =
        serde_json::from_str(&recorded_columns).unwrap_or_default();
    if let Some(was) = recorded_rule(&recorded_columns, &recorded_key)
        && recorded_key == current_key
    {
        let now = RowIdRule::of(key);
        if was != now {
            return Err(Error::config(format!(
                "table {table} was attached with a key whose row id is {} and its key's type now gives {}: its row ids would change; attach it under another --name and run init for it",
                was.as_str(),
                now.as_str()
            )));
        }
    }
    if recorded_key != current_key {
        return Err(Error::config(format!(
            "table {table} was attached with the key ({}) and its key is now ({}): its row ids would change; attach it under another --name and run init for it",
            recorded_key.join(", "),
            current_key.join(", ")
        )));
    }
    let recorded_attnums = parse_excluded_attnums(
        row.try_get::<_, Option<String>>(3)
            .map_err(column("excluded_attnums"))?
            .as_deref(),
    )?;
    // The same columns: by attnum once recorded (a renamed excluded column is still the one
    // excluded), else by name.
    let same = match &recorded_attnums {
        Some(recorded) => {
            let (mut a, mut b) = (recorded.clone(), exclude_attnums.to_vec());
            a.sort_unstable();
            b.sort_unstable();
            a == b
        }
        None => {
            let mut requested = exclude.to_vec();
            recorded_excluded.sort();
            requested.sort();
            recorded_excluded == requested
        }
    };
    if !same {
        return Err(Error::setting(
            "exclude-columns",
            format!(
                "differs from what {table} was attached with ({}): a source keeps its columns; attach it under another --name to change them",
                if recorded_excluded.is_empty() {
                    "none".to_string()
                } else {
                    recorded_excluded.join(", ")
                }
            ),
        ));
    }
    // Whether the registry lacks what this build records (the attnums, or the current names).
    let mut names = exclude.to_vec();
    names.sort();
    recorded_excluded.sort();
    Ok((recorded_attnums.is_none() && !exclude.is_empty()) || recorded_excluded != names)
}

/// Whether any part of the capture (the function, a trigger) is installed.
async fn capture_present(client: &impl GenericClient, capture: &Capture) -> Result<bool> {
    Ok(!capture_parts(client, capture).await?.absent())
}

/// Checks `request` against the catalog and the registries and decides the capture; changes
/// nothing. `unchanged` when the table is attached already with everything in place.
async fn plan(
    client: &impl GenericClient,
    tables: &Tables,
    request: &AttachRequest,
) -> Result<Attached> {
    let shape = describe(client, &request.table).await?;
    let table = shape.table.quoted();
    // The function body is dollar-quoted: no name in it may carry a '$'.
    if let Some(name) = std::iter::once(shape.table.name())
        .chain(shape.table.schema())
        .chain(shape.key.iter().map(|k| k.name.as_str()))
        .find(|n| n.contains('$'))
    {
        return Err(Error::config(format!(
            "table {table}: {name:?} holds a '$', which lakecdc's trigger function cannot name; rename it to attach the table"
        )));
    }
    if shape.key.is_empty() {
        return Err(Error::config(format!(
            "table {table} has no primary key: lakecdc identifies rows by it; add one (ALTER TABLE … ADD PRIMARY KEY) and attach again"
        )));
    }
    if let Some(k) = shape
        .key
        .iter()
        .find(|k| !KEY_TYPES.contains(&k.type_name.as_str()))
    {
        return Err(Error::config(format!(
            "table {table}: primary key column {:?} is {}, whose text depends on session settings; keys of {} only can be attached",
            k.name,
            k.type_name,
            KEY_TYPES.join(", ")
        )));
    }
    for column in &request.exclude {
        if !shape.columns.iter().any(|c| &c.name == column) {
            return Err(Error::setting(
                "exclude-columns",
                format!("names {column:?}, which {table} does not have"),
            ));
        }
        if shape.key.iter().any(|k| &k.name == column) {
            return Err(Error::setting(
                "exclude-columns",
                format!(
                    "names {column:?}, a primary-key column of {table}: keys are always exported"
                ),
            ));
        }
    }
    let (sources, touch_log) = qualified_tables(client, tables).await?;
    let existing = attached_to(client, &sources, &shape.table).await?;
    let name = match (&request.name, &existing) {
        (Some(n), Some((_, current))) if n != current => {
            return Err(Error::setting(
                "name",
                format!(
                    "{table} is attached already as {current:?}: a source keeps its name (its lake is under its id)"
                ),
            ));
        }
        (_, Some((_, current))) => current.clone(),
        (Some(n), None) => n.clone(),
        (None, None) => shape.table.name().to_string(),
    };
    check_schema_name(&name).map_err(|e| Error::setting("name", e.to_string()))?;
    let exclude_attnums = shape.attnums_of(&request.exclude);
    let mut stale_record = false;
    if let Some((id, _)) = &existing {
        stale_record = same_as_recorded(
            client,
            &sources,
            *id,
            &table,
            &shape.key,
            &request.exclude,
            &exclude_attnums,
        )
        .await?;
    }
    let taken = taken(client, tables, &sources).await?;
    let id = match existing {
        Some((id, _)) => id,
        None => {
            if taken.iter().any(|(n, _)| *n == name) {
                return Err(Error::setting(
                    "name",
                    format!(
                        "{name:?} is taken by a schema or another source: choose another with --name"
                    ),
                ));
            }
            // A name whose views a reader would take for another's (`Customer` beside
            // `customer`, or `customer__history`) would make every query of both fail, and a
            // source keeps its name (docs/hazards.md R13).
            for (other, other_id) in &taken {
                if crate::config::shared_view(&name, other).is_some() {
                    return Err(Error::setting(
                        "name",
                        format!(
                            "{name:?} would be read as the same view as {other:?} (schema id {other_id}): readers match names without regard to case and add __history; choose another with --name"
                        ),
                    ));
                }
            }
            let next = taken
                .iter()
                .map(|(_, id)| i32::from(*id) + 1)
                .max()
                .unwrap_or(0)
                .max(i32::from(FIRST_SCHEMA_ID));
            i16::try_from(next).map_err(|_| {
                Error::config(format!("cannot attach {table}: source ids are exhausted"))
            })?
        }
    };
    let columns: Vec<SourceColumn> = shape
        .columns
        .into_iter()
        .filter(|c| !request.exclude.contains(&c.name))
        .collect();
    check_lake_names(&shape.table, &columns)?;
    let capture = Capture {
        source_id: id,
        name,
        table: shape.table.clone(),
        key: shape.key.clone(),
        excluded: request.exclude.clone(),
        excluded_attnums: exclude_attnums,
        columns: columns.clone(),
        sources,
        touch_log,
    };
    let unchanged =
        existing.is_some() && !stale_record && capture_installed(client, &capture).await?;
    Ok(Attached {
        capture,
        unchanged,
        columns,
    })
}

/// Refuses columns whose lake names DuckDB could not tell apart (it compares names ignoring
/// ASCII case): `Amount` and `amount`, or `pg_row_id` beside a renamed `row_id`.
pub(super) fn check_lake_names(table: &TableName, columns: &[SourceColumn]) -> Result<()> {
    let mut seen: std::collections::BTreeMap<String, &str> = std::collections::BTreeMap::new();
    for c in columns {
        if let Some(other) = seen.insert(c.lake_name.to_ascii_lowercase(), &c.name) {
            return Err(Error::config(format!(
                "table {}: columns {other:?} and {:?} would share the lake column {:?} (names are compared ignoring case); leave one out with --exclude-columns",
                table.quoted(),
                c.name,
                c.lake_name
            )));
        }
    }
    Ok(())
}

/// Attaches the table: in one transaction (serialised with `init-db`, which also hands out
/// ids), the checks, then the capture DDL unless the table is attached already. `dry_run`
/// rolls back; `attached_at` is the time recorded for a new source.
pub async fn attach(
    client: &mut Client,
    tables: &Tables,
    request: &AttachRequest,
    attached_at: i64,
    dry_run: bool,
) -> Result<Attached> {
    let tx = timed(TIMEOUT, "begin attach", client.transaction()).await?;
    timed(
        TIMEOUT,
        "lock attach",
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&INIT_DB_LOCK]),
    )
    .await?;
    timed(
        TIMEOUT,
        "set standard_conforming_strings",
        tx.batch_execute("SET LOCAL standard_conforming_strings = on"),
    )
    .await?;
    let attached = plan(&tx, tables, request).await?;
    if attached.unchanged || dry_run {
        timed(TIMEOUT, "end attach", tx.rollback()).await?;
        return Ok(attached);
    }
    // `IF NOT EXISTS` would adopt what another role made first: refused before anything is
    // created (the statements check again, for the printed script).
    check_capture_tables(
        &tx,
        &attached.capture.sources,
        &attached.capture.touch_log,
        true,
    )
    .await?;
    for statement in attached.capture.attach_statements(attached_at) {
        timed(TIMEOUT, "attach", tx.batch_execute(&statement)).await?;
    }
    timed(TIMEOUT, "commit attach", tx.commit()).await?;
    Ok(attached)
}

/// Refuses a registry of sources, touch log or statement sequence that runs code lakecdc did
/// not write ([`super::capture::capture_tables_problems`]; `owned` at attach).
pub(super) async fn check_capture_tables(
    client: &impl GenericClient,
    sources: &TableName,
    touch_log: &TableName,
    owned: bool,
) -> Result<()> {
    let sql = super::capture::capture_tables_problems(sources, touch_log, owned);
    let rows = timed(
        TIMEOUT,
        "check the capture's tables",
        client.query(&sql, &[]),
    )
    .await?;
    match rows.first() {
        None => Ok(()),
        Some(row) => {
            let name: String = row.get(0);
            let problem: String = row.get(1);
            Err(Error::config(format!(
                "{name} {problem}: {}",
                super::capture::CAPTURE_TABLES_FIX
            )))
        }
    }
}

/// [`attach`]'s plan without changing anything (`--print-sql` prints its script).
pub async fn plan_attach(
    client: &Client,
    tables: &Tables,
    request: &AttachRequest,
) -> Result<Attached> {
    plan(client, tables, request).await
}

/// Detaches the table: its triggers and function are dropped; its source row, touch-log rows
/// and lake stay (attach again to resume; init to start over). `Ok(None)`: not attached, or
/// detached already.
pub async fn detach(
    client: &mut Client,
    tables: &Tables,
    table: &TableName,
    dry_run: bool,
) -> Result<Option<Capture>> {
    let tx = timed(TIMEOUT, "begin detach", client.transaction()).await?;
    let shape = describe(&tx, table).await?;
    let (sources, touch_log) = qualified_tables(&tx, tables).await?;
    let Some((id, name)) = attached_to(&tx, &sources, &shape.table).await? else {
        timed(TIMEOUT, "end detach", tx.rollback()).await?;
        return Ok(None);
    };
    let capture = Capture {
        source_id: id,
        name,
        table: shape.table,
        key: shape.key,
        excluded: Vec::new(),
        excluded_attnums: Vec::new(),
        columns: Vec::new(),
        sources,
        touch_log,
    };
    // Whatever part of the capture is still there goes (every statement is `IF EXISTS`).
    let any = capture_present(&tx, &capture).await?;
    if dry_run || !any {
        timed(TIMEOUT, "end detach", tx.rollback()).await?;
        return Ok(any.then_some(capture));
    }
    for statement in capture.detach_statements() {
        timed(TIMEOUT, "detach", tx.batch_execute(&statement)).await?;
    }
    timed(TIMEOUT, "commit detach", tx.commit()).await?;
    Ok(Some(capture))
}
