//! The lifecycle layer: the semantics every backend shares.
//!
//! It keeps policy, not records: which incarnation of each id it admitted
//! (its id and generation, [`SandboxRef`]: the generation fence) and its
//! activity, and enforces the identity check on create, generation-fenced
//! deletes, per-id serialization of create/delete, operation pins for
//! proxy requests, the idle reaper (and the hibernation ladder's steps:
//! [`idle`]), waking a frozen sandbox before anything reaches it, and the
//! quiesce gate. The records themselves (identity, status, OOM flag, place
//! on the ladder) are the [`Backend`]'s: every one is read from it
//! ([`Backend::status`]). It knows nothing about HTTP or about how a
//! sandbox is made.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use futures_util::StreamExt;
use sandbox_abi::request::ResourceLimits;
use tokio::sync::Notify;
use tracing::{info, warn, Instrument};

use crate::backend::{Backend, BackendError, Running, SandboxRef, Upstream};
use crate::metrics::Metrics;
use crate::model::{
    validate_sandbox_id, CreateRequest, SandboxRecord, SandboxSpec, SandboxStatus, ValidationError,
};

mod idle;
mod locks;
#[cfg(test)]
mod tests;

use idle::Activity;
pub(crate) use idle::Observation;
pub use idle::{IdleConfig, Ladder};
pub use locks::{IdLocks, ProxyGuard};

/// How many deletes `stop_all` runs at once.
pub const STOP_CONCURRENCY: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error(transparent)]
    Validation(#[from] ValidationError),
    #[error("sandbox {0} identity does not match existing generation")]
    IdentityMismatch(String),
    /// The create named an image outside `[images] allowed`, or not an
    /// image reference at all: HTTP 400.
    #[error("image {0}")]
    ImageNotAllowed(String),
    #[error("sandbox not found")]
    NotFound,
    #[error("sandbox {id} is at generation {live}, not the expected {expected}")]
    GenerationMismatch {
        id: String,
        live: String,
        expected: String,
    },
    #[error("provisioner is quiescing: no new sandboxes are created")]
    Quiescing,
    #[error("quiesce did not finish within {0:?}: {1} sandbox(es) remain")]
    QuiesceTimeout(Duration, usize),
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl LifecycleError {
    /// A short, stable label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            LifecycleError::Validation(_) => "validation",
            LifecycleError::IdentityMismatch(_) => "identity_mismatch",
            LifecycleError::ImageNotAllowed(_) => "image_not_allowed",
            LifecycleError::NotFound => "not_found",
            LifecycleError::GenerationMismatch { .. } => "generation_mismatch",
            LifecycleError::Quiescing => "quiescing",
            LifecycleError::QuiesceTimeout(..) => "quiesce_timeout",
            LifecycleError::Backend(e) => e.kind(),
        }
    }
}

/// Settings of the lifecycle layer (from [`crate::config::Config`]).
#[derive(Debug, Clone)]
pub struct Settings {
    pub health_timeout: Duration,
    /// `None` disables the reaper.
    pub idle_timeout: Option<Duration>,
    pub idle_check_interval: Duration,
    /// Node-global sandbox env (merged under the user env).
    pub global_env: BTreeMap<String, String>,
    pub limits: ResourceLimits,
    /// How long a delete waits for in-flight proxy requests of its sandbox
    /// before it cancels them.
    pub delete_grace: Duration,
    /// How long `stop_all` (shutdown) may take in all.
    pub stop_timeout: Duration,
    /// `[images] allowed`, normalized: the references a create may name.
    pub allowed_images: Vec<String>,
    /// `[idle]`: the hibernation ladder's steps (taken only when the
    /// backend can freeze) and the busy threshold.
    pub ladder: Ladder,
}

/// One admitted incarnation (read and written with the table's lock held)
/// and its activity. `sandbox` names the incarnation the backend answered
/// when it was made or adopted (the generation fence); its record is the
/// backend's, asked for whenever it is needed.
struct Tracked {
    sandbox: Arc<SandboxRef>,
    activity: Arc<Activity>,
    /// Its OOM kill was counted in the metrics (once per incarnation).
    oom_counted: AtomicBool,
}

