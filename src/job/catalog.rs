//! The lake as its own catalog (docs/design.md §4.8): the readers (`query`, `view`) find the
//! schemas by listing the manifests and name each after the `schema_name` its writers record,
//! so reading a lake needs the lake's credentials only, not the database's. A manifest written
//! before names were recorded is named from the registry when the database answers, else
//! `schema_<id>`.

use std::collections::BTreeMap;

use futures::{StreamExt, TryStreamExt, stream};

use super::Context;
use crate::config::check_schema_name;
use crate::error::{Error, Result};
use crate::lake::manifest::{self, Manifest};
use crate::source::registry::Registered;

/// Manifests loaded at once.
const LOADS_AT_ONCE: usize = 8;

/// One schema the lake holds, with its newest manifest (loaded once).
#[derive(Debug, Clone)]
pub struct LakeSchema {
    /// Its name and id.
    pub reg: Registered,
    /// Its newest manifest.
    pub manifest: Manifest,
}

/// Every schema with a manifest in the lake (or those `selectors` name, by name or id), by id.
/// A selector that names no schema of the lake is an error listing the ones there are.
pub async fn lake_schemas(ctx: &Context, selectors: &[String]) -> Result<Vec<LakeSchema>> {
    let (store, layout) = (ctx.lake.store.as_ref(), &ctx.lake.layout);
    let prefix = layout.manifest_list_prefix();
    let listed = store.list(prefix).await.map_err(|source| Error::Storage {
        op: "list manifests under",
        key: prefix.to_string(),
        source,
    })?;
    let mut ids: Vec<i16> = listed
        .iter()
        .filter_map(|m| layout.manifest_schema(&m.key))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let loaded: Vec<(i16, Option<manifest::Loaded>)> = stream::iter(ids)
        .map(|id| async move {
            let key = layout.manifest_key(id);
            let m = manifest::load_within(store, &key, id, layout.limits()).await?;
            Ok::<_, Error>((id, m))
        })
        .buffered(LOADS_AT_ONCE)
        .try_collect()
        .await?;
    let mut registry: Option<BTreeMap<i16, String>> = None;
    let mut all = Vec::new();
    for (id, m) in loaded {
        // Gone since the listing (a schema's manifest is never deleted by lakecdc).
        let Some(m) = m else { continue };
        let recorded = m.manifest.schema_name.clone().filter(|n| {
            let ok = check_schema_name(n).is_ok();
            if !ok {
                tracing::warn!(
                    schema_id = id,
                    "the manifest records a schema name that is not one: ignored"
                );
            }
            ok
        });
        let name = match recorded {
            Some(n) => n,
            None => {
                if registry.is_none() {
                    registry = Some(registry_names(ctx).await);
                }
                registry
                    .as_ref()
                    .and_then(|r| r.get(&id).cloned())
                    .unwrap_or_else(|| format!("schema_{id}"))
            }
        };
        all.push(LakeSchema {
            reg: Registered {
                name,
                id,
                kind: Default::default(),
            },
            manifest: m.manifest,
        });
    }
    select(all, selectors, &store.describe())
}

/// The registry's names, or none when the database does not answer (the reader goes on).
async fn registry_names(ctx: &Context) -> BTreeMap<i16, String> {
    match super::select_schemas(ctx, &[]).await {
        Ok(regs) => regs.into_iter().map(|r| (r.id, r.name)).collect(),
        Err(e) => {
            tracing::warn!(
                error = %e.chain(),
                "a manifest records no schema name (written before names were recorded) and the registry cannot be read: its view is named schema_<id> until the schema's next save"
            );
            BTreeMap::new()
        }
    }
}

fn select(all: Vec<LakeSchema>, selectors: &[String], lake: &str) -> Result<Vec<LakeSchema>> {
    if selectors.is_empty() {
        return Ok(all);
    }
    let mut out: Vec<LakeSchema> = Vec::new();
    for sel in selectors {
        let found = all
            .iter()
            .find(|s| s.reg.name == *sel || sel.parse::<i16>().is_ok_and(|id| id == s.reg.id))
            .ok_or_else(|| {
                let known: Vec<String> = all
                    .iter()
                    .map(|s| format!("{}={}", s.reg.name, s.reg.id))
                    .collect();
                Error::config(format!(
                    "--schema {} has no manifest in the lake {lake} (schemas there: {}); run lakecdc init or flush for it, or fix the name",
                    crate::config::escape_name(sel),
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                ))
            })?;
        if !out.iter().any(|s| s.reg.id == found.reg.id) {
            out.push(found.clone());
        }
    }
    out.sort_by_key(|s| s.reg.id);
    Ok(out)
}

pub use crate::source::registry::view_name_clashes;

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(name: &str, id: i16) -> Registered {
        Registered {
            name: name.into(),
            id,
            kind: Default::default(),
        }
    }

    #[test]
    fn names_that_duckdb_takes_for_one_view_clash() {
        let (a, b, c, d, e) = (
            reg("orders", 1),
            reg("Orders", 2),
            reg("orders__History", 3),
            reg("customer", 4),
            reg("customer_history", 5),
        );
        let pairs = |regs: &[&Registered]| -> Vec<(usize, usize)> {
            view_name_clashes(regs)
                .into_iter()
                .map(|(i, j, _)| (i, j))
                .collect()
        };
        assert_eq!(pairs(&[&a, &b, &c, &d, &e]), vec![(0, 1), (0, 2), (1, 2)]);
        assert!(pairs(&[&a, &d, &e]).is_empty());
        let text = |x: &Registered, y: &Registered| view_name_clashes(&[x, y])[0].2.to_string();
        let ab = text(&a, &b);
        assert!(
            ab.contains(
                "\"orders\" (id 1) and \"Orders\" (id 2) would both be the view \"orders\""
            ),
            "{ab}"
        );
        assert!(text(&a, &c).contains("the view \"orders__history\""));
        assert!(text(&c, &a).contains("the view \"orders__History\""));
        assert_eq!(view_name_clashes(&[&a, &b])[0].2.exit_code(), 2);
    }
}
