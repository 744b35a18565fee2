//! Change capture of a table source (docs/design.md §9.1): the DDL `lakecdc attach` runs in one
//! transaction and `--print-sql` prints. The registry of table sources (`lakecdc_sources`), the
//! touch log (`lakecdc_touch`, an append-only table without an index, and its statement
//! sequence) and, per table, one trigger function with statement-level `AFTER INSERT / UPDATE /
//! DELETE` triggers over transition tables (one insert per statement, whatever its row count)
//! and a `TRUNCATE` trigger that records that the source needs `init`.
//!
//! Each statement appends one touch per touched row: the row's `row_id`, the statement's
//! sequence number and clock time, whether the row is gone, and (for a hashed key) the key. An
//! `UPDATE` is the set of keys it leaves (gone) and the set it writes (live): a primary-key
//! update is a delete of the old key and an insert of the new one. Nothing is looked up and no
//! index is maintained on the application's path: flush folds the touches of a row into one
//! version (docs/design.md §9.2). The function is `SECURITY DEFINER` with a pinned
//! `search_path` and names every object fully qualified, so the application's roles need no
//! grant on the touch log and cannot redirect what the trigger writes.

use crate::config::{TableName, quote_ident as ident};

/// The key column types whose text form does not depend on session settings (`DateStyle`,
/// `TimeZone`, `extra_float_digits`): a derived `row_id` must be the same in every session.
pub const KEY_TYPES: &[&str] = &[
    "smallint",
    "integer",
    "bigint",
    "numeric",
    "text",
    "character varying",
    "character",
    "uuid",
    "boolean",
];

/// One primary-key column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyColumn {
    /// Its name.
    pub name: String,
    /// Its type, as `format_type` spells it without modifiers (e.g. `bigint`, `uuid`).
    pub type_name: String,
}

/// An exported column of a table source, as attach records it (a later type change is to be
/// refused until `init`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SourceColumn {
    /// Its name.
    pub name: String,
    /// Its PostgreSQL type, as `format_type` shows it.
    pub pg_type: String,
    /// Its type in the lake ([`super::table_types::LakeType::describe`]).
    pub lake_type: String,
    /// Its name in the lake: its own, unless that is a lake system column's
    /// (`schema_id`, `row_id`, `changed_at`, `deleted_at`, `ltbase_*`, compared as DuckDB
    /// compares names): then `pg_<name>`.
    pub lake_name: String,
    /// Its lake type.
    #[serde(skip)]
    pub lake: super::table_types::LakeType,
    /// Whether it has a default or is generated: added so, it filled rows no touch recorded.
    #[serde(skip)]
    pub filled: bool,
}

/// The exported columns as `lakecdc_sources.columns` records them.
pub fn columns_json(columns: &[SourceColumn]) -> serde_json::Value {
    serde_json::Value::Array(
        columns
            .iter()
            .map(|c| {
                serde_json::json!({"name": c.name, "pg_type": c.pg_type, "lake_type": c.lake_type, "lake_name": c.lake_name})
            })
            .collect(),
    )
}

/// The lake name of a table column `name` ([`SourceColumn::lake_name`]).
pub fn lake_name(name: &str) -> String {
    let system = crate::schema::columns::SYSTEM_COLUMNS
        .iter()
        .any(|(s, _)| s.eq_ignore_ascii_case(name));
    if system {
        format!("pg_{name}")
    } else {
        name.to_string()
    }
}

/// Everything the capture DDL of one table source is generated from. Every table name is
/// schema-qualified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capture {
    /// The source id (shared with the schemas' ids).
    pub source_id: i16,
    /// The source's name (`--schema NAME`).
    pub name: String,
    /// The captured table.
    pub table: TableName,
    /// Its primary key, in key order.
    pub key: Vec<KeyColumn>,
    /// Columns left out of the lake.
    pub excluded: Vec<String>,
    /// Their `attnum`s: a renamed excluded column stays out (docs/hazards.md L77).
    pub excluded_attnums: Vec<i16>,
    /// The exported columns, recorded with the source.
    pub columns: Vec<SourceColumn>,
    /// `lakecdc_sources`.
    pub sources: TableName,
    /// `lakecdc_touch`.
    pub touch_log: TableName,
}

