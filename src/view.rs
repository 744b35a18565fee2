//! `lakecdc view`: how any engine reads a schema's current state (docs/design.md §4.7). As text,
//! `CREATE OR REPLACE VIEW` statements for DuckDB over the listed files' absolute URIs, pinned
//! to the manifest version in a comment; as JSON, the read plan (every file with its checksum,
//! rows and row-id range, and the rule in words). Reads one manifest per schema, found and named
//! from the lake itself; no lock, no database, no object is read or written.

use serde::Serialize;

use crate::engine::schema_views;
use crate::error::Result;
use crate::job::{Context, catalog};
use crate::lake::manifest::Manifest;
use crate::report::label;
use crate::source::registry::Registered;

/// The read rule in words, for engines that implement it themselves.
pub const RULE: &str = "read every listed file (columns by name: later files may add columns); per row_id keep the copy with the highest changed_at, and on a tie the one with a deleted_at above 0; drop the row when that copy has a deleted_at above 0";

/// What `view` prints.
#[derive(Debug, Clone, Default)]
pub struct ViewOptions {
    /// Schemas by name or id; empty means all.
    pub schemas: Vec<String>,
}

/// One listed file of the read plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlanFile {
    /// Where to read it.
    pub uri: String,
    /// `base` or `delta`.
    pub tier: String,
    /// Rows (copies) in the file.
    pub rows: i64,
    /// Bytes.
    pub bytes: i64,
    /// `sha256:<hex>`, when the writer recorded one.
    pub checksum: Option<String>,
    /// The smallest `row_id` in the file.
    pub row_id_min: String,
    /// The largest `row_id` in the file.
    pub row_id_max: String,
}

/// The read plan of one schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SchemaView {
    /// The schema's id.
    pub schema_id: i16,
    /// The schema's name (the view's name).
    pub schema: String,
    /// Where its manifest is.
    pub manifest: String,
    /// The manifest version read; `None` when there is no manifest yet.
    pub version: Option<i64>,
    /// The rule, in words.
    pub rule: &'static str,
    /// Every listed file.
    pub files: Vec<PlanFile>,
    /// The DuckDB statements; `None` when there is nothing to read or a problem.
    pub sql: Option<String>,
    /// Why there is no SQL (a foreign path in the manifest).
    pub problem: Option<String>,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ViewReport {
    /// Per schema, by id.
    pub schemas: Vec<SchemaView>,
}

impl ViewReport {
    /// 0, or 3 when a manifest lists a path that is not a data file of its schema, or two
    /// schemas' views would have one name.
    pub fn exit_code(&self) -> i32 {
        if self.schemas.iter().any(|s| s.problem.is_some()) {
            3
        } else {
            0
        }
    }

    /// The statements, each schema's after a comment naming its manifest version.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        if self.schemas.is_empty() {
            out.push_str(
                "-- no schema in the lake: no manifest yet (lakecdc init or flush writes one), or --lake names another place\n",
            );
        }
        for s in &self.schemas {
            let head = format!("-- {} (schema id {}): ", s.schema, s.schema_id);
            match (&s.problem, s.version, &s.sql) {
                (Some(p), ..) => out.push_str(&format!("{head}not readable: {p}\n")),
                (None, None, _) => out.push_str(&format!("{head}no manifest yet\n")),
                (None, Some(v), None) => {
                    out.push_str(&format!(
                        "{head}manifest {} version {v} lists no file\n",
                        s.manifest
                    ));
                }
                (None, Some(v), Some(sql)) => out.push_str(&format!(
                    "{head}manifest {} version {v}, {} files\n{sql}\n",
                    s.manifest,
                    s.files.len()
                )),
            }
        }
        out
    }
}