pub struct Lifecycle {
    backend: Arc<dyn Backend>,
    settings: Settings,
    metrics: Arc<Metrics>,
    tracked: Mutex<HashMap<String, Tracked>>,
    locks: Arc<IdLocks>,
    quiescing: AtomicBool,
    /// Creates past the quiesce gate and not finished, and a wake-up for
    /// quiesce when one finishes.
    creating: AtomicUsize,
    create_done: Notify,
    epoch: Instant,
}

/// A proxy request's hold on a sandbox: the incarnation it was admitted
/// for and the pin that keeps a delete waiting until it is dropped (or
/// until the delete's grace runs out and it cancels the request).
pub struct ProxyPin {
    pub sandbox: Arc<SandboxRef>,
    guard: ProxyGuard,
    activity: Arc<Activity>,
    /// The lifecycle's epoch (activity times count from it).
    epoch: Instant,
    /// When the request was admitted (the activity it marked).
    admitted: Instant,
}

/// What a client connection keeps of the sandbox it last sent a proxied
/// request to, so that its next request to the same incarnation is
/// admitted ([`Lifecycle::pin_cached`]) without a lock shared by all
/// requests: the hold on the id's lock slot and the incarnation admitted.
/// Holding it keeps only the (small) slot alive; a delete of the sandbox
/// neither waits for it nor misses it.
pub struct PinCache {
    hold: Arc<locks::SlotHold>,
    /// The slot's version `sandbox` was read at.
    version: u64,
    sandbox: Arc<SandboxRef>,
    activity: Arc<Activity>,
    /// How the connection's requests learn of a cancellation.
    watch: Arc<locks::CancelWatch>,
}

impl ProxyPin {
    /// True once a delete cancelled the request.
    pub fn is_cancelled(&self) -> bool {
        self.guard.is_cancelled()
    }

    /// Marks activity of the incarnation the request was admitted for (the
    /// end of a proxied response; a newer incarnation is not its
    /// business: it has activity of its own).
    pub fn touch(&self) {
        self.touch_at(Instant::now());
    }

    /// When the request was admitted (a time read anyway, for a caller
    /// that needs one).
    pub fn admitted(&self) -> Instant {
        self.admitted
    }

    /// [`touch`](Self::touch) as of `at` (a time the caller read anyway).
    pub fn touch_at(&self, at: Instant) {
        self.activity
            .touch(at.saturating_duration_since(self.epoch).as_millis() as u64);
    }

    /// Resolves when a delete cancels the request (see [`ProxyGuard`]).
    pub fn cancellation(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.guard.cancellation()
    }
}

/// A create past the quiesce gate; quiesce waits until none is left.
struct CreateInFlight<'a>(&'a Lifecycle);

impl Drop for CreateInFlight<'_> {
    fn drop(&mut self) {
        self.0.creating.fetch_sub(1, Ordering::SeqCst);
        self.0.create_done.notify_waiters();
    }
}