/// A PostgreSQL string literal.
fn literal(s: &str) -> String {
    format!("'{}'", crate::config::sql_string(s))
}

/// The `CREATE TABLE` of the table sources' registry.
pub fn sources_ddl(sources: &TableName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\n    source_id SMALLINT PRIMARY KEY,\n    name TEXT UNIQUE NOT NULL,\n    kind TEXT NOT NULL DEFAULT 'table' CHECK (kind = 'table'),\n    table_schema TEXT NOT NULL,\n    table_name TEXT NOT NULL,\n    key_columns TEXT[] NOT NULL,\n    excluded_columns TEXT[] NOT NULL DEFAULT '{{}}',\n    excluded_attnums SMALLINT[],\n    columns JSONB NOT NULL DEFAULT '[]',\n    attached_at BIGINT NOT NULL,\n    needs_init_at BIGINT,\n    version_floor BIGINT NOT NULL DEFAULT 0,\n    UNIQUE (table_schema, table_name)\n)",
        sources.quoted()
    )
}

/// The touch log's `CREATE TABLE` and the sequence that numbers statements. One row per
/// touched row per statement: `seq` orders a row's touches (statements on one row are
/// serialized by its lock, so a later one draws a larger number), `touched_at` is the
/// statement's clock time in ms, `deleted` whether the statement left the row gone, `key` the
/// key as JSON (NULL when the `row_id` holds the key), so an export finds a derived `row_id`'s
/// row through the primary key. No index: the application pays one heap append per touched
/// row; flush reads a source's touches in one pass and deletes them by tuple address
/// (docs/design.md §9.1). Vacuumed eagerly: it is a queue, emptied by every flush.
pub fn touch_log_ddl(touch_log: &TableName) -> [String; 2] {
    [
        format!(
            "CREATE TABLE IF NOT EXISTS {} (\n    source_id SMALLINT NOT NULL,\n    seq BIGINT NOT NULL,\n    touched_at BIGINT NOT NULL,\n    row_id UUID NOT NULL,\n    deleted BOOLEAN NOT NULL,\n    key JSONB\n) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000)",
            touch_log.quoted()
        ),
        format!(
            "CREATE SEQUENCE IF NOT EXISTS {}",
            touch_seq(touch_log).quoted()
        ),
    ]
}

/// The sequence numbering the capture's statements, beside the touch log.
pub fn touch_seq(touch_log: &TableName) -> TableName {
    touch_log.sibling(&format!("{}_seq", touch_log.name()))
}

/// What ends every refusal of [`capture_tables_problems`].
pub(super) const CAPTURE_TABLES_FIX: &str = "the capture would run its code on every write; drop it (or make it as lakecdc creates it) and attach again";

/// The query naming (`name`, `problem`) each of the registry, the touch log and the statement
/// sequence that runs code lakecdc did not write (docs/hazards.md S18): the capture function
/// writes them as its owner on every application write, and flush deletes touches as its own
/// role. Each must be a plain table (a sequence) with no trigger and no rule; with `owned`
/// (attach, which would adopt what `IF NOT EXISTS` finds), also owned by a role the current
/// one has the privileges of, so no other role made it first (its owner could add code at any
/// time). Flush and init may run as another role than the tables' owner: they check the code
/// alone. Objects that do not exist yet are not named.
pub(super) fn capture_tables_problems(
    sources: &TableName,
    touch_log: &TableName,
    owned: bool,
) -> String {
    format!(
        "SELECT name, problem FROM (SELECT e.name, e.n, CASE \
           WHEN c.relkind::text <> e.want THEN 'is not a plain ' || \
             CASE e.want WHEN 'S' THEN 'sequence' ELSE 'table' END \
           WHEN {owned} AND NOT pg_has_role(current_user, c.relowner, 'USAGE') THEN \
             'belongs to role ' || quote_ident(pg_get_userbyid(c.relowner)) || \
             ', whose privileges this role does not have' \
           WHEN EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal) \
             OR EXISTS (SELECT 1 FROM pg_rewrite w WHERE w.ev_class = c.oid) \
             THEN 'has triggers or rules lakecdc did not make' END AS problem \
         FROM (VALUES ({}, 'r', 1), ({}, 'r', 2), ({}, 'S', 3)) AS e(name, want, n) \
         JOIN pg_class c ON c.oid = to_regclass(e.name)) p \
         WHERE problem IS NOT NULL ORDER BY n",
        literal(&sources.quoted()),
        literal(&touch_log.quoted()),
        literal(&touch_seq(touch_log).quoted()),
    )
}

