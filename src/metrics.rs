//! Prometheus metrics shared by the HTTP and lifecycle layers, rendered as
//! text on `GET /metrics`.

use std::sync::Mutex;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TrafficLabel {
    pub sandbox_id: String,
    /// `sent` or `received` (seen from the sandbox).
    pub direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PathLabel {
    /// `hyper` (the one forwarding path; the label stays for dashboards
    /// that select on it).
    pub path: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FromLabel {
    /// The idle state a wake started from: `frozen` or `reclaimed`.
    pub from: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabel {
    /// `freeze` or `reclaim`.
    pub step: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepReasonLabel {
    /// `freeze`, `reclaim` or `delete`.
    pub step: String,
    /// Why it was not taken (`cpu`: the sandbox was busy).
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

/// Latency buckets in seconds: 100 µs .. 60 s.
const BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
    15.0, 60.0,
];

fn histogram() -> Histogram {
    Histogram::new(BUCKETS.iter().copied())
}

/// A histogram family (its histograms made with the common buckets).
type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

pub struct Metrics {
    registry: Registry,
    /// By `status` (every backend) and by `idle_state` (a backend that
    /// freezes): two sets of series of one gauge.
    pub sandboxes: Family<Vec<(String, String)>, Gauge>,
    /// Wakes of frozen or reclaimed sandboxes, from the request's
    /// admission until thawed.
    pub wake_seconds: Histograms<FromLabel>,
    /// Steps down the hibernation ladder taken.
    pub idle_steps: Family<StepLabel, Counter>,
    /// Bytes the reclaim step took out of sandboxes' memory.
    pub reclaimed_bytes: Counter,
    /// Reclaims that could not finish, by reason (the sandbox stays frozen).
    pub reclaim_failures: Family<ReasonLabel, Counter>,
    /// Steps down the ladder (the delete included) not taken though the
    /// sandbox's requests alone made them due, by step and reason (`cpu`).
    pub idle_steps_refused: Family<StepReasonLabel, Counter>,
    pub create_seconds: Histogram,
    pub delete_seconds: Histogram,
    pub proxy_seconds: Histogram,
    /// Proxied requests (the child of `proxy_requests_total`, made once so
    /// counting takes no lookup).
    pub proxy_requests: Counter,
    pub reaped: Counter,
    pub oom_kills: Counter,
    pub errors: Family<KindLabel, Counter>,
    /// Packets the egress policy dropped, by reason (nft counters).
    pub net_dropped: Family<ReasonLabel, Gauge>,
    /// Bytes through each sandbox's veth.
    pub net_bytes: Family<TrafficLabel, Gauge>,
    /// Rebuilds of the egress table after it was removed or changed.
    pub egress_rebuilds: Gauge,
    /// Image pulls by result (`ok`, `failed`), their bytes and seconds,
    /// and verification failures by kind.
    pub image_pulls: Family<ResultLabel, Gauge>,
    pub image_pull_bytes: Gauge,
    pub image_pull_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub image_verification_failures: Family<KindLabel, Gauge>,
    /// Warm-pool members ready to be claimed.
    pub pool_ready: Gauge,
    /// Creates that went to the warm pool, by result.
    pub pool_claims: Family<ResultLabel, Gauge>,
    render_lock: Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("sandboxd");
        let sandboxes = Family::<Vec<(String, String)>, Gauge>::default();
        let create_seconds = histogram();
        let delete_seconds = histogram();
        let proxy_seconds = histogram();
        let proxy_requests = Family::<PathLabel, Counter>::default();
        let path = |p: &str| {
            proxy_requests
                .get_or_create(&PathLabel { path: p.into() })
                .clone()
        };
        let proxy_requests_hyper = path("hyper");
        let reaped = Counter::default();
        let oom_kills = Counter::default();
        let errors = Family::<KindLabel, Counter>::default();
        registry.register(
            "sandboxes",
            "Sandboxes tracked, by status, and (native backend) by idle_state: active, frozen, reclaimed",
            sandboxes.clone(),
        );
        let wake_seconds: Histograms<FromLabel> = Family::new_with_constructor(histogram);
        registry.register(
            "wake_duration_seconds",
            "Time to wake a frozen or reclaimed sandbox (thaw) before a request is forwarded, by the state it woke from",
            wake_seconds.clone(),
        );
        let idle_steps = Family::<StepLabel, Counter>::default();
        registry.register(
            "idle_steps",
            "Idle sandboxes frozen or reclaimed (step: freeze, reclaim)",
            idle_steps.clone(),
        );
        let reclaimed_bytes = Counter::default();
        registry.register(
            "reclaimed_bytes",
            "Bytes of memory the reclaim step pushed out of idle sandboxes (to swap, or dropped page cache)",
            reclaimed_bytes.clone(),
        );
        let reclaim_failures = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "reclaim_failures",
            "Reclaims that could not finish (the sandbox stays frozen), by reason: swap_full, incomplete, error",
            reclaim_failures.clone(),
        );
        let idle_steps_refused = Family::<StepReasonLabel, Counter>::default();
        registry.register(
            "idle_steps_refused",
            "Idle checks that found a step (freeze, reclaim, delete) due by the sandbox's requests but did not take it because the sandbox was busy, by step and reason (cpu: its CPU use since the last check)",
            idle_steps_refused.clone(),
        );
        registry.register(
            "create_duration_seconds",
            "Time to create a sandbox (POST until it answers health)",
            create_seconds.clone(),
        );
        registry.register(
            "delete_duration_seconds",
            "Time to delete a sandbox, including waiting for pinned proxy requests",
            delete_seconds.clone(),
        );
        registry.register(
            "proxy_duration_seconds",
            "Time from a proxied request to its upstream response head",
            proxy_seconds.clone(),
        );
        registry.register(
            "proxy_requests",
            "Proxied requests (path: hyper, the one forwarding path)",
            proxy_requests,
        );
        registry.register(
            "reaped",
            "Sandboxes deleted by the idle reaper",
            reaped.clone(),
        );
        registry.register(
            "oom_kills",
            "Sandboxes in which the OOM killer killed a process",
            oom_kills.clone(),
        );
        registry.register("errors", "Errors by kind", errors.clone());
        let net_dropped = Family::<ReasonLabel, Gauge>::default();
        let net_bytes = Family::<TrafficLabel, Gauge>::default();
        registry.register(
            "network_dropped_packets",
            "Packets from sandboxes dropped by the egress policy, by reason (since the table was built)",
            net_dropped.clone(),
        );
        registry.register(
            "sandbox_network_bytes",
            "Bytes through a sandbox's veth, by direction (seen from the sandbox)",
            net_bytes.clone(),
        );
        let egress_rebuilds = Gauge::default();
        registry.register(
            "network_egress_rebuilds",
            "Rebuilds of the egress table after something else removed or changed it (a firewall reload, say)",
            egress_rebuilds.clone(),
        );
        let image_pulls = Family::<ResultLabel, Gauge>::default();
        let image_pull_bytes = Gauge::default();
        let image_pull_seconds = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        let image_verification_failures = Family::<KindLabel, Gauge>::default();
        registry.register(
            "image_pulls",
            "Image pulls since the daemon started, by result",
            image_pulls.clone(),
        );
        registry.register(
            "image_pull_bytes",
            "Bytes of image blobs pulled since the daemon started",
            image_pull_bytes.clone(),
        );
        registry.register(
            "image_pull_seconds",
            "Seconds spent pulling images since the daemon started",
            image_pull_seconds.clone(),
        );
        registry.register(
            "image_verification_failures",
            "Image pulls refused because content did not match its digest, size or diff_id, by kind",
            image_verification_failures.clone(),
        );
        let pool_ready = Gauge::default();
        let pool_claims = Family::<ResultLabel, Gauge>::default();
        registry.register(
            "pool_ready",
            "Warm-pool members started and ready to be claimed",
            pool_ready.clone(),
        );
        registry.register(
            "pool_claims",
            "Creates since the daemon started that asked the warm pool, by result (claimed, empty: none ready, failed: started cold after a failed claim)",
            pool_claims.clone(),
        );
        Metrics {
            pool_ready,
            pool_claims,
            image_pulls,
            image_pull_bytes,
            image_pull_seconds,
            image_verification_failures,
            registry,
            sandboxes,
            wake_seconds,
            idle_steps,
            reclaimed_bytes,
            reclaim_failures,
            idle_steps_refused,
            create_seconds,
            delete_seconds,
            proxy_seconds,
            proxy_requests: proxy_requests_hyper,
            reaped,
            oom_kills,
            errors,
            net_dropped,
            net_bytes,
            egress_rebuilds,
            render_lock: Mutex::new(()),
        }
    }

    /// A wake from `from` (`frozen`, `reclaimed`) that took `seconds`.
    pub fn wake(&self, from: &str, seconds: f64) {
        self.wake_seconds
            .get_or_create(&FromLabel { from: from.into() })
            .observe(seconds);
    }

    pub fn idle_step(&self, step: &str) {
        self.idle_steps
            .get_or_create(&StepLabel { step: step.into() })
            .inc();
    }

    pub fn reclaim_failed(&self, reason: &str) {
        self.reclaim_failures
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc();
    }

    pub fn step_refused(&self, step: &str, reason: &str) {
        self.idle_steps_refused
            .get_or_create(&StepReasonLabel {
                step: step.into(),
                reason: reason.into(),
            })
            .inc();
    }

    pub fn error(&self, kind: &str) {
        self.errors
            .get_or_create(&KindLabel {
                kind: kind.to_string(),
            })
            .inc();
    }

    /// Sets the image gauges from a backend's pull counters.
    pub fn set_images(&self, s: &crate::images::ImageStats) {
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        for (result, v) in [("ok", s.pulls_ok), ("failed", s.pulls_failed)] {
            self.image_pulls
                .get_or_create(&ResultLabel {
                    result: result.to_string(),
                })
                .set(n(v));
        }
        self.image_pull_bytes.set(n(s.bytes));
        self.image_pull_seconds.set(s.seconds);
        for (kind, v) in &s.verification_failures {
            self.image_verification_failures
                .get_or_create(&KindLabel { kind: kind.clone() })
                .set(n(*v));
        }
    }

    /// Sets the warm-pool gauges from a backend's counters.
    pub fn set_pool(&self, s: &crate::backend::PoolStats) {
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.pool_ready.set(n(s.ready));
        for (result, v) in [
            ("claimed", s.claimed),
            ("empty", s.empty),
            ("failed", s.failed),
        ] {
            self.pool_claims
                .get_or_create(&ResultLabel {
                    result: result.to_string(),
                })
                .set(n(v));
        }
    }

    /// Sets the network gauges from a backend's counters.
    pub fn set_network(&self, m: &crate::backend::NetworkMetrics) {
        for (reason, n) in &m.dropped {
            self.net_dropped
                .get_or_create(&ReasonLabel {
                    reason: reason.clone(),
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        self.net_bytes.clear();
        for (id, sent, received) in &m.bytes {
            for (direction, n) in [("sent", sent), ("received", received)] {
                self.net_bytes
                    .get_or_create(&TrafficLabel {
                        sandbox_id: id.clone(),
                        direction: direction.to_string(),
                    })
                    .set(i64::try_from(*n).unwrap_or(i64::MAX));
            }
        }
    }

    pub fn set_egress_rebuilds(&self, n: u64) {
        self.egress_rebuilds
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Renders the text exposition format, after setting the per-status
    /// gauges from `counts` and the per-idle-state ones from `idle` (every
    /// state named there).
    pub fn render(&self, counts: &[(&str, i64)], idle: &[(&str, i64)]) -> String {
        let _g = self.render_lock.lock().unwrap_or_else(|e| e.into_inner());
        for (key, set) in [("status", counts), ("idle_state", idle)] {
            for (value, n) in set {
                self.sandboxes
                    .get_or_create(&vec![(key.to_string(), value.to_string())])
                    .set(*n);
            }
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}
