//! `lakecdc doctor`: a checklist of everything the jobs rely on, one line per check — `ok`,
//! `warn`, `fail`, or `skip` when an earlier check's failure leaves nothing to check — with what
//! was found and, for warn and fail, the fix (docs/operations.md, `doctor`). It never fails to
//! start because the database or the lake is down: each becomes a failed check. It writes only
//! one probe object under `<lake root>/_doctor/`, deleted before it returns.

use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

use crate::clock::Clock;
use crate::config::Tables;
use crate::error::Error;
use crate::lake::Lake;
use crate::source::Connector;

mod check;
mod lake_checks;
mod skew;
mod source_checks;

pub use check::{Check, Kind, Status};

/// What doctor checks. The lake is opened by the caller, and a failure to open it is reported
/// as the lake check's failure.
#[derive(Debug)]
pub struct DoctorInputs {
    /// PostgreSQL.
    pub connector: Connector,
    /// Source table names.
    pub tables: Tables,
    /// The schema directory, when given.
    pub schema_dir: Option<PathBuf>,
    /// The schemas named (all registered when empty).
    pub schemas: Vec<String>,
    /// The lake, or why it could not be opened.
    pub lake: Result<Lake, Error>,
    /// This host's clock.
    pub clock: Arc<dyn Clock>,
    /// `--adopt-source`: a manifest of another database is a warning, not a failure.
    pub adopt_source: bool,
}

/// The checklist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DoctorReport {
    /// Every check, in order.
    pub checks: Vec<Check>,
    /// Checks that passed, warned, failed and were skipped.
    pub summary: Summary,
}

/// How many checks ended each way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Passed.
    pub ok: usize,
    /// Need attention.
    pub warn: usize,
    /// Failed.
    pub fail: usize,
    /// Not run.
    pub skip: usize,
}

impl DoctorReport {
    fn new(checks: Vec<Check>) -> Self {
        let mut summary = Summary::default();
        for c in &checks {
            *match c.status {
                Status::Ok => &mut summary.ok,
                Status::Warn => &mut summary.warn,
                Status::Fail => &mut summary.fail,
                Status::Skip => &mut summary.skip,
            } += 1;
        }
        Self { checks, summary }
    }

    /// The check of `kind`.
    pub fn get(&self, kind: Kind) -> Option<&Check> {
        self.checks.iter().find(|c| c.kind == kind)
    }

    /// 1 when a check failed, else 0 (warnings and skips alone pass: a skip follows a failure).
    pub fn exit_code(&self) -> i32 {
        i32::from(self.summary.fail > 0)
    }

    /// The checklist as text: `status  check: detail`, and the fix on the next line.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for c in &self.checks {
            let detail = crate::report::printable(&c.detail, false);
            out.push_str(&format!("{:<4}  {}: {detail}\n", c.status.word(), c.check));
            if !c.fix.is_empty() {
                let fix = crate::report::printable(&c.fix, false);
                out.push_str(&format!("      fix: {fix}\n"));
            }
        }
        let s = &self.summary;
        out.push_str(&format!(
            "{} ok, {} warn, {} fail, {} skipped\n",
            s.ok, s.warn, s.fail, s.skip
        ));
        out
    }
}

/// Runs every check. Never fails: whatever goes wrong is a check's failure.
pub async fn run(inputs: &DoctorInputs) -> DoctorReport {
    let clock = inputs.clock.as_ref();
    let source = source_checks::run(
        &inputs.connector,
        &inputs.tables,
        inputs.schema_dir.as_deref(),
        &inputs.schemas,
        clock,
    )
    .await;
    let store = lake_checks::store(&inputs.lake, clock).await;
    let pg_clock = source
        .clock
        .ok_or("PostgreSQL's clock was not read (see above)");
    let skew = skew::check(
        pg_clock,
        store.clock.as_ref().copied().map_err(String::as_str),
    );
    let ownership = lake_checks::ownership(
        &inputs.lake,
        store.reachable,
        &source.schemas,
        &source.guard,
        inputs.adopt_source,
    )
    .await;
    let mut checks = source.checks;
    checks.extend(store.checks);
    checks.push(skew);
    checks.push(ownership);
    DoctorReport::new(checks)
}