/// The integer key types whose `row_id` encodes the key itself, in order.
pub(crate) const INTEGER_KEYS: &[&str] = &["smallint", "integer", "bigint"];

/// How a source's `row_id` comes from its primary key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowIdRule {
    /// One `uuid` column: the key is the `row_id`.
    Key,
    /// One integer column: the source id and the key, order-preserving, in the `row_id`'s bits.
    Integer,
    /// Anything else: `md5` of the source id and the key's text.
    Hashed,
}

impl RowIdRule {
    /// The rule for `key`.
    pub fn of(key: &[KeyColumn]) -> Self {
        match key {
            [only] if only.type_name == "uuid" => Self::Key,
            [only] if INTEGER_KEYS.contains(&only.type_name.as_str()) => Self::Integer,
            _ => Self::Hashed,
        }
    }

    /// Its name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Key => "key",
            Self::Integer => "integer",
            Self::Hashed => "hashed",
        }
    }
}

/// The `row_id` of integer key `key` of source `source_id` ([`row_id_expr`]'s integer rule,
/// computed here: flush reads a dense page by key range and matches rows to touches by it).
pub fn integer_row_id(source_id: i16, key: i64) -> uuid::Uuid {
    let mut b = [0u8; 16];
    b[..2].copy_from_slice(&source_id.to_be_bytes());
    b[8..].copy_from_slice(&((key as u64) ^ (1 << 63)).to_be_bytes());
    uuid::Uuid::from_bytes(b)
}

/// The `row_id`s of a hashed key's rows from their `ROW(key…)::text` (its bytes in the
/// database's encoding): [`row_id_expr`]'s hashed rule, computed here — flush's table scan
/// finds a dense page's rows by it instead of a lookup per row.
#[derive(Clone)]
pub struct HashedRowId(md5::Md5);

impl HashedRowId {
    /// The rule of source `source_id`.
    pub fn new(source_id: i16) -> Self {
        use md5::Digest;
        Self(md5::Md5::new_with_prefix(
            format!("{source_id}:").as_bytes(),
        ))
    }

    /// The `row_id` of the row whose key text is `key_text`.
    pub fn of(&self, key_text: &[u8]) -> uuid::Uuid {
        use md5::Digest;
        uuid::Uuid::from_bytes(self.0.clone().chain_update(key_text).finalize().into())
    }
}

/// The integer key an integer rule's `row_id` holds (its last 8 bytes, sign bit flipped back).
pub fn integer_key(row_id: uuid::Uuid) -> i64 {
    let b = row_id.as_bytes();
    let mut tail = [0u8; 8];
    tail.copy_from_slice(&b[8..]);
    (u64::from_be_bytes(tail) ^ (1 << 63)) as i64
}

/// The `row_id` of a row of the table read as `alias` — the same expression in the trigger,
/// init and flush (docs/design.md §9):
/// - one `uuid` column: the key itself;
/// - one integer column: `<source id, 4 hex digits>000000000000<the key with its sign bit
///   flipped, 16 hex digits>`, so row ids sort as the keys do (ranged files stay narrow, reads
///   stay sequential: random ids cost every job) and the key is read back from the `row_id`;
/// - anything else: `md5('<source id>:' || ROW(key…)::text)::uuid`; `ROW(…)::text` quotes every
///   field that needs it, so two keys never share a text.
pub fn row_id_expr(source_id: i16, key: &[KeyColumn], alias: &str) -> String {
    match (RowIdRule::of(key), key) {
        (RowIdRule::Key, [only]) => format!("{alias}.{}", ident(&only.name)),
        (RowIdRule::Integer, [only]) => format!(
            "('{:04x}000000000000' || lpad(to_hex({alias}.{}::int8 # (-9223372036854775807 - 1)), 16, '0'))::uuid",
            source_id,
            ident(&only.name)
        ),
        _ => format!("md5('{source_id}:' || {})::uuid", key_text_expr(key, alias)),
    }
}

