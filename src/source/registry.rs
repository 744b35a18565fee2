//! The schema registry table: `schema_name ↔ schema_id`. A registered name becomes a file
//! name in the schema directory and a word in logs, so every name read is checked
//! ([`check_schema_name`]) before any job uses it (docs/hazards.md S6).

use tokio_postgres::Client;

use super::connect::timed;
use crate::config::{TableName, check_schema_name};
use crate::error::{Error, Result};

/// A registered schema or table source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// The schema name.
    pub name: String,
    /// Its id.
    pub id: i16,
    /// A forma schema or an attached table.
    pub kind: Kind,
}

/// What a registered id exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kind {
    /// A schema of the entity store (`schema_registry`).
    #[default]
    Schema,
    /// An attached table (`lakecdc_sources`, docs/design.md §9).
    Table,
}

/// Every registered schema and table source, by id (ids are shared, docs/design.md §9).
pub(crate) async fn list_all(
    client: &Client,
    tables: &crate::config::Tables,
) -> Result<Vec<Registered>> {
    let mut all = list(client, &tables.registry).await?;
    for (id, name) in super::table_source::list(client, tables).await? {
        all.push(Registered {
            name,
            id,
            kind: Kind::Table,
        });
    }
    all.sort_by_key(|r| r.id);
    Ok(all)
}

/// What reading the registry is called in errors.
const READ_OP: &str = "read schema registry";

/// Every registered schema, by id. A name that breaks the schema-name rule refuses the whole
/// registry: one error naming the row's id, the name escaped.
pub(crate) async fn list(client: &Client, table: &TableName) -> Result<Vec<Registered>> {
    let sql = format!(
        "SELECT schema_name, schema_id FROM {} ORDER BY schema_id",
        table.quoted()
    );
    let rows = timed(
        std::time::Duration::from_secs(60),
        READ_OP,
        client.query(&sql, &[]),
    )
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        let name: String = r
            .try_get(0)
            .map_err(Error::postgres(format!("{READ_OP}: schema_name")))?;
        let id: i16 = r
            .try_get(1)
            .map_err(Error::postgres(format!("{READ_OP}: schema_id")))?;
        out.push(checked(table, name, id)?);
    }
    Ok(out)
}

/// A registry row, once its name passed [`check_schema_name`].
fn checked(table: &TableName, name: String, id: i16) -> Result<Registered> {
    match check_schema_name(&name) {
        Ok(()) => Ok(Registered {
            name,
            id,
            kind: Kind::Schema,
        }),
        Err(e) => Err(Error::decode(
            READ_OP,
            format!("schema_id {id} in {}: {e}; rename it there", table.quoted()),
        )),
    }
}

/// Resolves `--schema` selectors (names or ids) against the registry; empty means all.
/// An unknown selector is a configuration error naming it.
pub(crate) fn select(all: &[Registered], selectors: &[String]) -> Result<Vec<Registered>> {
    if selectors.is_empty() {
        return Ok(all.to_vec());
    }
    let mut out: Vec<Registered> = Vec::new();
    for sel in selectors {
        if sel.parse::<i16>().is_err() {
            check_schema_name(sel).map_err(|e| Error::setting("schema", e.to_string()))?;
        }
        let found = all
            .iter()
            .find(|r| r.name == *sel || sel.parse::<i16>().is_ok_and(|id| id == r.id))
            .ok_or_else(|| {
                Error::config(format!(
                    "--schema {sel:?} is not registered (known: {}); run init-db or fix the name",
                    all.iter()
                        .map(|r| format!("{}={}", r.name, r.id))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
        if !out.contains(found) {
            out.push(found.clone());
        }
    }
    out.sort_by_key(|r| r.id);
    Ok(out)
}

/// The schemas of `regs` whose views DuckDB would take for one (its names ignore ASCII case):
/// `Orders` meets `orders`, and a schema named `x__history` meets `x`'s history. Returns each
/// clashing pair (first, second index, in order) with the error that names both.
pub fn view_name_clashes(regs: &[&Registered]) -> Vec<(usize, usize, Error)> {
    let mut out = Vec::new();
    for (i, a) in regs.iter().enumerate() {
        for (j, b) in regs.iter().enumerate().skip(i + 1) {
            if let Some(view) = shared_view(a, b) {
                out.push((i, j, clash(a, b, &view)));
            }
        }
    }
    out
}

/// The first view of `a` (as `a` spells it) that is also one of `b`'s to DuckDB.
fn shared_view(a: &Registered, b: &Registered) -> Option<String> {
    crate::config::shared_view(&a.name, &b.name)
}

/// The error for schemas `a` and `b` both making `view`.
fn clash(a: &Registered, b: &Registered, view: &str) -> Error {
    Error::ViewNameClash {
        first: crate::config::escape_name(&a.name),
        first_id: a.id,
        second: crate::config::escape_name(&b.name),
        second_id: b.id,
        view: crate::config::escape_name(view),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_by_name_or_id() {
        let all = vec![
            Registered {
                name: "a".into(),
                id: 100,
                kind: Kind::Schema,
            },
            Registered {
                name: "b".into(),
                id: 101,
                kind: Kind::Schema,
            },
        ];
        assert_eq!(select(&all, &[]).unwrap(), all);
        assert_eq!(
            select(&all, &["101".into(), "a".into(), "b".into()]).unwrap(),
            all
        );
        let e = select(&all, &["zzz".into()]).unwrap_err().to_string();
        assert!(e.contains("\"zzz\"") && e.contains("a=100"), "{e}");
        // A selector that could not be a schema name is refused by the same rule.
        let e = select(&all, &["../a".into()]).unwrap_err().to_string();
        assert!(e.contains("is not a valid schema name"), "{e}");
    }

    #[test]
    fn a_registry_name_that_is_not_a_plain_file_name_is_refused() {
        let table = TableName::parse("registry-table", "schema_registry").unwrap();
        assert_eq!(
            checked(&table, "customer".into(), 100).unwrap(),
            Registered {
                name: "customer".into(),
                id: 100,
                kind: Kind::Schema,
            }
        );
        for (name, shown) in [
            ("../evil/pwn", r#""../evil/pwn""#),
            ("/etc/passwd", r#""/etc/passwd""#),
            ("..", r#""..""#),
            ("a\u{1b}]0;owned\u{7}", r#""a\x1b]0;owned\x07""#),
        ] {
            let e = checked(&table, name.into(), 7).unwrap_err();
            let text = e.to_string();
            assert!(matches!(e, Error::Decode { .. }), "{e:?}");
            assert!(
                text.starts_with(&format!(
                    "read schema registry: schema_id 7 in \"schema_registry\": {shown} is not a valid schema name"
                )),
                "{text}"
            );
            assert!(
                !text.contains('\n') && !text.chars().any(char::is_control),
                "{text:?}"
            );
        }
    }
}
