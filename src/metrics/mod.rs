//! Prometheus metrics of every run (docs/operations.md, "Metrics"): `--metrics-file` writes
//! them for node-exporter's textfile collector, `--pushgateway` pushes them. Per run: when it
//! ran and last succeeded, how long it took and how it ended; per schema: what the run wrote
//! (the numbers of its report) and the schema's state after it (dirty rows and the oldest's
//! age, files and bytes per tier, manifest version). Every value is a gauge; names carry their
//! unit (`_seconds`, `_bytes`).

pub mod exposition;
pub mod push;
mod reports;
pub mod state;
pub mod textfile;

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

pub use exposition::Exposition;
pub use push::Pushgateway;
pub use reports::{of_compact, of_flush, of_gc, of_init, of_verify};
pub use state::{SchemaState, TierSize};

/// The metric carried over from the previous file when a run fails.
pub const LAST_SUCCESS: &str = "lakecdc_last_success_timestamp_seconds";

/// Where a run's metrics go.
#[derive(Debug, Clone, Default)]
pub struct MetricsOptions {
    /// The file (`{job}` replaced by the command's name).
    pub file: Option<PathBuf>,
    /// The Pushgateway.
    pub pushgateway: Option<Pushgateway>,
    /// The Pushgateway's `instance` label.
    pub instance: String,
}

impl MetricsOptions {
    /// Whether any destination is set.
    pub fn enabled(&self) -> bool {
        self.file.is_some() || self.pushgateway.is_some()
    }
}

/// Rows, files and bytes a run wrote for a schema.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Written {
    /// Rows exported.
    pub rows: u64,
    /// Files written.
    pub files: u64,
    /// Bytes written.
    pub bytes: u64,
}

/// What a run did for one schema.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchemaRun {
    /// Schema id.
    pub schema_id: i16,
    /// Schema name.
    pub schema: String,
    /// The schema's step failed.
    pub failed: bool,
    /// What a writer wrote.
    pub written: Option<Written>,
    /// verify: divergences found (none when the schema was not checked).
    pub divergences: Option<u64>,
    /// gc: objects deleted, lost deltas.
    pub gc: Option<(u64, u64)>,
}

/// One finished run.
#[derive(Debug, Clone)]
pub struct RunRecord {
    /// The command's name (`flush`, …).
    pub command: &'static str,
    /// When it started.
    pub started: SystemTime,
    /// How long it took.
    pub duration: Duration,
    /// Its exit code: 0 done, 1 failed, 3 done but needs attention.
    pub exit_code: i32,
    /// Per schema, from its report.
    pub schemas: Vec<SchemaRun>,
    /// Per schema, the state after the run.
    pub state: Vec<SchemaState>,
}

impl RunRecord {
    /// A run succeeded when it did its work: exit 0, or 3 (done, with findings that have their
    /// own metrics).
    pub fn succeeded(&self) -> bool {
        matches!(self.exit_code, 0 | 3)
    }
}

