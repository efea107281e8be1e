//! Idle policy, in one place: each admitted incarnation's activity (a
//! touch counter, the time of its last request and of the last check that
//! found it busy, in atomics), THE idle rule ([`idle_for`], [`decide`]):
//! whether and for how long a sandbox has been idle and which step down
//! is due, the `[idle]` settings, and the reaper that takes those steps
//! every check interval: freeze and reclaim (a backend that can freeze:
//! native), delete at the idle timeout. Where a sandbox is on the ladder
//! is the backend's (its record's `idle`); its CPU time too ([`Busy`]).
//! Each step is fenced on the generation it saw and skipped when the
//! sandbox was touched after it looked.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn, Instrument};

use super::{IdLocks, Lifecycle, LifecycleError};
use crate::backend::SandboxRef;
use crate::config::ConfigError;
use crate::model::IdleState;

/// `[idle]`: the hibernation ladder's steps before the delete at the idle
/// timeout (which stays the top-level `idle_timeout_seconds`), and what
/// makes a sandbox busy.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct IdleConfig {
    /// Freeze a sandbox idle this long (`SANDBOXD_IDLE_FREEZE_SECONDS`); 0:
    /// never (and no reclaim either).
    pub freeze_after_seconds: u64,
    /// Push a frozen sandbox's memory to swap once idle this long
    /// (`SANDBOXD_IDLE_RECLAIM_SECONDS`); 0: never. Needs swap on the node.
    pub reclaim_after_seconds: u64,
    /// A sandbox whose cgroup used at least this share of one CPU over the
    /// last check interval is busy: that counts as activity for every step,
    /// the delete included (`SANDBOXD_IDLE_BUSY_CPU_PERCENT`); 0: CPU use
    /// never counts.
    pub busy_cpu_percent: f64,
}

impl Default for IdleConfig {
    fn default() -> Self {
        IdleConfig {
            freeze_after_seconds: 60,
            reclaim_after_seconds: 300,
            busy_cpu_percent: 2.0,
        }
    }
}

impl IdleConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let p = self.busy_cpu_percent;
        if !p.is_finite() || !(0.0..=100.0).contains(&p) {
            return Err(ConfigError::Invalid(format!(
                "idle.busy_cpu_percent {p} must be a number in 0..=100 (percent of one CPU)"
            )));
        }
        let (f, r) = (self.freeze_after_seconds, self.reclaim_after_seconds);
        if f > 0 && r > 0 && r <= f {
            return Err(ConfigError::Invalid(format!(
                "idle.reclaim_after_seconds ({r}) must be more than idle.freeze_after_seconds ({f}): \
                 a sandbox is reclaimed while frozen (0 turns the step off)"
            )));
        }
        Ok(())
    }

    /// The ladder these settings make (a reclaim needs a freeze first).
    pub fn ladder(&self) -> Ladder {
        let secs = |s: u64| (s > 0).then(|| Duration::from_secs(s));
        let freeze_after = secs(self.freeze_after_seconds);
        Ladder {
            freeze_after,
            reclaim_after: freeze_after.and(secs(self.reclaim_after_seconds)),
            busy_cpu_percent: self.busy_cpu_percent,
        }
    }
}

/// The steps down before the delete, and the busy threshold (see
/// [`IdleConfig`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ladder {
    /// `None`: never frozen.
    pub freeze_after: Option<Duration>,
    /// `None`: never reclaimed.
    pub reclaim_after: Option<Duration>,
    /// Percent of one CPU; 0: CPU use never makes a sandbox busy.
    pub busy_cpu_percent: f64,
}

impl Ladder {
    /// No step before the delete (the busy threshold as by default).
    pub const OFF: Ladder = Ladder {
        freeze_after: None,
        reclaim_after: None,
        busy_cpu_percent: 2.0,
    };

    /// Without the steps a backend that cannot freeze cannot take.
    pub fn without_steps(self) -> Ladder {
        Ladder {
            freeze_after: None,
            reclaim_after: None,
            ..self
        }
    }
}