/// `ROW(key…)::text` of the row read as `alias`: the text a hashed key's `row_id` hashes.
pub fn key_text_expr(key: &[KeyColumn], alias: &str) -> String {
    let fields: Vec<String> = key
        .iter()
        .map(|k| format!("{alias}.{}", ident(&k.name)))
        .collect();
    format!("ROW({})::text", fields.join(", "))
}

/// The key of a row read as `alias`, as the touch log stores it: JSON of the key columns by
/// name for a hashed key (flush finds the row through it), NULL when the `row_id` holds the key.
pub fn key_json_expr(key: &[KeyColumn], alias: &str) -> String {
    match RowIdRule::of(key) {
        RowIdRule::Key | RowIdRule::Integer => "NULL::jsonb".to_string(),
        RowIdRule::Hashed => {
            let fields: Vec<String> = key
                .iter()
                .map(|k| format!("{}, {alias}.{}", literal(&k.name), ident(&k.name)))
                .collect();
            format!("jsonb_build_object({})", fields.join(", "))
        }
    }
}

impl Capture {
    /// The trigger function, in the table's schema.
    pub fn function(&self) -> TableName {
        self.table
            .sibling(&format!("lakecdc_capture_{}", self.source_id))
    }

    /// How many triggers a capture has ([`Capture::triggers`]).
    pub const TRIGGERS: i64 = 4;

    /// The trigger names alone, as SQL and the catalog queries take them.
    pub fn trigger_names() -> Vec<String> {
        Self::triggers()
            .iter()
            .map(|(n, _)| (*n).to_string())
            .collect()
    }

    /// The trigger names, with the event each fires on.
    pub fn triggers() -> [(&'static str, &'static str); Self::TRIGGERS as usize] {
        [
            ("lakecdc_capture_insert", "INSERT"),
            ("lakecdc_capture_update", "UPDATE"),
            ("lakecdc_capture_delete", "DELETE"),
            ("lakecdc_capture_truncate", "TRUNCATE"),
        ]
    }

    /// The append of the touches of the keys `touched` yields (`row_id`, `key`, `deleted`),
    /// each key once (an `UPDATE`'s two sets are disjoint).
    fn append(&self, touched: &str) -> String {
        format!(
            "INSERT INTO {t} (source_id, seq, touched_at, row_id, deleted, key)
        SELECT {id}, stmt_seq, now_ms, c.row_id, c.deleted, c.key FROM ({touched}) c;",
            t = self.touch_log.quoted(),
            id = self.source_id,
        )
    }

    /// The condition on an `UPDATE`'s old row `o` that its key was left (no new row has it).
    /// A uuid or integer key is its own `row_id`'s content: the keys are compared (a hash
    /// anti-join, no `row_id` computed for the rows an update kept, nearly all of them). A
    /// hashed key is compared as row ids: equal keys may have different texts (a numeric's
    /// scale), hence different row ids.
    fn left_keys(&self) -> String {
        match (RowIdRule::of(&self.key), self.key.as_slice()) {
            (RowIdRule::Key | RowIdRule::Integer, [only]) => format!(
                "NOT EXISTS (SELECT 1 FROM lakecdc_new n WHERE n.{k} = o.{k})",
                k = ident(&only.name)
            ),
            // NOT EXISTS, not NOT IN: it plans as a hash anti-join that may spill, where a
            // NOT IN subplan too large for memory is rescanned for every old row.
            _ => format!(
                "NOT EXISTS (SELECT 1 FROM lakecdc_new n WHERE {} = {})",
                row_id_expr(self.source_id, &self.key, "n"),
                row_id_expr(self.source_id, &self.key, "o")
            ),
        }
    }

    /// The trigger function and the four triggers (idempotent: `CREATE OR REPLACE`, and each
    /// trigger dropped if it exists before it is created).
    pub fn capture_ddl(&self) -> Vec<String> {
        let function = format!(
            "CREATE OR REPLACE FUNCTION {f}() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET standard_conforming_strings = on
AS $lakecdc${body}$lakecdc$",
            f = self.function().quoted(),
            body = self.function_body(),
        );
        // Only the triggers call it: no role may attach it to a table of its own.
        let revoke = format!(
            "REVOKE ALL ON FUNCTION {}() FROM PUBLIC",
            self.function().quoted()
        );
        let mut out = vec![function, revoke];
        out.extend(self.trigger_ddl());
        out
    }