impl Lifecycle {
    pub fn new(backend: Arc<dyn Backend>, settings: Settings, metrics: Arc<Metrics>) -> Self {
        Lifecycle {
            backend,
            settings,
            metrics,
            tracked: Mutex::new(HashMap::new()),
            locks: Arc::new(IdLocks::default()),
            quiescing: AtomicBool::new(false),
            creating: AtomicUsize::new(0),
            create_done: Notify::new(),
            epoch: Instant::now(),
        }
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The normalized form of a create's `"image"`, when `[images]
    /// allowed` lists it.
    fn allowed_image(&self, image: &str) -> Result<String, LifecycleError> {
        let norm = crate::images::normalize(image)
            .map_err(|e| LifecycleError::ImageNotAllowed(e.to_string()))?;
        if self.settings.allowed_images.contains(&norm) {
            Ok(norm)
        } else {
            Err(LifecycleError::ImageNotAllowed(format!(
                "{image:?} is not in this node's [images] allowed list"
            )))
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Tracked>> {
        self.tracked.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn track(&self, record: &SandboxRecord) {
        let now = self.now_ms();
        let mut table = self.table();
        // Under the table's lock: a cached admission of the id's previous
        // incarnation sees the new version.
        self.locks.bump(&record.sandbox_id);
        table.insert(
            record.sandbox_id.clone(),
            Tracked {
                sandbox: Arc::new(SandboxRef::of(record)),
                activity: Arc::new(Activity::new(now)),
                oom_counted: AtomicBool::new(false),
            },
        );
    }

    /// Stops tracking `id`.
    fn untrack(&self, id: &str) {
        let mut table = self.table();
        if table.remove(id).is_some() {
            self.locks.bump(id);
        }
    }

    /// The admitted incarnation of `id`, if any.
    fn admitted(&self, id: &str) -> Option<SandboxRef> {
        self.table().get(id).map(|t| SandboxRef::clone(&t.sandbox))
    }

    /// `sandbox` as the backend has it now, for an answer (status and OOM
    /// flag up to date, kills counted); `None` when the backend has no
    /// such incarnation.
    async fn read(&self, sandbox: SandboxRef) -> Option<SandboxRecord> {
        let [r] = self.read_all(&[sandbox]).await.try_into().ok()?;
        r
    }

    /// [`read`](Self::read) of several, in one backend call.
    async fn read_all(&self, sandboxes: &[SandboxRef]) -> Vec<Option<SandboxRecord>> {
        let records = self.backend.status(sandboxes).await;
        self.count_oom_kills(records.iter().flatten());
        records
    }

    /// Marks activity of `id`; returns false when it is not tracked.
    pub fn touch(&self, id: &str) -> bool {
        let now = self.now_ms();
        match self.table().get(id) {
            Some(t) => {
                t.activity.touch(now);
                true
            }
            None => false,
        }
    }

    /// Whether `id` is admitted (no activity, no backend call).
    pub fn is_tracked(&self, id: &str) -> bool {
        self.table().contains_key(id)
    }

    /// Marks activity of `id` only if it is still at `generation` (the end
    /// of a proxied response: a newer incarnation is not its business).
    pub fn touch_generation(&self, id: &str, generation: &str) {
        let now = self.now_ms();
        if let Some(t) = self.table().get(id) {
            if t.sandbox.generation == generation {
                t.activity.touch(now);
            }
        }
    }

    /// Number of tracked sandboxes.
    pub fn tracked_count(&self) -> usize {
        self.table().len()
    }

    pub fn is_quiescing(&self) -> bool {
        self.quiescing.load(Ordering::SeqCst)
    }

    /// Passes the quiesce gate: counts the create as in flight, then
    /// checks the gate. Quiesce closes the gate, then waits for the count
    /// to drop to zero; with both sides sequentially consistent, a create
    /// either sees the gate closed or is counted before quiesce looks.
    fn enter_create(&self) -> Result<CreateInFlight<'_>, LifecycleError> {
        self.creating.fetch_add(1, Ordering::SeqCst);
        let entered = CreateInFlight(self);
        if self.is_quiescing() {
            return Err(LifecycleError::Quiescing);
        }
        Ok(entered)
    }

    /// Returns once no create is past the gate.
    async fn creates_finished(&self) {
        loop {
            let notified = self.create_done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.creating.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Adopts everything the backend already runs (start-up). Each is
    /// tracked as active "now" (its idle time starts again; one frozen or
    /// reclaimed stays so, as its record says, until a request wakes it).
    pub async fn adopt_existing(&self) -> Result<usize, BackendError> {
        let found = self.backend.list().await?;
        let n = found.len();
        for record in &found {
            let idle_state = record.idle.map_or("none", |m| m.state.as_str());
            info!(sandbox_id = %record.sandbox_id, generation = %record.generation, idle_state,
                  "adopted sandbox");
            self.track(record);
        }
        Ok(n)
    }

    /// Create or reuse (see the contract).
    pub async fn create(&self, mut req: CreateRequest) -> Result<SandboxRecord, LifecycleError> {
        if let Some(image) = req.image.take() {
            req.image = Some(self.allowed_image(&image)?);
        }
        let spec =
            SandboxSpec::from_request(req, &self.settings.global_env, &self.settings.limits)?;
        let id = spec.sandbox_id.clone();
        // `generation` is recorded once known (reuse, or by the backend as
        // soon as it makes one), so nested lines carry it too.
        let span = tracing::info_span!("create", sandbox_id = %id, uid = %spec.identity.uid,
                                       generation = tracing::field::Empty);
        async {
            if self.is_quiescing() {
                return Err(LifecycleError::Quiescing);
            }
            let (slot, _op) = self.locks.operation(&id).await;
            // Past this point quiesce waits for this create to finish.
            let _in_flight = self.enter_create()?;
            if let Some(admitted) = self.admitted(&id) {
                // The record as the backend has it now (its OOM flag too:
                // the answer shows it); one it no longer has is stale.
                let existing = self.read(admitted.clone()).await;
                if let Some(existing) = &existing {
                    if existing.identity != spec.identity && !self.backend.rebindable(&admitted) {
                        return Err(LifecycleError::IdentityMismatch(id.clone()));
                    }
                }
                let status = existing.as_ref().map_or(SandboxStatus::Exited, |r| r.status);
                if let Some(existing) = existing.filter(|_| status == SandboxStatus::Running) {
                    tracing::Span::current().record("generation", existing.generation.as_str());
                    self.touch(&id);
                    // Frozen or reclaimed: woken, as by a request.
                    let existing = self.awake(existing).await?;
                    info!(generation = %existing.generation, "reusing running sandbox");
                    return Ok(existing);
                }
                warn!(generation = %admitted.generation, status = status.as_str(),
                      "replacing stale sandbox");
                let _excl = self.exclusive(&slot).await;
                match self.backend.delete(&id, &admitted.generation).await {
                    Ok(()) => {}
                    // The incarnation we tracked was already replaced
                    // behind our back (another replica, an operator): it
                    // is not ours to delete; forget it and create anew
                    // (the backend checks the identity of what it finds).
                    Err(BackendError::Conflict(reason)) => {
                        warn!(%reason, "stale incarnation already replaced; forgetting it");
                    }
                    Err(e) => return Err(e.into()),
                }
                self.untrack(&id);
            }
            let started = Instant::now();
            let record = self
                .backend
                .create(&spec, self.settings.health_timeout)
                .await?;
            tracing::Span::current().record("generation", record.generation.as_str());
            self.metrics
                .create_seconds
                .observe(started.elapsed().as_secs_f64());
            info!(generation = %record.generation, elapsed_ms = started.elapsed().as_millis() as u64,
                  "sandbox created");
            self.track(&record);
            Ok(record)
        }
        .instrument(span)
        .await
    }

    /// Discover: the record as the backend has it now. Counts as activity,
    /// and wakes a frozen or reclaimed sandbox (as a proxied request does).
    /// A sandbox that is not running is absent (404, not activity), as the
    /// provisioner the platform's client was written for answered: the
    /// client then drops its cached connection and creates a new one.
    /// `list` still shows it.
    pub async fn discover(&self, id: &str) -> Result<SandboxRecord, LifecycleError> {
        validate_sandbox_id(id)?;
        let admitted = self.admitted(id).ok_or(LifecycleError::NotFound)?;
        let fresh = self
            .read(admitted)
            .await
            .filter(|r| r.status == SandboxStatus::Running)
            .ok_or(LifecycleError::NotFound)?;
        self.touch_generation(id, &fresh.generation);
        self.awake(fresh).await
    }

    /// `record` (read for an answer) once its incarnation is awake: as it
    /// is when it was not asleep; else woken like a proxied request
    /// (admitted through the id's gate, so a delete either waits for the
    /// wake or the wake finds the sandbox gone; only that incarnation: a
    /// successor is never woken) and read again.
    async fn awake(&self, record: SandboxRecord) -> Result<SandboxRecord, LifecycleError> {
        if !record.idle.is_some_and(|m| m.state.asleep()) {
            return Ok(record);
        }
        let sandbox = SandboxRef::of(&record);
        drop(
            self.pin_inner(&sandbox.sandbox_id, &mut None, Some(&sandbox.generation))
                .await?,
        );
        self.read(sandbox)
            .await
            .filter(|r| r.status == SandboxStatus::Running)
            .ok_or(LifecycleError::NotFound)
    }

    /// Wakes the incarnation of a pinned request (its backend said asleep):
    /// concurrent requests share one thaw (the backend's: the first does
    /// it, the others wait for it and find it awake). Counted and logged
    /// once, by the one that woke it.
    async fn wake(&self, pin: &ProxyPin) -> Result<(), LifecycleError> {
        let started = Instant::now();
        let sandbox = &pin.sandbox;
        match self.backend.wake(sandbox).await {
            Ok(Some(from)) => {
                let took = started.elapsed();
                pin.activity.woken();
                self.metrics.wake(from.as_str(), took.as_secs_f64());
                info!(sandbox_id = %sandbox.sandbox_id, generation = %sandbox.generation,
                      from = from.as_str(), wake_us = took.as_micros() as u64, "sandbox woken");
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => {
                warn!(sandbox_id = %sandbox.sandbox_id, generation = %sandbox.generation, error = %e,
                      "cannot wake the sandbox");
                Err(e.into())
            }
        }
    }

    /// The ladder in force: `[idle]`'s, without the freeze and reclaim
    /// when the backend cannot freeze.
    pub fn ladder(&self) -> Ladder {
        match self.backend.can_freeze() {
            true => self.settings.ladder,
            false => self.settings.ladder.without_steps(),
        }
    }

    /// Counts of `records` by place on the hibernation ladder for
    /// `/metrics`; none when the backend cannot freeze (no series).
    pub fn idle_counts(&self, records: &[SandboxRecord]) -> Vec<(&'static str, i64)> {
        if !self.backend.can_freeze() {
            return Vec::new();
        }
        let mut counts = [("active", 0i64), ("frozen", 0), ("reclaimed", 0)];
        for m in records.iter().filter_map(|r| r.idle) {
            if let Some(c) = counts.iter_mut().find(|(k, _)| *k == m.state.as_str()) {
                c.1 += 1;
            }
        }
        counts.to_vec()
    }

    /// Counts in the metrics each OOM kill the backend reported of a
    /// tracked incarnation, once.
    fn count_oom_kills<'a>(&self, records: impl Iterator<Item = &'a SandboxRecord>) {
        let mut killed = records.filter(|r| r.oom_killed == Some(true)).peekable();
        if killed.peek().is_none() {
            return;
        }
        let table = self.table();
        for r in killed {
            if let Some(t) = table.get(&r.sandbox_id) {
                if t.sandbox.generation == r.generation
                    && !t.oom_counted.swap(true, Ordering::SeqCst)
                {
                    self.metrics.oom_kills.inc();
                }
            }
        }
    }

    /// Every tracked sandbox as the backend has it now (one backend call
    /// for all of them, [`Backend::status`]), sorted by id; one the backend
    /// no longer has (deleted meanwhile) is left out.
    pub async fn list(&self) -> Vec<SandboxRecord> {
        let admitted: Vec<SandboxRef> = self
            .table()
            .values()
            .map(|t| SandboxRef::clone(&t.sandbox))
            .collect();
        let mut out: Vec<SandboxRecord> = self
            .read_all(&admitted)
            .await
            .into_iter()
            .flatten()
            .collect();
        out.sort_by(|a, b| a.sandbox_id.cmp(&b.sandbox_id));
        out
    }

    /// Counts of `records` by status for `/metrics`.
    pub fn status_counts(records: &[SandboxRecord]) -> Vec<(&'static str, i64)> {
        let mut counts = [("running", 0i64), ("creating", 0), ("exited", 0)];
        for r in records {
            let s = r.status.as_str();
            if let Some(c) = counts.iter_mut().find(|(k, _)| *k == s) {
                c.1 += 1;
            }
        }
        counts.to_vec()
    }

    /// Deletes `id`, fenced on `expected_generation` when given. Absent: Ok.
    /// Returns whether something was deleted.
    pub async fn delete(
        &self,
        id: &str,
        expected_generation: Option<&str>,
    ) -> Result<bool, LifecycleError> {
        validate_sandbox_id(id)?;
        self.delete_inner(id, expected_generation, None).await
    }

    /// The one delete path (API, reaper, quiesce). With `unless_touched`,
    /// it skips a sandbox whose touch counter moved since it was observed.
    async fn delete_inner(
        &self,
        id: &str,
        expected_generation: Option<&str>,
        unless_touched: Option<u64>,
    ) -> Result<bool, LifecycleError> {
        let span = tracing::info_span!(
            "delete",
            sandbox_id = %id,
            generation = tracing::field::Empty
        );
        async {
            let started = Instant::now();
            let (slot, _op) = self.locks.operation(id).await;
            let check = |lc: &Self| -> Result<Option<SandboxRef>, LifecycleError> {
                let table = lc.table();
                let Some(t) = table.get(id) else {
                    return Ok(None);
                };
                if let Some(expected) = expected_generation {
                    if t.sandbox.generation != expected {
                        return Err(LifecycleError::GenerationMismatch {
                            id: id.to_string(),
                            live: t.sandbox.generation.clone(),
                            expected: expected.to_string(),
                        });
                    }
                }
                Ok(Some(SandboxRef::clone(&t.sandbox)))
            };
            let Some(seen) = check(self)? else {
                return Ok(false);
            };
            tracing::Span::current().record("generation", seen.generation.as_str());
            let touched = |lc: &Self, seen: u64| {
                let now = lc.table().get(id).map(|t| t.activity.touches());
                let touched = now != Some(seen);
                if touched {
                    info!("sandbox was touched after the reaper looked; kept");
                }
                touched
            };
            // Wait for in-flight proxy requests; block new ones. A delete
            // cancels them after the grace; the reaper never does: a
            // request in flight means the sandbox is not idle, so it keeps
            // the sandbox instead.
            let _excl = match unless_touched {
                None => self.exclusive(&slot).await,
                Some(seen) => {
                    if touched(self, seen) {
                        return Ok(false);
                    }
                    let grace = self.settings.delete_grace;
                    match IdLocks::exclusive_within(&slot, grace).await {
                        Some(x) => x,
                        None => {
                            info!("a proxied request is in flight; kept");
                            return Ok(false);
                        }
                    }
                }
            };
            let Some(record) = check(self)? else {
                return Ok(false);
            };
            if let Some(seen) = unless_touched {
                if touched(self, seen) {
                    return Ok(false);
                }
            }
            match self.backend.delete(id, &record.generation).await {
                Ok(()) => {}
                // What we track was replaced behind our back (another
                // replica): track what exists now instead. A fenced caller
                // observed a stale incarnation (409, nothing touched); an
                // unfenced delete deletes the current one.
                Err(BackendError::Conflict(reason)) => {
                    warn!(%reason, generation = %record.generation,
                          "tracked incarnation was replaced elsewhere");
                    self.untrack(id);
                    let current = self
                        .backend
                        .list()
                        .await?
                        .into_iter()
                        .find(|r| r.sandbox_id == id);
                    let Some(current) = current else {
                        return Ok(false);
                    };
                    self.track(&current);
                    if let Some(expected) = expected_generation {
                        if current.generation != expected {
                            return Err(LifecycleError::GenerationMismatch {
                                id: id.to_string(),
                                live: current.generation,
                                expected: expected.to_string(),
                            });
                        }
                    }
                    self.backend.delete(id, &current.generation).await?;
                }
                Err(e) => return Err(e.into()),
            }
            self.untrack(id);
            self.metrics
                .delete_seconds
                .observe(started.elapsed().as_secs_f64());
            info!(generation = %record.generation, elapsed_ms = started.elapsed().as_millis() as u64,
                  "sandbox deleted");
            Ok(true)
        }
        .instrument(span)
        .await
    }

    /// The exclusive hold of a delete (see [`IdLocks::exclusive`]), with
    /// the configured grace; says when it had to cancel requests.
    async fn exclusive(&self, slot: &locks::SlotRef<'_>) -> locks::Exclusive {
        let grace = self.settings.delete_grace;
        let x = IdLocks::exclusive(slot, grace).await;
        if x.cancelled > 0 {
            warn!(
                cancelled = x.cancelled,
                grace_ms = grace.as_millis() as u64,
                "in-flight proxy requests cut: still running after the delete grace"
            );
        }
        x
    }

    /// Admits a proxy request for `id`: waits while a delete of it runs,
    /// then pins it until the returned value is dropped. Marks activity.
    /// A sandbox that is not running is absent (404), like on discover.
    pub async fn pin(&self, id: &str) -> Result<ProxyPin, LifecycleError> {
        self.pin_cached(id, &mut None).await
    }

    /// [`pin`](Self::pin) for a client connection that keeps `cache`
    /// between its requests: while the cache holds `id` and its admitted
    /// incarnation has not changed since, the request is admitted with one
    /// atomic step on the id's own slot (no lock shared by all requests);
    /// otherwise the incarnation is read from the table and the cache
    /// refilled. A request that
    /// is refused (absent, not running) empties it.
    pub async fn pin_cached(
        &self,
        id: &str,
        cache: &mut Option<PinCache>,
    ) -> Result<ProxyPin, LifecycleError> {
        self.pin_inner(id, cache, None).await
    }

    /// [`pin_cached`](Self::pin_cached), admitting only the incarnation
    /// `expect` when given (absent otherwise: nothing of another
    /// incarnation is touched, nor woken).
    async fn pin_inner(
        &self,
        id: &str,
        cache: &mut Option<PinCache>,
        expect: Option<&str>,
    ) -> Result<ProxyPin, LifecycleError> {
        let expected = |s: &SandboxRef| expect.is_none_or(|g| g == s.generation);
        if let Some(c) = cache
            .as_ref()
            .filter(|c| c.hold.id() == id && expected(&c.sandbox))
        {
            if let Some(guard) = c.hold.try_pin(&c.watch) {
                // Entered before any delete of it closed the gate (which
                // then waits for this request), or after the delete and
                // the new version it made.
                if c.hold.version() == c.version {
                    let pin = ProxyPin {
                        sandbox: c.sandbox.clone(),
                        guard,
                        activity: c.activity.clone(),
                        epoch: self.epoch,
                        admitted: self.epoch,
                    };
                    return self.admit(pin, cache).await;
                }
            }
        }
        validate_sandbox_id(id)?;
        let (hold, watch) = match cache.take() {
            Some(c) if c.hold.id() == id => (c.hold, c.watch),
            _ => {
                let hold = self.locks.hold(id);
                let watch = hold.watch();
                (hold, watch)
            }
        };
        loop {
            // The version before the incarnation: a change after this read is
            // seen below.
            let version = hold.version();
            let (sandbox, activity) = match self.table().get(id) {
                Some(t) if expected(&t.sandbox) => (t.sandbox.clone(), t.activity.clone()),
                _ => return Err(LifecycleError::NotFound),
            };
            let guard = hold.pin(&watch).await;
            // A delete (or a new incarnation) may have come while we waited.
            if hold.version() != version {
                continue;
            }
            *cache = Some(PinCache {
                hold: hold.clone(),
                version,
                sandbox: sandbox.clone(),
                activity: activity.clone(),
                watch: watch.clone(),
            });
            let pin = ProxyPin {
                sandbox,
                guard,
                activity,
                epoch: self.epoch,
                admitted: self.epoch,
            };
            return self.admit(pin, cache).await;
        }
    }

    /// The last step of an admission: the sandbox must be running, and is
    /// woken first when it is frozen or reclaimed (before anything is
    /// forwarded).
    async fn admit(
        &self,
        mut pin: ProxyPin,
        cache: &mut Option<PinCache>,
    ) -> Result<ProxyPin, LifecycleError> {
        match self.backend.running(&pin.sandbox).await {
            Running::Yes => {}
            Running::Asleep => {
                if let Err(e) = self.wake(&pin).await {
                    *cache = None;
                    return Err(e);
                }
            }
            Running::No => {
                *cache = None;
                return Err(LifecycleError::NotFound);
            }
        }
        pin.admitted = Instant::now();
        pin.touch_at(pin.admitted);
        Ok(pin)
    }

    /// Opens a connection to the sandbox `id` at `generation` (the proxy's
    /// connector). Refuses when that incarnation is no longer tracked.
    pub async fn connect(&self, id: &str, generation: &str) -> Result<Upstream, BackendError> {
        let sandbox = self
            .admitted(id)
            .filter(|s| s.generation == generation)
            .ok_or_else(|| BackendError::Unreachable(format!("sandbox {id} is gone").into()))?;
        self.backend.connect(&sandbox).await
    }

    /// Closes the create gate, waits for the creates already past it,
    /// deletes every sandbox (generation-fenced) and waits until the
    /// backend lists none, or fails at the deadline.
    pub async fn quiesce(&self, timeout: Duration) -> Result<usize, LifecycleError> {
        self.quiescing.store(true, Ordering::SeqCst);
        info!(
            timeout_s = timeout.as_secs(),
            creates_in_flight = self.creating.load(Ordering::SeqCst),
            "quiescing: create gate closed"
        );
        let deleted = Arc::new(AtomicU64::new(0));
        let work = async {
            // A create that passed the gate is in neither the table nor the
            // backend's list yet: wait for it, or it appears afterwards.
            self.creates_finished().await;
            loop {
                let mut targets: Vec<(String, String)> = self
                    .table()
                    .values()
                    .map(|t| (t.sandbox.sandbox_id.clone(), t.sandbox.generation.clone()))
                    .collect();
                // Anything the backend has that we do not track (made behind
                // our back, or adopted late) goes too.
                let listed = self.backend.list().await?;
                for r in &listed {
                    if !targets.iter().any(|(id, _)| id == &r.sandbox_id) {
                        self.track(r);
                        targets.push((r.sandbox_id.clone(), r.generation.clone()));
                    }
                }
                if targets.is_empty() && listed.is_empty() {
                    return Ok::<(), LifecycleError>(());
                }
                let results = join_all(
                    targets
                        .iter()
                        .map(|(id, generation)| self.delete_inner(id, Some(generation), None)),
                )
                .await;
                for r in results {
                    match r {
                        Ok(true) => {
                            deleted.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(false) | Err(LifecycleError::GenerationMismatch { .. }) => {}
                        Err(e) => warn!(error = %e, "quiesce: delete failed; retrying"),
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(Ok(())) => {
                let n = deleted.load(Ordering::SeqCst) as usize;
                info!(deleted = n, "quiesce complete");
                Ok(n)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(LifecycleError::QuiesceTimeout(
                timeout,
                self.tracked_count() + self.creating.load(Ordering::SeqCst),
            )),
        }
    }

    /// Deletes every tracked sandbox (daemon shutdown when configured):
    /// [`STOP_CONCURRENCY`] at a time, each within its delete grace, all
    /// within the stop timeout (the rest is left running and adopted at the
    /// next start). Returns how many were deleted.
    pub async fn stop_all(&self) -> usize {
        let ids: Vec<(String, String)> = self
            .table()
            .values()
            .map(|t| (t.sandbox.sandbox_id.clone(), t.sandbox.generation.clone()))
            .collect();
        let total = ids.len();
        let deleted = AtomicUsize::new(0);
        let deleted = &deleted;
        let work = futures_util::stream::iter(ids)
            .map(|(id, generation)| async move {
                match self.delete_inner(&id, Some(&generation), None).await {
                    Ok(_) => {
                        deleted.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) => warn!(sandbox_id = %id, error = %e, "stop on exit failed"),
                }
            })
            .buffer_unordered(STOP_CONCURRENCY)
            .collect::<Vec<()>>();
        let timeout = self.settings.stop_timeout;
        if tokio::time::timeout(timeout, work).await.is_err() {
            warn!(
                timeout_s = timeout.as_secs(),
                deleted = deleted.load(Ordering::SeqCst),
                left = total - deleted.load(Ordering::SeqCst),
                "stop on exit: deadline reached; the rest keep running and are adopted at the next start"
            );
        }
        self.backend.settle().await;
        deleted.load(Ordering::SeqCst)
    }

    /// Reaper delete: fenced on the observed generation and skipped when
    /// touched since it was observed.
    pub(crate) async fn reap(&self, o: &Observation) -> Result<bool, LifecycleError> {
        let done = self
            .delete_inner(&o.id, Some(&o.generation), Some(o.touches))
            .await?;
        if done {
            self.metrics.reaped.inc();
        }
        Ok(done)
    }

    /// Starts the idle reaper (when enabled); it runs until the runtime stops.
    pub fn spawn_reaper(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        idle::spawn(self.clone())
    }

    /// Number of live per-id lock slots (leak checks in tests).
    pub fn live_lock_slots(&self) -> usize {
        self.locks.live_slots()
    }
}