/// Builds the read plan and the statements of every schema the lake holds (or those selected),
/// named from the lake itself ([`catalog::lake_schemas`]): no database is needed.
/// Two schemas whose views DuckDB would take for one get no statement (docs/hazards.md R7).
pub async fn run(ctx: &Context, opts: &ViewOptions) -> Result<ViewReport> {
    let found = catalog::lake_schemas(ctx, &opts.schemas).await?;
    let mut clash: Vec<Option<String>> = vec![None; found.len()];
    let regs: Vec<&Registered> = found.iter().map(|s| &s.reg).collect();
    for (a, b, e) in catalog::view_name_clashes(&regs) {
        let problem = e.to_string();
        clash[a].get_or_insert_with(|| problem.clone());
        clash[b].get_or_insert(problem);
    }
    let schemas = found
        .into_iter()
        .zip(clash)
        .map(|(s, clash)| view_schema(ctx, &s.reg, s.manifest, clash))
        .collect();
    Ok(ViewReport { schemas })
}

/// The read plan of one schema; none when `clash` says why its views cannot be made.
fn view_schema(ctx: &Context, reg: &Registered, m: Manifest, clash: Option<String>) -> SchemaView {
    let (store, layout) = (ctx.lake.store.as_ref(), &ctx.lake.layout);
    let key = layout.manifest_key(reg.id);
    let mut view = SchemaView {
        schema_id: reg.id,
        schema: reg.name.clone(),
        manifest: store.uri(&key),
        version: Some(m.version),
        rule: RULE,
        files: Vec::new(),
        sql: None,
        problem: None,
    };
    if clash.is_some() {
        view.problem = clash;
        return view;
    }
    for f in &m.files {
        // Only this schema's own data files are ever named (docs/security.md).
        if let Err(foreign) = layout.check_listed(reg.id, &f.path) {
            view.problem = Some(foreign.to_string());
            view.files.clear();
            return view;
        }
        view.files.push(PlanFile {
            uri: store.uri(&f.path),
            tier: label(&f.tier),
            rows: f.row_count,
            bytes: f.size_bytes,
            checksum: f.checksum.clone(),
            row_id_min: f.row_id_min.clone(),
            row_id_max: f.row_id_max.clone(),
        });
    }
    if !view.files.is_empty() {
        match statements(&reg.name, &view.files) {
            Ok(sql) => view.sql = Some(sql),
            Err(e) => {
                view.problem = Some(e.to_string());
                view.files.clear();
            }
        }
    }
    view
}

/// `<name>__history` (every listed copy) and `<name>` (its current state) over `files`.
fn statements(name: &str, files: &[PlanFile]) -> Result<String> {
    schema_views(name, files.iter().map(|f| f.uri.as_str()), false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lake_without_schemas_says_so() {
        let text = ViewReport { schemas: vec![] }.to_text();
        assert!(text.starts_with("-- no schema in the lake"), "{text}");
        assert_eq!(ViewReport { schemas: vec![] }.exit_code(), 0);
    }

    #[test]
    fn the_statements_quote_names_and_uris() {
        let file = |uri: &str| PlanFile {
            uri: uri.into(),
            tier: "delta".into(),
            rows: 1,
            bytes: 1,
            checksum: None,
            row_id_min: String::new(),
            row_id_max: String::new(),
        };
        let sql = statements(
            "my\"schema",
            &[file("/l/a.parquet"), file("/l/o'b.parquet")],
        )
        .unwrap();
        assert!(sql.starts_with(
            "CREATE OR REPLACE VIEW \"my\"\"schema__history\" AS SELECT * FROM read_parquet(['/l/a.parquet', '/l/o''b.parquet'], union_by_name = true, hive_partitioning = false);\n"
        ), "{sql}");
        assert!(sql.contains("CREATE OR REPLACE VIEW \"my\"\"schema\" AS SELECT * FROM \"my\"\"schema__history\" QUALIFY row_number() OVER (PARTITION BY row_id"), "{sql}");
        assert!(
            sql.ends_with(") = 1 AND COALESCE(deleted_at, 0) = 0;"),
            "{sql}"
        );
    }
}