    /// The settings the trigger function runs with, as `pg_proc.proconfig` lists them: a
    /// pinned `search_path` (no object of another schema can stand in for the ones it names),
    /// and standard strings (the key names quoted in its body mean the same in every session:
    /// with `standard_conforming_strings = off` a backslash in one would escape the quote).
    pub const FUNCTION_SETTINGS: [&'static str; 2] = [
        "search_path=pg_catalog, pg_temp",
        "standard_conforming_strings=on",
    ];

    /// The trigger function's body (`pg_proc.prosrc`), by which an installed capture is known
    /// to be this build's: `attach` replaces one that differs.
    pub fn function_body(&self) -> String {
        let new_keys = format!(
            "SELECT {} AS row_id, {} AS key, false AS deleted FROM lakecdc_new n",
            row_id_expr(self.source_id, &self.key, "n"),
            key_json_expr(&self.key, "n")
        );
        let old_keys = format!(
            "SELECT {} AS row_id, {} AS key, true AS deleted FROM lakecdc_old o",
            row_id_expr(self.source_id, &self.key, "o"),
            key_json_expr(&self.key, "o")
        );
        format!(
            "
-- lakecdc change capture of {table} as source {id} (docs/design.md §9.1).
DECLARE
    now_ms bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    stmt_seq bigint;
BEGIN
    -- Fired only by the triggers on {table} (a role given EXECUTE could attach it elsewhere).
    -- Looked up by name without failing: renamed, the table's own writes must still succeed
    -- (and are still captured); flush then names the missing table.
    IF TG_RELID IS DISTINCT FROM coalesce(to_regclass({table_literal}), TG_RELID) THEN
        RAISE EXCEPTION 'lakecdc capture of source {id} fired by another table';
    END IF;
    IF TG_OP <> 'TRUNCATE' THEN
        stmt_seq := nextval({seq_literal}::regclass);
    END IF;
    IF TG_OP = 'INSERT' THEN
        {insert}
    ELSIF TG_OP = 'UPDATE' THEN
        {update}
    ELSIF TG_OP = 'DELETE' THEN
        {delete}
    ELSIF TG_OP = 'TRUNCATE' THEN
        -- Above the mark init's snapshot may have read, whatever the clock: init clears
        -- only the value it read, so a second TRUNCATE in the same millisecond (or after the
        -- clock stepped back) must not write that value again.
        UPDATE {sources} SET needs_init_at = GREATEST(now_ms, coalesce(needs_init_at, 0) + 1)
        WHERE source_id = {id};
    END IF;
    RETURN NULL;
END
",
            table = self.table.quoted(),
            table_literal = literal(&self.table.quoted()),
            id = self.source_id,
            sources = self.sources.quoted(),
            seq_literal = literal(&touch_seq(&self.touch_log).quoted()),
            insert = self.append(&new_keys),
            // The keys written are live; the keys left (a key update) are tombstones.
            update = self.append(&format!(
                "{new_keys} UNION ALL {old_keys} WHERE {}",
                self.left_keys()
            )),
            delete = self.append(&old_keys),
        )
    }

    /// Each trigger dropped if it exists, then created.
    fn trigger_ddl(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (name, event) in Self::triggers() {
            let (referencing, each) = match event {
                "INSERT" => ("REFERENCING NEW TABLE AS lakecdc_new ", "STATEMENT"),
                "UPDATE" => (
                    "REFERENCING OLD TABLE AS lakecdc_old NEW TABLE AS lakecdc_new ",
                    "STATEMENT",
                ),
                "DELETE" => ("REFERENCING OLD TABLE AS lakecdc_old ", "STATEMENT"),
                _ => ("", "STATEMENT"),
            };
            out.push(format!(
                "DROP TRIGGER IF EXISTS {} ON {}",
                ident(name),
                self.table.quoted()
            ));
            out.push(format!(
                "CREATE TRIGGER {} AFTER {event} ON {} {referencing}FOR EACH {each} EXECUTE FUNCTION {}()",
                ident(name),
                self.table.quoted(),
                self.function().quoted()
            ));
            // Also under `session_replication_role = replica` (a subscription's apply,
            // `pg_restore --disable-triggers`): those writes change the table too.
            out.push(format!(
                "ALTER TABLE {} ENABLE ALWAYS TRIGGER {}",
                self.table.quoted(),
                ident(name)
            ));
        }
        out
    }