/// An incarnation's activity: a touch counter plus the time of its last
/// request (so the reaper can tell "touched after I looked" even within a
/// millisecond) and of the last check that found it busy, and what the
/// busy check and the reclaim step remember of it. Atomics, so a proxied
/// request marks it without the table's lock.
#[derive(Debug)]
pub(super) struct Activity {
    touches: AtomicU64,
    /// Milliseconds since the lifecycle's epoch.
    last_active_ms: AtomicU64,
    /// The last check that found it busy, in milliseconds since the
    /// lifecycle's epoch; [`NEVER`] if none did.
    last_busy_ms: AtomicU64,
    /// The last CPU sample: (milliseconds since the lifecycle's epoch, CPU
    /// microseconds used).
    cpu: Mutex<Option<(u64, u64)>>,
    /// When a reclaim of its current freeze last failed, in milliseconds
    /// since the lifecycle's epoch ([`NEVER`]: none did, or it was woken
    /// since).
    reclaim_failed_ms: AtomicU64,
}

/// No check found the sandbox busy.
const NEVER: u64 = u64::MAX;

impl Activity {
    pub(super) fn new(now_ms: u64) -> Self {
        Activity {
            touches: AtomicU64::new(0),
            last_active_ms: AtomicU64::new(now_ms),
            last_busy_ms: AtomicU64::new(NEVER),
            cpu: Mutex::new(None),
            reclaim_failed_ms: AtomicU64::new(NEVER),
        }
    }

    pub(super) fn touch(&self, now_ms: u64) {
        // Written only when it moves on (once a millisecond at most under
        // load): a read of a shared line costs less than a write to it.
        if self.last_active_ms.load(Ordering::Relaxed) < now_ms {
            self.last_active_ms.fetch_max(now_ms, Ordering::Relaxed);
        }
        self.touches.fetch_add(1, Ordering::SeqCst);
    }

    pub(super) fn touches(&self) -> u64 {
        self.touches.load(Ordering::SeqCst)
    }

    /// The last activity, in milliseconds since the lifecycle's epoch.
    pub(super) fn last_active_ms(&self) -> u64 {
        self.last_active_ms.load(Ordering::Relaxed)
    }

    /// A reclaim of its current freeze failed at `now_ms`.
    fn reclaim_failed(&self, now_ms: u64) {
        self.reclaim_failed_ms.store(now_ms, Ordering::Relaxed);
    }

    /// It was woken: its next freeze's reclaim starts afresh.
    pub(super) fn woken(&self) {
        self.reclaim_failed_ms.store(NEVER, Ordering::Relaxed);
    }

    /// Records a CPU sample taken at `now_ms` and returns the share of one
    /// CPU (percent) used since the previous one, if there was one.
    fn cpu_percent(&self, now_ms: u64, usec: u64) -> Option<f64> {
        let mut last = self.cpu.lock().unwrap_or_else(|e| e.into_inner());
        let prev = last.replace((now_ms, usec));
        let (t0, u0) = prev?;
        let wall_us = now_ms.checked_sub(t0).filter(|d| *d > 0)? * 1000;
        Some(usec.saturating_sub(u0) as f64 * 100.0 / wall_us as f64)
    }
}

/// Why a sandbox without requests is not idle: what its backend reports
/// of it. (A session producing output, [sessions], is meant to be the
/// next reason.)
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Busy {
    /// Its cgroup used this share of one CPU (percent) since the last
    /// check, at least `[idle] busy_cpu_percent`.
    Cpu { percent: f64 },
}

impl Busy {
    /// The `reason` label of its metrics.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Busy::Cpu { .. } => "cpu",
        }
    }
}