fn seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The run's metrics. `last_success` is the previous success time, for a failed run.
pub fn exposition(run: &RunRecord, last_success: Option<f64>) -> Exposition {
    let mut e = Exposition::default();
    let cmd = [("command", run.command)];
    let ended = run.started + run.duration;
    e.gauge(
        "lakecdc_last_run_timestamp_seconds",
        "When the last run of this command ended, Unix time.",
        &cmd,
        seconds(ended),
    );
    let success = if run.succeeded() {
        Some(seconds(ended))
    } else {
        last_success
    };
    if let Some(t) = success {
        e.gauge(
            LAST_SUCCESS,
            "When a run of this command last succeeded (exit 0 or 3), Unix time.",
            &cmd,
            t,
        );
    }
    e.gauge(
        "lakecdc_run_duration_seconds",
        "How long the last run took.",
        &cmd,
        run.duration.as_secs_f64(),
    );
    e.gauge(
        "lakecdc_run_exit_code",
        "The last run's exit code: 0 done, 1 failed, 3 done but needs attention.",
        &cmd,
        f64::from(run.exit_code),
    );
    let outcome = match run.exit_code {
        0 => "done",
        3 => "attention",
        _ => "failed",
    };
    for o in ["done", "attention", "failed"] {
        e.gauge(
            "lakecdc_run_outcome",
            "1 for the last run's outcome (done, attention, failed), 0 for the others.",
            &[("command", run.command), ("outcome", o)],
            if o == outcome { 1.0 } else { 0.0 },
        );
    }
    for s in &run.schemas {
        let id = s.schema_id.to_string();
        let labels = schema_labels(run.command, &s.schema, &id);
        e.gauge(
            "lakecdc_schema_failed",
            "1 when the last run's step for this schema failed.",
            &labels,
            if s.failed { 1.0 } else { 0.0 },
        );
        if let Some(w) = s.written {
            e.gauge(
                "lakecdc_schema_rows_exported",
                "Rows the last run wrote for this schema.",
                &labels,
                w.rows as f64,
            );
            e.gauge(
                "lakecdc_schema_files_written",
                "Files the last run wrote for this schema.",
                &labels,
                w.files as f64,
            );
            e.gauge(
                "lakecdc_schema_bytes_written",
                "Bytes the last run wrote for this schema.",
                &labels,
                w.bytes as f64,
            );
        }
        if let Some(d) = s.divergences {
            e.gauge(
                "lakecdc_verify_divergences",
                "Files failing their checks plus rows diverging from the source, last verify.",
                &labels,
                d as f64,
            );
        }
        if let Some((deleted, lost)) = s.gc {
            e.gauge(
                "lakecdc_gc_objects_deleted",
                "Objects the last gc deleted for this schema.",
                &labels,
                deleted as f64,
            );
            e.gauge(
                "lakecdc_gc_lost_deltas",
                "Unlisted deltas holding rows the lake lacks (gc --repair requeues them).",
                &labels,
                lost as f64,
            );
        }
    }
    for s in &run.state {
        let id = s.schema_id.to_string();
        let labels = schema_labels(run.command, &s.schema, &id);
        e.gauge(
            "lakecdc_dirty_rows",
            "Rows waiting in change_log for a flush, after the last run.",
            &labels,
            s.dirty_rows as f64,
        );
        e.gauge(
            "lakecdc_oldest_dirty_age_seconds",
            "Age of the oldest row waiting for a flush (0 when none), after the last run.",
            &labels,
            s.oldest_dirty_age_s,
        );
        if let Some(v) = s.manifest_version {
            e.gauge(
                "lakecdc_manifest_version",
                "The schema's manifest version after the last run.",
                &labels,
                v as f64,
            );
        }
        let tiers = [("base", s.base), ("delta", s.delta)];
        for (tier, size) in tiers.into_iter().filter_map(|(t, s)| Some((t, s?))) {
            let labels = [labels[0], labels[1], labels[2], ("tier", tier)];
            e.gauge(
                "lakecdc_lake_files",
                "Files listed in the schema's manifest, per tier, after the last run.",
                &labels,
                size.files as f64,
            );
            e.gauge(
                "lakecdc_lake_bytes",
                "Bytes listed in the schema's manifest, per tier, after the last run.",
                &labels,
                size.bytes as f64,
            );
        }
    }
    e
}

/// The labels of a per-schema sample.
fn schema_labels<'a>(
    command: &'a str,
    schema: &'a str,
    id: &'a str,
) -> [(&'static str, &'a str); 3] {
    [("command", command), ("schema", schema), ("schema_id", id)]
}

