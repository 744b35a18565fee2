//! init's progress on a terminal: one bar per schema on stderr (rows done / total, rows/s, ETA).

use std::sync::Arc;

use crate::init::ProgressFn;

/// A progress bar on stderr when it is a terminal (rows done / total, rows/s, ETA); `None`
/// otherwise, and init logs one line per file instead.
pub fn progress_bar() -> Option<ProgressFn> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let style = indicatif::ProgressStyle::with_template(
        "schema {prefix} [{bar:40}] {human_pos}/{human_len} rows  {msg}",
    )
    .ok()?
    .progress_chars("=> ");
    // One bar per schema, made at its first call (so it is never drawn without its length);
    // the schema's last call (done == total) clears it, leaving nothing above the report.
    // Rows/s and ETA are the schema's average so far: the pages arrive in large steps, which
    // indicatif's own short-window estimate reads as bursts of millions of rows a second.
    type Bar = (i16, indicatif::ProgressBar, std::time::Instant, u64);
    let current = std::sync::Mutex::new(None::<Bar>);
    Some(Arc::new(move |schema_id, done, total| {
        let Ok(mut current) = current.lock() else {
            return;
        };
        let (bar, started, first) = match &mut *current {
            Some((id, bar, started, first)) if *id == schema_id => (bar, *started, *first),
            slot => {
                let bar = indicatif::ProgressBar::new(total.max(done))
                    .with_style(style.clone())
                    .with_prefix(schema_id.to_string());
                let new = (schema_id, bar, std::time::Instant::now(), done);
                let (_, bar, started, first) = slot.insert(new);
                (bar, *started, *first)
            }
        };
        // Counted from the first call: the rows it reports were read before the bar existed.
        let secs = started.elapsed().as_secs_f64();
        let rate = if secs > 0.0 {
            done.saturating_sub(first) as f64 / secs
        } else {
            0.0
        };
        let eta = if rate > 0.0 {
            total.saturating_sub(done) as f64 / rate
        } else {
            0.0
        };
        bar.set_length(total.max(done));
        bar.set_position(done);
        bar.set_message(format!("{rate:.0} rows/s  ETA {eta:.0}s"));
        if done >= total {
            bar.finish_and_clear();
        }
    }))
}