/// What the reaper observed of one sandbox.
#[derive(Debug, Clone)]
pub(crate) struct Observation {
    pub id: String,
    pub generation: String,
    pub touches: u64,
    /// Time since its last activity (a create, a reuse, a discover, a
    /// touch, a proxied request).
    pub since_active: Duration,
    /// Time since a check last found it busy (`None`: none did).
    pub since_busy: Option<Duration>,
    /// Proxy requests in flight: a sandbox serving one is not idle.
    pub inflight: usize,
    /// Where it is on the ladder; `None` when it is not on it (not
    /// running, or a backend without one): only the delete applies.
    pub state: Option<IdleState>,
    /// Time since a reclaim of its current freeze failed (`None`: none did).
    pub since_reclaim_failed: Option<Duration>,
    /// Busy at this check, and why.
    pub busy: Option<Busy>,
}

/// How long the sandbox `o` has been idle, or `None` when it is not idle
/// at all. THE rule: a sandbox serving a proxied request is not idle (the
/// response marks activity again when it ends); otherwise it is idle
/// since its last activity: a create, a reuse, a discover, a touch, a
/// proxied request, or a check that found it busy (its cgroup used at
/// least `[idle] busy_cpu_percent` of one CPU since the check before: a
/// build left running in the background counts, an idle shell waiting for
/// input does not; the first check of a sandbox only measures, so it
/// counts too).
pub(crate) fn idle_for(o: &Observation) -> Option<Duration> {
    if o.inflight > 0 {
        return None;
    }
    Some(match o.since_busy {
        Some(busy) => busy.min(o.since_active),
        None => o.since_active,
    })
}

/// A step down the ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    Freeze,
    Reclaim,
    Delete,
}

impl Step {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Step::Freeze => "freeze",
            Step::Reclaim => "reclaim",
            Step::Delete => "delete",
        }
    }
}

/// What the idle rule says of one observed sandbox.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Decision {
    /// Nothing to do now.
    Stay,
    /// Busy: no step, though its requests alone would have made this one
    /// due (counted: `sandboxd_idle_steps_refused_total`).
    Refused(Busy, Step),
    Step(Step),
}

/// What to do with the sandbox `o`: the step down its idle time (see
/// [`idle_for`]) makes due. Deleted once idle longer than the idle timeout
/// (`delete_after`), whatever its place on the ladder; frozen once idle
/// `freeze_after`; reclaimed, while frozen, once idle `reclaim_after`
/// (a failed reclaim is tried again `reclaim_after` later, while it stays
/// frozen). Busy counts as activity for every step, the delete included.
pub(crate) fn decide(o: &Observation, ladder: &Ladder, delete_after: Option<Duration>) -> Decision {
    let due = |idle: Duration| {
        if delete_after.is_some_and(|t| idle > t) {
            return Some(Step::Delete);
        }
        match o.state? {
            IdleState::Active if ladder.freeze_after.is_some_and(|t| idle >= t) => {
                Some(Step::Freeze)
            }
            // A failed reclaim is tried again after as long again.
            IdleState::Frozen
                if ladder.reclaim_after.is_some_and(|t| {
                    idle >= t && o.since_reclaim_failed.is_none_or(|f| f >= t)
                }) =>
            {
                Some(Step::Reclaim)
            }
            _ => None,
        }
    };
    let Some(idle) = idle_for(o) else {
        return Decision::Stay;
    };
    match o.busy {
        // What its requests alone would have made due: spared.
        Some(b) => due(o.since_active).map_or(Decision::Stay, |s| Decision::Refused(b, s)),
        None => due(idle).map_or(Decision::Stay, Decision::Step),
    }
}

pub(super) fn spawn(lc: Arc<Lifecycle>) -> Option<tokio::task::JoinHandle<()>> {
    let timeout = lc.settings.idle_timeout;
    let ladder = lc.ladder();
    if timeout.is_none() && ladder.freeze_after.is_none() {
        return None;
    }
    let interval = lc.settings.idle_check_interval;
    let secs = |d: Option<Duration>| d.map_or(0, |d| d.as_secs());
    info!(
        idle_timeout_s = secs(timeout),
        freeze_after_s = secs(ladder.freeze_after),
        reclaim_after_s = secs(ladder.reclaim_after),
        busy_cpu_percent = ladder.busy_cpu_percent,
        check_interval_s = interval.as_secs(),
        "idle reaper started"
    );
    if ladder.reclaim_after.is_some() {
        match lc.backend.swap() {
            Some(s) if s.total_bytes > 0 => info!(
                swap = s.kind(),
                swap_mib = s.total_bytes >> 20,
                "idle sandboxes are reclaimed to swap"
            ),
            _ => warn!("the node has no swap: the reclaim step is skipped (frozen sandboxes keep their memory) until it has some"),
        }
    }
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            lc.check_idle().await;
        }
    }))
}

