//! One line of the doctor's checklist: which check, how it went, what was found and, when it
//! did not pass, how to mend it.

use serde::Serialize;

/// How a check went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Passed.
    Ok,
    /// Not run: it needs something an earlier check found broken (named in the detail).
    Skip,
    /// Works, but needs attention.
    Warn,
    /// Broken: the jobs will fail or misbehave.
    Fail,
}

impl Status {
    /// The word printed at the start of the line.
    pub fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Skip => "skip",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// The checks, in the order they run and are listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// PostgreSQL answers, and its version.
    Postgres,
    /// The role's privileges on the source tables and advisory locks.
    Privileges,
    /// The `change_log` index.
    ChangeLogIndex,
    /// Every registered schema has its metadata, every bound column exists.
    SchemaDir,
    /// The lake's store answers a listing.
    LakeReachable,
    /// One object round-trips: put, get, delete.
    RoundTrip,
    /// The store refuses stale conditional writes.
    ConditionalWrites,
    /// The clocks of this host, PostgreSQL and the store agree.
    ClockSkew,
    /// Data-prefix owner markers and the manifests' source identity.
    Ownership,
}

impl Kind {
    /// Every check, in order.
    pub const ALL: [Kind; 9] = [
        Kind::Postgres,
        Kind::Privileges,
        Kind::ChangeLogIndex,
        Kind::SchemaDir,
        Kind::LakeReachable,
        Kind::RoundTrip,
        Kind::ConditionalWrites,
        Kind::ClockSkew,
        Kind::Ownership,
    ];

    /// What the check checks, as the report names it.
    pub fn title(self) -> &'static str {
        match self {
            Kind::Postgres => "PostgreSQL reachable",
            Kind::Privileges => "privileges on the source tables",
            Kind::ChangeLogIndex => "change_log index",
            Kind::SchemaDir => "schema directory matches the registry",
            Kind::LakeReachable => "lake reachable",
            Kind::RoundTrip => "object put, get and delete",
            Kind::ConditionalWrites => "conditional writes",
            Kind::ClockSkew => "clock skew",
            Kind::Ownership => "lake ownership and source identity",
        }
    }
}

/// One line of the checklist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Which check (the JSON carries its title).
    #[serde(skip)]
    pub kind: Kind,
    /// How it went.
    pub status: Status,
    /// What was checked.
    pub check: &'static str,
    /// What was found.
    pub detail: String,
    /// How to mend it (warn and fail; empty otherwise).
    pub fix: String,
}

impl Check {
    /// A passed check.
    pub fn ok(kind: Kind, detail: impl Into<String>) -> Self {
        Self::new(kind, Status::Ok, detail, "")
    }

    /// A check needing attention.
    pub fn warn(kind: Kind, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::new(kind, Status::Warn, detail, fix)
    }

    /// A failed check.
    pub fn fail(kind: Kind, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::new(kind, Status::Fail, detail, fix)
    }

    /// A check not run because `why` (an earlier check's failure).
    pub fn skip(kind: Kind, why: impl Into<String>) -> Self {
        Self::new(
            kind,
            Status::Skip,
            format!("not checked: {}", why.into()),
            "",
        )
    }

    fn new(kind: Kind, status: Status, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            kind,
            status,
            check: kind.title(),
            detail: detail.into(),
            fix: fix.into(),
        }
    }
}