    /// The source's row in `lakecdc_sources` (kept as it is when already there).
    pub fn register_sql(&self, attached_at: i64) -> String {
        let array = |v: &[String]| {
            let items: Vec<String> = v.iter().map(|s| literal(s)).collect();
            format!("ARRAY[{}]::text[]", items.join(", "))
        };
        let key: Vec<String> = self.key.iter().map(|k| k.name.clone()).collect();
        let columns = columns_json(&self.columns);
        let attnums: Vec<String> = self.excluded_attnums.iter().map(i16::to_string).collect();
        let names = Self::trigger_names();
        // Attached already: only the excluded columns' names and attnums are brought up to
        // date (attach checked they are the same columns), and when the capture was not
        // recording every write (detached, its table recreated, a trigger disabled or
        // dropped), writes went unrecorded: the lake needs an init (docs/hazards.md L86). Run
        // before the capture's DDL, so the triggers counted are the old ones.
        format!(
            "INSERT INTO {} AS s (source_id, name, kind, table_schema, table_name, key_columns, excluded_columns, excluded_attnums, columns, attached_at) VALUES ({}, {}, 'table', {}, {}, {}, {}, ARRAY[{}]::smallint[], {}::jsonb, {attached_at}) ON CONFLICT (source_id) DO UPDATE SET excluded_columns = EXCLUDED.excluded_columns, excluded_attnums = EXCLUDED.excluded_attnums, \
             needs_init_at = CASE WHEN (SELECT count(*) FROM pg_trigger WHERE tgrelid = {}::regclass AND tgname = ANY({}) AND tgenabled <> 'D') < {} THEN GREATEST(EXCLUDED.attached_at, coalesce(s.needs_init_at, 0) + 1) ELSE s.needs_init_at END",
            self.sources.quoted(),
            self.source_id,
            literal(&self.name),
            literal(self.table.schema().unwrap_or("public")),
            literal(self.table.name()),
            array(&key),
            array(&self.excluded),
            attnums.join(", "),
            literal(&columns.to_string()),
            literal(&self.table.quoted()),
            array(&names),
            Self::TRIGGERS,
        )
    }

    /// Every statement of an attach, in order: the registry of sources, the touch log and its
    /// sequence, the source's row, the function and the triggers.
    pub fn attach_statements(&self, attached_at: i64) -> Vec<String> {
        let mut out = vec![sources_ddl(&self.sources)];
        out.extend(touch_log_ddl(&self.touch_log));
        out.push(self.tables_check());
        // A registry made by an earlier build lacks the column.
        out.push(format!(
            "ALTER TABLE {} ADD COLUMN IF NOT EXISTS excluded_attnums SMALLINT[]",
            self.sources.quoted()
        ));
        out.push(self.register_sql(attached_at));
        out.extend(self.capture_ddl());
        // A new source whose table holds rows needs an init before a flush: a flush alone
        // would publish the touched rows only, a lake that looks whole and is not
        // (docs/hazards.md L89). Asked once the triggers hold the table's lock, so no write
        // can slip between the question and the capture; a source attached before keeps its
        // own `attached_at`, so this touches only the row this attach made.
        out.push(format!(
            "UPDATE {} SET needs_init_at = attached_at WHERE source_id = {} AND attached_at = {attached_at} AND needs_init_at IS NULL AND EXISTS (SELECT 1 FROM {})",
            self.sources.quoted(),
            self.source_id,
            self.table.quoted()
        ));
        out
    }

    /// Stops the transaction when the registry, the touch log or the sequence that
    /// `IF NOT EXISTS` found is not as lakecdc makes it ([`capture_tables_problems`]).
    /// `attach` runs the same query first, for an error of its own; the printed script carries
    /// this.
    fn tables_check(&self) -> String {
        format!(
            "DO $lakecdc$
DECLARE
    r record;
BEGIN
    FOR r IN {problems}
    LOOP
        RAISE EXCEPTION 'lakecdc attach: % %: {CAPTURE_TABLES_FIX}', r.name, r.problem;
    END LOOP;
END
$lakecdc$",
            problems = capture_tables_problems(&self.sources, &self.touch_log, true),
        )
    }