/// Writes and pushes the run's metrics where `opts` says. A failure is logged, not returned:
/// the job's work is done and its exit code stands; the missing metrics are what the
/// staleness alert watches (docs/operations.md, "Metrics").
pub async fn publish(opts: &MetricsOptions, run: &RunRecord) {
    let mut last_success = None;
    let file = opts
        .file
        .as_ref()
        .map(|t| textfile::path_for(t, run.command));
    if let Some(path) = &file
        && !run.succeeded()
    {
        last_success = textfile::previous(path).and_then(|text| {
            exposition::read_sample(&text, LAST_SUCCESS, &[("command", run.command)])
        });
    }
    if let Some(path) = &file {
        let text = exposition(run, last_success).render();
        match textfile::write(path, &text) {
            Ok(()) => tracing::debug!(path = %path.display(), "metrics written"),
            Err(e) => tracing::error!("{}", e.chain()),
        }
    }
    if let Some(gw) = &opts.pushgateway {
        // A failed run's push leaves the Pushgateway's last success alone (POST, without it).
        let text = exposition(run, None).render();
        let job = format!("lakecdc_{}", run.command.replace('-', "_"));
        match gw.push(&job, &opts.instance, text, run.succeeded()).await {
            Ok(()) => tracing::debug!(pushgateway = gw.describe(), "metrics pushed"),
            Err(e) => tracing::error!("{}", e.chain()),
        }
    }
}

/// The default `instance` label: the host's name.
pub fn host_name() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

/// Whether `value` may be a grouping-key label value in a Pushgateway URL path as is.
pub fn is_url_safe(value: &str) -> bool {
    !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(exit_code: i32) -> RunRecord {
        RunRecord {
            command: "flush",
            started: SystemTime::UNIX_EPOCH + Duration::from_secs(1_000),
            duration: Duration::from_millis(2_500),
            exit_code,
            schemas: vec![SchemaRun {
                schema_id: 7,
                schema: "orders".into(),
                written: Some(Written {
                    rows: 10,
                    files: 1,
                    bytes: 999,
                }),
                ..SchemaRun::default()
            }],
            state: vec![SchemaState {
                schema_id: 7,
                schema: "orders".into(),
                dirty_rows: 3,
                oldest_dirty_age_s: 1.5,
                manifest_version: Some(4),
                base: Some(TierSize {
                    files: 2,
                    bytes: 20,
                }),
                delta: Some(TierSize {
                    files: 1,
                    bytes: 999,
                }),
            }],
        }
    }

    #[test]
    fn a_successful_run_sets_its_success_time_and_schema_values() {
        let text = exposition(&record(0), Some(5.0)).render();
        let get = |n: &str, l: &[(&str, &str)]| exposition::read_sample(&text, n, l);
        assert_eq!(get(LAST_SUCCESS, &[("command", "flush")]), Some(1002.5));
        assert_eq!(get("lakecdc_last_run_timestamp_seconds", &[]), Some(1002.5));
        assert_eq!(
            get("lakecdc_run_outcome", &[("outcome", "done")]),
            Some(1.0)
        );
        assert_eq!(
            get("lakecdc_run_outcome", &[("outcome", "failed")]),
            Some(0.0)
        );
        assert_eq!(
            get("lakecdc_schema_rows_exported", &[("schema_id", "7")]),
            Some(10.0)
        );
        assert_eq!(get("lakecdc_lake_files", &[("tier", "base")]), Some(2.0));
        assert_eq!(get("lakecdc_lake_bytes", &[("tier", "delta")]), Some(999.0));
        assert_eq!(get("lakecdc_manifest_version", &[]), Some(4.0));
        assert_eq!(get("lakecdc_oldest_dirty_age_seconds", &[]), Some(1.5));
    }

    #[test]
    fn a_failed_run_keeps_the_previous_success_time_or_has_none() {
        let text = exposition(&record(1), Some(5.0)).render();
        assert_eq!(
            exposition::read_sample(&text, LAST_SUCCESS, &[("command", "flush")]),
            Some(5.0)
        );
        assert!(!exposition(&record(1), None).has(LAST_SUCCESS));
        assert!(exposition(&record(3), None).has(LAST_SUCCESS));
    }
}