impl Lifecycle {
    /// One round of the reaper: observes every sandbox and takes the step
    /// the idle rule says, one sandbox after another.
    pub(crate) async fn check_idle(&self) {
        let ladder = self.ladder();
        let timeout = self.settings.idle_timeout;
        // Whether a reclaim can gain anything this round (read once).
        let mut has_swap = None;
        let observed = self.observe().await;
        let checked = observed.len();
        let mut steps = 0usize;
        for o in observed {
            let step = match decide(&o, &ladder, timeout) {
                Decision::Stay => continue,
                Decision::Refused(b, step) => {
                    self.metrics.step_refused(step.as_str(), b.reason());
                    continue;
                }
                Decision::Step(s) => s,
            };
            if step == Step::Reclaim
                && !*has_swap
                    .get_or_insert_with(|| self.backend.swap().is_some_and(|s| s.total_bytes > 0))
            {
                continue;
            }
            steps += 1;
            // Each step's lines (the delete's included) carry both fields.
            let span = tracing::info_span!(
                "reap",
                sandbox_id = %o.id,
                generation = %o.generation
            );
            let o = &o;
            async move {
                let result = match step {
                    Step::Delete => self.reap(o).await,
                    Step::Freeze | Step::Reclaim => self.step_down(o, step).await,
                };
                match result {
                    Ok(true) if step == Step::Delete => {
                        info!(idle_s = o.since_active.as_secs(), "reaped idle sandbox")
                    }
                    Ok(_) => {}
                    Err(e) => {
                        self.metrics.error(e.kind());
                        warn!(error = %e, step = step.as_str(), "reaper could not take its step")
                    }
                }
            }
            .instrument(span)
            .await;
        }
        // What a test waits on to know a whole pass ran.
        debug!(checked, steps, "idle check done");
    }

    /// Snapshot for the reaper: every tracked sandbox's activity and, from
    /// the backend (one call for all, outside the table's lock), its place
    /// on the ladder and whether it is busy (its CPU use since the last
    /// round), which is marked as activity.
    pub(crate) async fn observe(&self) -> Vec<Observation> {
        let seen: Vec<(SandboxRef, Arc<Activity>)> = self
            .table()
            .values()
            .map(|t| (SandboxRef::clone(&t.sandbox), t.activity.clone()))
            .collect();
        let refs: Vec<SandboxRef> = seen.iter().map(|(s, _)| s.clone()).collect();
        let samples = self.backend.idle(&refs).await;
        let threshold = self.settings.ladder.busy_cpu_percent;
        let now = self.now_ms();
        seen.into_iter()
            .zip(samples)
            .map(|((sandbox, activity), sample)| {
                let cpu = sample
                    .and_then(|s| s.cpu_usec)
                    .map(|usec| activity.cpu_percent(now, usec));
                let busy = cpu
                    .flatten()
                    .filter(|p| threshold > 0.0 && *p >= threshold)
                    .map(|percent| Busy::Cpu { percent });
                // Busy, or not known yet (its first sample: no share of a
                // check interval to compare): its idle time starts now.
                if busy.is_some() || cpu.is_some_and(|p| p.is_none()) {
                    activity.last_busy_ms.store(now, Ordering::Relaxed);
                }
                let since = |ms: u64| Duration::from_millis(now.saturating_sub(ms));
                let since_ms = |ms: u64| (ms != NEVER).then(|| since(ms));
                let last_busy = activity.last_busy_ms.load(Ordering::Relaxed);
                let reclaim_failed = activity.reclaim_failed_ms.load(Ordering::Relaxed);
                Observation {
                    inflight: self.locks.inflight(&sandbox.sandbox_id),
                    id: sandbox.sandbox_id,
                    generation: sandbox.generation,
                    touches: activity.touches(),
                    since_active: since(activity.last_active_ms()),
                    since_busy: since_ms(last_busy),
                    state: sample.map(|s| s.state),
                    since_reclaim_failed: since_ms(reclaim_failed),
                    busy,
                }
            })
            .collect()
    }

