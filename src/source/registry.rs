//! The schema registry table: `schema_name ↔ schema_id`.

use tokio_postgres::Client;

use super::connect::timed;
use crate::config::TableName;
use crate::error::{Error, Result};

/// A registered schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// The schema name.
    pub name: String,
    /// Its id.
    pub id: i16,
}

/// Every registered schema, by id.
pub(crate) async fn list(client: &Client, table: &TableName) -> Result<Vec<Registered>> {
    let sql = format!(
        "SELECT schema_name, schema_id FROM {} ORDER BY schema_id",
        table.quoted()
    );
    let rows = timed(
        std::time::Duration::from_secs(60),
        "read schema registry",
        client.query(&sql, &[]),
    )
    .await?;
    Ok(rows
        .iter()
        .map(|r| Registered {
            name: r.get(0),
            id: r.get(1),
        })
        .collect())
}

/// Resolves `--schema` selectors (names or ids) against the registry; empty means all.
/// An unknown selector is a configuration error naming it.
pub(crate) fn select(all: &[Registered], selectors: &[String]) -> Result<Vec<Registered>> {
    if selectors.is_empty() {
        return Ok(all.to_vec());
    }
    let mut out: Vec<Registered> = Vec::new();
    for sel in selectors {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_by_name_or_id() {
        let all = vec![
            Registered {
                name: "a".into(),
                id: 100,
            },
            Registered {
                name: "b".into(),
                id: 101,
            },
        ];
        assert_eq!(select(&all, &[]).unwrap(), all);
        assert_eq!(
            select(&all, &["101".into(), "a".into(), "b".into()]).unwrap(),
            all
        );
        let e = select(&all, &["zzz".into()]).unwrap_err().to_string();
        assert!(e.contains("\"zzz\"") && e.contains("a=100"), "{e}");
    }
}
