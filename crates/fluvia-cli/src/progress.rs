//! Live progress of a running job on standard error, when it is a
//! terminal: vertices finished of all, records read so far, elapsed time
//! (an indicatif bar). When standard error is not a terminal nothing is
//! drawn, so scripts and tests see the same output as before.
//!
//! It reads the job's status the client already polls; it knows nothing of
//! how the job runs.

use fluvia_cluster::rpc::JobStatus;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

/// A progress line for one job (nothing when stderr is not a terminal or
/// `FLUVIA_NO_PROGRESS` is set). The line appears with the first status,
/// after whatever the caller printed on submitting.
pub struct Progress {
    wanted: bool,
    label: String,
    bar: Option<ProgressBar>,
}

impl Progress {
    pub fn new(label: &str) -> Self {
        Progress {
            wanted: std::io::stderr().is_terminal()
                && std::env::var_os("FLUVIA_NO_PROGRESS").is_none(),
            label: label.to_string(),
            bar: None,
        }
    }

    /// Whether it draws anything (callers poll the job often only then).
    pub fn active(&self) -> bool {
        self.wanted
    }

    fn bar(&mut self) -> Option<&ProgressBar> {
        if !self.wanted {
            return None;
        }
        if self.bar.is_none() {
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{spinner} {prefix} [{elapsed_precise}] {bar:24} {pos}/{len} vertices  {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            bar.set_style(style);
            bar.set_prefix(self.label.clone());
            bar.enable_steady_tick(Duration::from_millis(200));
            self.bar = Some(bar);
        }
        self.bar.as_ref()
    }

    /// Shows what `status` says of the job.
    pub fn update(&mut self, status: &JobStatus) {
        let Some(bar) = self.bar() else {
            return;
        };
        let details: serde_json::Value =
            serde_json::from_str(&status.details_json).unwrap_or_default();
        let vertices = details["vertices"].as_array().cloned().unwrap_or_default();
        let finished = vertices
            .iter()
            .filter(|v| v["status"] == "FINISHED")
            .count();
        let running = vertices.iter().filter(|v| v["status"] == "RUNNING").count();
        // What the tasks wrote: sources count only their output.
        let records: u64 = vertices
            .iter()
            .map(|v| v["metrics"]["write-records"].as_u64().unwrap_or(0))
            .sum();
        let bytes: u64 = vertices
            .iter()
            .map(|v| v["metrics"]["write-bytes"].as_u64().unwrap_or(0))
            .sum();
        // A streaming job's last completed checkpoint.
        let checkpoint = match &details["checkpoints"]["latest"] {
            serde_json::Value::Null => String::new(),
            c => format!(
                "  checkpoint {} ({} ms, {})",
                c["id"],
                c["end_to_end_duration"],
                human(c["state_size"].as_f64().unwrap_or(0.0), "B")
            ),
        };
        bar.set_length(vertices.len() as u64);
        bar.set_position(finished as u64);
        bar.set_message(format!(
            "{running} running, {} records, {} written  {}{checkpoint}",
            human(records as f64, ""),
            human(bytes as f64, "B"),
            status.state
        ));
    }

    /// Removes the line (the caller prints the outcome).
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// `watch` when the progress line is drawn, else nothing (so the client
/// polls the job at its usual pace).
pub fn progress_watch(
    watch: &mut (dyn FnMut(&JobStatus) + Send),
    active: bool,
) -> Option<&mut (dyn FnMut(&JobStatus) + Send)> {
    active.then_some(watch)
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

fn human(v: f64, unit: &str) -> String {
    let (v, p) = if v >= 1e9 {
        (v / 1e9, "G")
    } else if v >= 1e6 {
        (v / 1e6, "M")
    } else if v >= 1e3 {
        (v / 1e3, "k")
    } else {
        return format!("{v:.0} {unit}").trim_end().to_string();
    };
    format!("{v:.1} {p}{unit}")
}

#[cfg(test)]
mod tests {
    use super::human;

    #[test]
    fn numbers_read_at_a_glance() {
        assert_eq!(human(999.0, ""), "999");
        assert_eq!(human(1_250.0, ""), "1.2 k");
        assert_eq!(human(3_400_000.0, "B"), "3.4 MB");
    }
}