    /// The statements of a detach: the triggers and the function go; the source's row, its
    /// touch log rows and the lake stay.
    pub fn detach_statements(&self) -> Vec<String> {
        let mut out: Vec<String> = Self::triggers()
            .iter()
            .map(|(name, _)| {
                format!(
                    "DROP TRIGGER IF EXISTS {} ON {}",
                    ident(name),
                    self.table.quoted()
                )
            })
            .collect();
        out.push(format!(
            "DROP FUNCTION IF EXISTS {}()",
            self.function().quoted()
        ));
        out
    }

    /// `attach --print-sql`: the attach as one transaction a migration tool (or `psql`) runs.
    /// The id was free when printed; the script takes `init-db`'s lock and stops unless the id
    /// (and the name) is still free or already this table's, so two scripts printed at once, or
    /// a schema registered in between, never share an id.
    pub fn script(&self, attached_at: i64, registry: &TableName, lock: i64) -> String {
        let table_schema = literal(self.table.schema().unwrap_or("public"));
        let table_name = literal(self.table.name());
        let mut out = format!(
            "-- lakecdc attach {}: source {} (id {}), docs/design.md §9.\nBEGIN;\n\
             SET LOCAL standard_conforming_strings = on;\n\
             SELECT pg_advisory_xact_lock({lock});\n",
            self.table.quoted(),
            self.name,
            self.source_id
        );
        out.push_str(&sources_ddl(&self.sources));
        out.push_str(";\n");
        out.push_str(&format!(
            "DO $guard$\nDECLARE\n    taken boolean := false;\nBEGIN\n    IF to_regclass({registry}) IS NOT NULL THEN\n        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s WHERE schema_id = $1 OR schema_name = $2)', {registry})\n            INTO taken USING {id}::smallint, {name}::text;\n    END IF;\n    IF taken OR EXISTS (SELECT 1 FROM {sources} WHERE (source_id = {id} OR name = {name})\n                  AND (table_schema, table_name) <> ({table_schema}, {table_name})) THEN\n        RAISE EXCEPTION 'lakecdc attach: source id {id} or name % was taken since this script was printed: print it again', {name};\n    END IF;\nEND\n$guard$;\n",
            registry = literal(&registry.quoted()),
            sources = self.sources.quoted(),
            id = self.source_id,
            name = literal(&self.name),
        ));
        for statement in self.attach_statements(attached_at) {
            out.push_str(&statement);
            out.push_str(";\n");
        }
        out.push_str("COMMIT;\n");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(cols: &[(&str, &str)]) -> Vec<KeyColumn> {
        cols.iter()
            .map(|(n, t)| KeyColumn {
                name: (*n).to_string(),
                type_name: (*t).to_string(),
            })
            .collect()
    }

    #[test]
    fn a_hashed_row_id_computed_here_is_the_sql_one() {
        // PostgreSQL: SELECT md5('7:' || ROW('k1'::text)::text)::uuid,
        //                    md5('7:' || ROW('a b'::text, 3)::text)::uuid
        assert_eq!(
            HashedRowId::new(7).of(b"(k1)").to_string(),
            "952b9d7d-c37d-6b43-0ae9-8c17d529f4ed"
        );
        assert_eq!(
            HashedRowId::new(7).of(br#"("a b",3)"#).to_string(),
            "d67570dd-1b32-f0c8-ec76-c00bf1fe7842"
        );
    }

    #[test]
    fn an_integer_row_id_computed_here_is_the_sql_one_and_sorts_as_the_keys_do() {
        // The SQL rule's text for source 7: '0007000000000000' || the key, sign bit flipped.
        let id = |k: i64| integer_row_id(7, k).to_string();
        assert_eq!(id(1), "00070000-0000-0000-8000-000000000001");
        assert_eq!(id(-1), "00070000-0000-0000-7fff-ffffffffffff");
        assert_eq!(id(i64::MIN), "00070000-0000-0000-0000-000000000000");
        let keys = [i64::MIN, -5, -1, 0, 1, 42, i64::MAX];
        for pair in keys.windows(2) {
            assert!(integer_row_id(7, pair[0]) < integer_row_id(7, pair[1]));
        }
        for k in keys {
            assert_eq!(integer_key(integer_row_id(7, k)), k);
        }
    }

    #[test]
    fn a_uuid_key_is_the_row_id_an_integer_key_is_encoded_and_others_are_hashed() {
        assert_eq!(row_id_expr(7, &key(&[("id", "uuid")]), "n"), "n.\"id\"");
        assert_eq!(
            row_id_expr(7, &key(&[("id", "bigint")]), "n"),
            "('0007000000000000' || lpad(to_hex(n.\"id\"::int8 # (-9223372036854775807 - 1)), 16, '0'))::uuid"
        );
        assert_eq!(
            row_id_expr(7, &key(&[("id", "text")]), "n"),
            "md5('7:' || ROW(n.\"id\")::text)::uuid"
        );
        assert_eq!(
            row_id_expr(7, &key(&[("a\"b", "text"), ("id", "uuid")]), "o"),
            "md5('7:' || ROW(o.\"a\"\"b\", o.\"id\")::text)::uuid"
        );
    }

    #[test]
    fn the_script_is_one_transaction_naming_every_object_qualified() {
        let c = Capture {
            source_id: 103,
            name: "orders".into(),
            table: TableName::parse("t", "shop.orders").unwrap(),
            key: key(&[("id", "bigint")]),
            excluded: vec!["secret's".into()],
            excluded_attnums: vec![3],
            columns: vec![SourceColumn {
                name: "note".into(),
                pg_type: "text".into(),
                lake_type: "UTF8".into(),
                lake_name: "note".into(),
                lake: crate::source::table_types::LakeType::Utf8,
                filled: false,
            }],
            sources: TableName::parse("t", "public.lakecdc_sources").unwrap(),
            touch_log: TableName::parse("t", "public.lakecdc_touch").unwrap(),
        };
        let s = c.script(42, &TableName::parse("t", "schema_registry").unwrap(), 7);
        assert!(
            s.starts_with("-- lakecdc attach") && s.ends_with("COMMIT;\n"),
            "{s}"
        );
        assert!(s.contains("\nBEGIN;\nSET LOCAL standard_conforming_strings = on;\nSELECT pg_advisory_xact_lock(7);\n"));
        assert!(
            s.contains("RAISE EXCEPTION 'lakecdc attach: source id 103"),
            "{s}"
        );
        assert!(
            s.contains("REVOKE ALL ON FUNCTION \"shop\".\"lakecdc_capture_103\"() FROM PUBLIC")
        );
        assert!(
            s.contains("IF TG_RELID IS DISTINCT FROM coalesce(to_regclass('\"shop\".\"orders\"'), TG_RELID) THEN"),
            "{s}"
        );
        assert!(
            s.contains("RAISE EXCEPTION 'lakecdc attach: % %: the capture would run its code"),
            "{s}"
        );
        assert!(s.contains("CREATE OR REPLACE FUNCTION \"shop\".\"lakecdc_capture_103\"()"));
        assert!(s.contains(
            "SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET standard_conforming_strings = on\n"
        ));
        assert!(s.contains(
            "INSERT INTO \"public\".\"lakecdc_touch\" (source_id, seq, touched_at, row_id, deleted, key)"
        ));
        assert!(s.contains("stmt_seq := nextval('\"public\".\"lakecdc_touch_seq\"'::regclass);"));
        assert!(s.contains("CREATE SEQUENCE IF NOT EXISTS \"public\".\"lakecdc_touch_seq\""));
        assert!(s.contains("ARRAY['secret''s']::text[]"), "{s}");
        assert!(
            s.contains("NULL::jsonb AS key"),
            "an integer key is in the row id: {s}"
        );
        for (name, event) in Capture::triggers() {
            assert!(
                s.contains(&format!(
                    "CREATE TRIGGER \"{name}\" AFTER {event} ON \"shop\".\"orders\""
                )),
                "{name}"
            );
        }
        let detach = c.detach_statements().join(";\n");
        assert!(detach.contains("DROP FUNCTION IF EXISTS \"shop\".\"lakecdc_capture_103\"()"));
        assert_eq!(c.detach_statements().len(), 5);
    }
}
