//! The database a lake was written from (docs/design.md §10, "Source identity"). The first
//! writer of a schema's manifest records `source: {system_identifier, database}`; every writer
//! after it (flush, init, compact) and gc refuses a manifest naming another source, so a
//! staging database pointed at the production lake cannot write into it. `--adopt-source`
//! takes a lake over after a restore or a migration (then `verify --source --repair`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// A PostgreSQL database: its cluster's system identifier (`pg_control_system()`, kept as
/// text: JSON readers lose precision past 2^53) and its name (`current_database()`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceIdentity {
    /// The cluster's system identifier, in decimal.
    pub system_identifier: String,
    /// The database name.
    pub database: String,
    /// Fields this version does not know, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl SourceIdentity {
    /// The identity of database `database` in the cluster `system_identifier`.
    pub fn new(system_identifier: i64, database: impl Into<String>) -> Self {
        Self {
            system_identifier: system_identifier.to_string(),
            database: database.into(),
            extra: Map::new(),
        }
    }

    /// How error lines name it. Both fields are quoted and escaped: a manifest's are lake
    /// content, which must not forge a line of output (docs/hazards.md S10).
    pub fn describe(&self) -> String {
        format!(
            "database {:?} of cluster {:?}",
            self.database, self.system_identifier
        )
    }

    fn same(&self, other: &Self) -> bool {
        self.system_identifier == other.system_identifier && self.database == other.database
    }
}

/// What a writer holds to check and stamp manifests: the database it reads and whether it may
/// take over a lake written from another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceGuard {
    /// The database this run reads.
    pub identity: SourceIdentity,
    /// Take over a lake whose manifest names another source (`--adopt-source`).
    pub adopt: bool,
}

impl SourceGuard {
    /// Fails when the manifest at `key`, naming `listed`, names another source (unless
    /// adopting). A manifest naming none (new, or written before identities were recorded)
    /// passes.
    pub fn check(&self, key: &str, listed: Option<&SourceIdentity>) -> Result<()> {
        match listed {
            Some(listed) if !listed.same(&self.identity) && !self.adopt => {
                Err(Error::ForeignSource {
                    key: key.to_string(),
                    lake: listed.describe(),
                    this: self.identity.describe(),
                })
            }
            _ => Ok(()),
        }
    }

    /// [`SourceGuard::check`], then records this run's source in the manifest's `source`
    /// field (a save's modify step).
    pub fn stamp(&self, key: &str, source: &mut Option<SourceIdentity>) -> Result<()> {
        self.check(key, source.as_ref())?;
        if source.as_ref().is_none_or(|s| !s.same(&self.identity)) {
            if let Some(old) = source.as_ref() {
                tracing::warn!(manifest = key, from = %old.describe(), to = %self.identity.describe(), "lake adopted by another source (--adopt-source)");
            }
            *source = Some(self.identity.clone());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lake::Manifest;

    #[test]
    fn a_manifest_of_another_source_is_refused_unless_adopted() {
        let a = SourceIdentity::new(7_714_568_898_475_466_302, "prod");
        let b = SourceIdentity::new(7_714_568_898_475_466_302, "staging");
        let mut m = Manifest::empty(3);
        let guard = |identity: &SourceIdentity, adopt| SourceGuard {
            identity: identity.clone(),
            adopt,
        };
        // First writer stamps.
        guard(&a, false)
            .stamp("manifest/3.json", &mut m.source)
            .unwrap();
        assert_eq!(m.source.as_ref(), Some(&a));
        let json = String::from_utf8(m.to_json().unwrap()).unwrap();
        assert!(
            json.contains(r#""system_identifier": "7714568898475466302""#),
            "{json}"
        );
        // Same source passes; another is refused naming both.
        guard(&a, false)
            .check("manifest/3.json", m.source.as_ref())
            .unwrap();
        let err = guard(&b, false)
            .stamp("manifest/3.json", &mut m.source)
            .unwrap_err();
        let line = err.to_string();
        assert!(
            line.contains("\"prod\"") && line.contains("\"staging\""),
            "{line}"
        );
        assert!(line.contains("--adopt-source"), "{line}");
        assert_eq!(m.source.as_ref(), Some(&a), "a refusal changes nothing");
        // Adopting restamps.
        guard(&b, true)
            .stamp("manifest/3.json", &mut m.source)
            .unwrap();
        assert_eq!(m.source.as_ref(), Some(&b));
    }
}
