//! What a fleet watches, in Prometheus' text format (OpenMetrics, through
//! the Prometheus project's own `prometheus-client`): runs by environment,
//! kind and how they ended, their durations, refused HTTP requests by
//! reason, and, read when scraped, the sandboxes prepared ahead and the
//! memory budget held. Recorded by the server and its HTTP gate; knows
//! nothing of either.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    env: String,
    /// run, session, job, command.
    kind: String,
    /// ok, or the result's error code (exit_nonzero, timeout, memory_limit, ...).
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EnvLabels {
    env: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

/// The server's metrics.
pub struct Metrics {
    registry: Registry,
    runs: Family<RunLabels, Counter>,
    durations: Family<EnvLabels, Histogram>,
    refused: Family<ReasonLabels, Counter>,
    ready: Gauge,
    budget_used: Gauge<i64, std::sync::atomic::AtomicI64>,
    budget_total: Gauge<i64, std::sync::atomic::AtomicI64>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Run durations' buckets, in seconds: from a warm call to a long job.
const DURATION_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 600.0,
];

impl Default for Metrics {
    fn default() -> Metrics {
        let mut registry = Registry::with_prefix("nix_sandbox_mcp");
        let runs = Family::<RunLabels, Counter>::default();
        let durations = Family::<EnvLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(DURATION_BUCKETS)
        });
        let refused = Family::<ReasonLabels, Counter>::default();
        let ready = Gauge::default();
        let budget_used = Gauge::default();
        let budget_total = Gauge::default();
        registry.register(
            "runs",
            "Runs, by environment, kind (run, session, job, command) and outcome (ok or the result's error code)",
            runs.clone(),
        );
        registry.register(
            "run_duration_seconds",
            "Wall-clock time of runs, by environment",
            durations.clone(),
        );
        registry.register(
            "http_refused",
            "HTTP requests refused, by reason",
            refused.clone(),
        );
        registry.register(
            "sandboxes_ready",
            "Sandboxes prepared ahead and waiting for a call",
            ready.clone(),
        );
        registry.register(
            "memory_budget_used_mib",
            "MiB of the memory budget held by sandboxes alive",
            budget_used.clone(),
        );
        registry.register(
            "memory_budget_mib",
            "The memory budget, in MiB",
            budget_total.clone(),
        );
        Metrics {
            registry,
            runs,
            durations,
            refused,
            ready,
            budget_used,
            budget_total,
        }
    }
}

impl Metrics {
    /// A run that ended: `outcome` is `ok` or its error code.
    pub fn run(&self, env: &str, kind: &str, outcome: &str, seconds: Option<f64>) {
        self.runs
            .get_or_create(&RunLabels {
                env: env.to_string(),
                kind: kind.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
        if let Some(s) = seconds {
            self.durations
                .get_or_create(&EnvLabels {
                    env: env.to_string(),
                })
                .observe(s);
        }
    }

    /// An HTTP request refused for `reason`.
    pub fn refused(&self, reason: &str) {
        self.refused
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// The text a scrape gets, with the gauges read now.
    pub fn render(&self, ready: usize, budget_used_mib: u64, budget_mib: u64) -> String {
        self.ready.set(ready as i64);
        self.budget_used.set(budget_used_mib as i64);
        self.budget_total.set(budget_mib as i64);
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_refusals_and_gauges_are_in_the_text() {
        let m = Metrics::default();
        m.run("python", "run", "ok", Some(0.02));
        m.run("python", "run", "ok", Some(0.03));
        m.run("bash", "session", "timeout", Some(30.0));
        m.refused("unauthenticated");
        let text = m.render(3, 512, 8192);
        for want in [
            "nix_sandbox_mcp_runs_total{env=\"python\",kind=\"run\",outcome=\"ok\"} 2",
            "nix_sandbox_mcp_runs_total{env=\"bash\",kind=\"session\",outcome=\"timeout\"} 1",
            "nix_sandbox_mcp_run_duration_seconds_count{env=\"python\"} 2",
            "nix_sandbox_mcp_http_refused_total{reason=\"unauthenticated\"} 1",
            "nix_sandbox_mcp_sandboxes_ready 3",
            "nix_sandbox_mcp_memory_budget_used_mib 512",
            "nix_sandbox_mcp_memory_budget_mib 8192",
            "# EOF",
        ] {
            assert!(text.contains(want), "{want} not in:\n{text}");
        }
    }
}