    /// A step down the ladder (freeze, reclaim) of the observed sandbox,
    /// serialized with its create and delete, fenced on the observed
    /// generation and skipped when it was touched since. It holds new
    /// requests off until it is done (one in flight means the sandbox is
    /// not idle: no step); they then wake it. Returns whether the step
    /// was taken.
    pub(crate) async fn step_down(
        &self,
        o: &Observation,
        step: Step,
    ) -> Result<bool, LifecycleError> {
        let (slot, _op) = self.locks.operation(&o.id).await;
        let current = |lc: &Self| {
            let table = lc.table();
            let t = table.get(&o.id)?;
            (t.sandbox.generation == o.generation && t.activity.touches() == o.touches)
                .then(|| t.activity.clone())
        };
        if current(self).is_none() {
            return Ok(false);
        }
        let Some(_excl) = IdLocks::exclusive_within(&slot, Duration::ZERO).await else {
            return Ok(false);
        };
        let Some(activity) = current(self) else {
            return Ok(false);
        };
        let sandbox = SandboxRef {
            sandbox_id: o.id.clone(),
            generation: o.generation.clone(),
        };
        let idle_s = o.since_active.as_secs();
        match step {
            Step::Freeze => {
                self.backend.freeze(&sandbox).await?;
                self.metrics.idle_step(step.as_str());
                info!(idle_s, "froze idle sandbox");
            }
            Step::Reclaim => {
                let out = match self.backend.reclaim(&sandbox).await {
                    Ok(out) => out,
                    Err(e) => {
                        activity.reclaim_failed(self.now_ms());
                        self.metrics.reclaim_failed("error");
                        return Err(e.into());
                    }
                };
                self.metrics.reclaimed_bytes.inc_by(out.bytes);
                if let Some(reason) = out.failure {
                    if reason == "no_swap" {
                        // Said once at start; tried again once it has some.
                        return Ok(false);
                    }
                    activity.reclaim_failed(self.now_ms());
                    self.metrics.reclaim_failed(reason);
                    warn!(reason, detail = %out.detail, reclaimed_mib = out.bytes >> 20,
                          "reclaim did not finish: the sandbox stays frozen");
                    return Ok(false);
                }
                self.metrics.idle_step(step.as_str());
                info!(
                    idle_s,
                    reclaimed_mib = out.bytes >> 20,
                    "reclaimed idle sandbox"
                );
            }
            Step::Delete => unreachable!("deletes go through reap"),
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{assert_load_errors, load_toml};

    fn observed(since_active: Duration, inflight: usize) -> Observation {
        Observation {
            id: "a".into(),
            generation: "g".into(),
            touches: 0,
            since_active,
            since_busy: None,
            inflight,
            state: Some(IdleState::Active),
            since_reclaim_failed: None,
            busy: None,
        }
    }

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn idle_since_the_last_activity_unless_serving_a_request() {
        let d = Duration::from_secs(90);
        assert_eq!(idle_for(&observed(d, 0)), Some(d));
        assert_eq!(idle_for(&observed(Duration::ZERO, 0)), Some(Duration::ZERO));
        assert_eq!(idle_for(&observed(d, 1)), None, "a request in flight");
        // A check that found it busy is activity too.
        let busy_since = Observation {
            since_busy: Some(s(30)),
            ..observed(d, 0)
        };
        assert_eq!(idle_for(&busy_since), Some(s(30)));
    }

    #[test]
    fn the_ladder_freezes_reclaims_then_deletes() {
        let ladder = IdleConfig::default().ladder();
        let del = Some(s(600));
        let at = |secs: u64, state: IdleState| Observation {
            state: Some(state),
            ..observed(s(secs), 0)
        };
        use Decision::{Stay, Step as Do};
        assert_eq!(decide(&at(59, IdleState::Active), &ladder, del), Stay);
        assert_eq!(
            decide(&at(60, IdleState::Active), &ladder, del),
            Do(Step::Freeze)
        );
        assert_eq!(decide(&at(299, IdleState::Frozen), &ladder, del), Stay);
        assert_eq!(
            decide(&at(300, IdleState::Frozen), &ladder, del),
            Do(Step::Reclaim)
        );
        assert_eq!(decide(&at(400, IdleState::Reclaimed), &ladder, del), Stay);
        for state in [IdleState::Active, IdleState::Frozen, IdleState::Reclaimed] {
            assert_eq!(decide(&at(601, state), &ladder, del), Do(Step::Delete));
            let without_timeout = match state {
                IdleState::Active => Do(Step::Freeze),
                IdleState::Frozen => Do(Step::Reclaim),
                IdleState::Reclaimed => Stay,
            };
            assert_eq!(decide(&at(601, state), &ladder, None), without_timeout);
        }
        // A frozen sandbox whose reclaim failed stays frozen, and is tried
        // again once as long again has passed.
        let failed = |secs| Observation {
            since_reclaim_failed: Some(s(secs)),
            ..at(400, IdleState::Frozen)
        };
        assert_eq!(decide(&failed(299), &ladder, del), Stay);
        assert_eq!(decide(&failed(300), &ladder, del), Do(Step::Reclaim));
        // A request in flight: no step at all, however long ago the last.
        let serving = Observation {
            inflight: 1,
            ..at(10_000, IdleState::Active)
        };
        assert_eq!(decide(&serving, &ladder, del), Stay);
        // Not on the ladder (not running, or no ladder): only the delete.
        let off_ladder = |secs| Observation {
            state: None,
            ..observed(s(secs), 0)
        };
        assert_eq!(decide(&off_ladder(400), &ladder, del), Stay);
        assert_eq!(decide(&off_ladder(601), &ladder, del), Do(Step::Delete));
        // Steps turned off.
        let off = IdleConfig {
            freeze_after_seconds: 0,
            ..IdleConfig::default()
        }
        .ladder();
        assert_eq!(off.reclaim_after, None, "no reclaim without a freeze");
        assert_eq!(decide(&at(599, IdleState::Active), &off, del), Stay);
        assert_eq!(decide(&at(599, IdleState::Active), &Ladder::OFF, del), Stay);
        assert_eq!(ladder.without_steps().freeze_after, None);
    }

    /// The rule [sessions] shares: busy (a build in the background) counts
    /// as activity for every step, the delete included; once it stops, its
    /// idle time runs from the last check that found it busy; an idle one
    /// (a shell waiting for input uses no CPU) is reaped.
    #[test]
    fn busy_spares_every_step_the_delete_included_and_idle_is_reaped() {
        let ladder = IdleConfig::default().ladder();
        let del = Some(s(600));
        let cpu = Busy::Cpu { percent: 50.0 };
        // Building all along, the last request long ago (twenty minutes:
        // past the idle timeout), a minute ago, just now.
        let building = |since_active| Observation {
            busy: Some(cpu),
            since_busy: Some(Duration::ZERO),
            ..observed(s(since_active), 0)
        };
        for (since_active, want) in [
            (1200, Decision::Refused(cpu, Step::Delete)),
            (61, Decision::Refused(cpu, Step::Freeze)),
            (5, Decision::Stay),
        ] {
            let o = building(since_active);
            assert_eq!(
                decide(&o, &ladder, del),
                want,
                "request {since_active} s ago"
            );
        }
        // The build ended 30 s ago: idle since then, so not even frozen.
        let ended = Observation {
            busy: None,
            since_busy: Some(s(30)),
            ..building(1200)
        };
        assert_eq!(decide(&ended, &ladder, del), Decision::Stay);
        // ... frozen a minute after it ended, deleted ten minutes after.
        let later = |secs| Observation {
            since_busy: Some(s(secs)),
            ..ended.clone()
        };
        assert_eq!(
            decide(&later(60), &ladder, del),
            Decision::Step(Step::Freeze)
        );
        assert_eq!(
            decide(&later(601), &ladder, del),
            Decision::Step(Step::Delete)
        );
        // An idle shell: no CPU, never busy: reaped at the idle timeout.
        assert_eq!(
            decide(&observed(s(601), 0), &ladder, del),
            Decision::Step(Step::Delete)
        );
    }

    #[test]
    fn cpu_share_between_two_samples() {
        let a = Activity::new(0);
        assert_eq!(a.cpu_percent(1_000, 5_000), None, "no previous sample");
        // 100 ms of CPU over 10 s: 1 % of one CPU.
        assert_eq!(a.cpu_percent(11_000, 105_000), Some(1.0));
        // Two CPUs flat out over 1 s: 200 %.
        assert_eq!(a.cpu_percent(12_000, 2_105_000), Some(200.0));
        assert_eq!(a.cpu_percent(12_000, 2_105_000), None, "no time passed");
    }

    #[test]
    fn idle_settings_from_file_and_env() {
        let c = load_toml("", &[]).unwrap();
        assert_eq!(c.idle.freeze_after_seconds, 60);
        assert_eq!(c.idle.reclaim_after_seconds, 300);
        assert_eq!(c.idle.busy_cpu_percent, 2.0);
        let toml =
            "[idle]\nfreeze_after_seconds = 30\nreclaim_after_seconds = 90\nbusy_cpu_percent = 5\n";
        let c = load_toml(toml, &[]).unwrap();
        c.validate().unwrap();
        assert_eq!(
            c.idle.ladder(),
            Ladder {
                freeze_after: Some(s(30)),
                reclaim_after: Some(s(90)),
                busy_cpu_percent: 5.0
            }
        );
        let c = load_toml(
            toml,
            &[
                ("SANDBOXD_IDLE_FREEZE_SECONDS", "0"),
                ("SANDBOXD_IDLE_RECLAIM_SECONDS", " 120 "),
                ("SANDBOXD_IDLE_BUSY_CPU_PERCENT", "0.5"),
            ],
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.idle.freeze_after_seconds, 0);
        assert_eq!(c.idle.reclaim_after_seconds, 120);
        assert_eq!(c.idle.busy_cpu_percent, 0.5);
        assert_eq!(
            c.idle.ladder(),
            Ladder {
                freeze_after: None,
                reclaim_after: None,
                busy_cpu_percent: 0.5
            }
        );
        let e = load_toml("", &[("SANDBOXD_IDLE_FREEZE_SECONDS", "soon")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("SANDBOXD_IDLE_FREEZE_SECONDS"), "{e}");
        assert_load_errors(&[("[idle]\nfreeze_after = 3\n", "freeze_after")]);
        for (toml, want) in [
            ("[idle]\nfreeze_after_seconds = 300\nreclaim_after_seconds = 300\n", "idle.reclaim_after_seconds (300) must be more than idle.freeze_after_seconds (300)"),
            ("[idle]\nbusy_cpu_percent = 101\n", "idle.busy_cpu_percent 101 must be a number in 0..=100"),
            ("[idle]\nbusy_cpu_percent = -1\n", "idle.busy_cpu_percent -1 must be"),
        ] {
            let e = load_toml(toml, &[]).unwrap().validate().unwrap_err().to_string();
            assert!(e.contains(want), "{toml}: {e}");
        }
        // Either step may be off on its own.
        for toml in [
            "[idle]\nfreeze_after_seconds = 300\nreclaim_after_seconds = 0\n",
            "[idle]\nfreeze_after_seconds = 0\nreclaim_after_seconds = 10\n",
        ] {
            load_toml(toml, &[]).unwrap().validate().unwrap();
        }
    }
}
