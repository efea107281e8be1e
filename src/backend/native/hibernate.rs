//! Hibernation of idle sandboxes, the native backend's part: freezing,
//! reclaiming and waking one incarnation's cgroup, each step recorded in
//! the table's record (`idle`, what every answer shows) and in its
//! `state.json` (on the way down before the cgroup is frozen, on the way
//! up after it is thawed: a sandbox is never frozen without a record of
//! it, and a restarted daemon adopts it with its state), what the idle
//! reaper reads of each sandbox (its state and CPU time), and the node's
//! swap. When to take which step is the lifecycle's idle rule
//! (`crate::lifecycle`), not this module's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tracing::{info, warn};

use super::{blocking, NativeBackend, NativeError};
use crate::backend::{IdleSample, ReclaimOutcome, SandboxRef, SwapInfo};
use crate::cgroups::SandboxCgroup;
use crate::model::{IdleMark, IdleState, SandboxStatus};

/// A reclaim that leaves more than this share of the sandbox's anonymous
/// memory in place (and more than [`INCOMPLETE_FLOOR`]) did not finish.
const INCOMPLETE_SHARE: f64 = 0.10;
const INCOMPLETE_FLOOR: u64 = 4 << 20;

/// One incarnation's hibernation: the lock its steps and its wakes take
/// (concurrent wakes share one thaw; none overlaps a step) and the order
/// of its `state.json` writes.
#[derive(Debug, Default)]
pub(super) struct Steps {
    lock: tokio::sync::Mutex<()>,
    pub(super) record: IdleRecord,
}

/// Orders the writes of one incarnation's `state.json` by the ladder (and
/// the delete's), so the record of a wake can be written behind the
/// request (off its path) and still never overwrite a later one: each
/// write is an intent with a sequence number, done under the lock only if
/// no later intent came meanwhile.
#[derive(Debug, Default)]
pub(super) struct IdleRecord {
    lock: Mutex<()>,
    seq: AtomicU64,
}

impl IdleRecord {
    /// A new intent: every earlier one not yet written is dropped.
    fn intent(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Runs `write` under the lock unless an intent later than `seq` came.
    fn write_if_latest<T>(&self, seq: u64, write: impl FnOnce() -> T) -> Option<T> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        (self.seq.load(Ordering::SeqCst) == seq).then(write)
    }

    /// A new intent, written now.
    pub(super) fn write_latest<T>(&self, write: impl FnOnce() -> T) -> T {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.seq.fetch_add(1, Ordering::SeqCst);
        write()
    }
}

impl NativeBackend {
    /// The cgroup and the steps of `s`'s live incarnation, while it runs.
    fn hibernation(&self, s: &SandboxRef) -> Result<(Arc<SandboxCgroup>, Arc<Steps>), NativeError> {
        let live = self.live();
        let not_running = || NativeError::NotRunning {
            id: s.sandbox_id.clone(),
        };
        let l = live.get(&s.sandbox_id).ok_or_else(not_running)?;
        if l.record.generation != s.generation {
            return Err(NativeError::OtherGeneration {
                id: s.sandbox_id.clone(),
            });
        }
        let cg = l.cgroup.clone().ok_or_else(not_running)?;
        Ok((cg, l.steps.clone()))
    }

    /// The idle state of `s` as the table has it (`None`: not running, or
    /// not that incarnation).
    fn idle_state(&self, s: &SandboxRef) -> Option<IdleState> {
        let live = self.live();
        let l = live
            .get(&s.sandbox_id)
            .filter(|l| l.record.generation == s.generation)?;
        l.record.idle.map(|m| m.state)
    }

    /// Sets the table's idle mark of `s` (the record every answer shows)
    /// while it is that incarnation and runs.
    fn set_idle(&self, s: &SandboxRef, mark: IdleMark) {
        let mut live = self.live();
        if let Some(l) = live
            .get_mut(&s.sandbox_id)
            .filter(|l| l.record.generation == s.generation)
            .filter(|l| l.record.status == SandboxStatus::Running)
        {
            l.record.idle = Some(mark);
        }
    }

    /// Writes the idle state of `s` into its `state.json` (active: no
    /// field).
    fn record_idle(&self, s: &SandboxRef, mark: IdleMark) -> Result<(), NativeError> {
        let idle = mark.state.asleep().then_some(mark);
        let state = &self.sandboxes.state;
        match state.load(&s.sandbox_id)? {
            Some(mut st) if st.generation == s.generation => {
                if st.idle != idle {
                    st.idle = idle;
                    state.update(&st)?;
                }
                Ok(())
            }
            _ => Err(NativeError::OtherGeneration {
                id: s.sandbox_id.clone(),
            }),
        }
    }

    /// Freezes `s` (a no-op when it is asleep already): recorded first
    /// (`state.json`, then the table, so an admission meanwhile finds it
    /// asleep and waits for this step to wake it), then its cgroup frozen;
    /// a freeze that fails is undone (thawed, recorded active).
    pub(super) async fn freeze_sandbox(&self, s: &SandboxRef) -> Result<(), NativeError> {
        let (cg, steps) = self.hibernation(s)?;
        let _step = steps.lock.lock().await;
        match self.idle_state(s) {
            Some(IdleState::Active) => {}
            Some(_) => return Ok(()),
            None => {
                let id = s.sandbox_id.clone();
                return Err(NativeError::NotRunning { id });
            }
        }
        let (b, s, steps) = (self.clone(), s.clone(), steps.clone());
        blocking(move || {
            let mark = IdleMark::now(IdleState::Frozen);
            steps.record.write_latest(|| b.record_idle(&s, mark))?;
            b.set_idle(&s, mark);
            if let Err(e) = cg.freeze() {
                let _ = cg.thaw();
                let active = IdleMark::now(IdleState::Active);
                b.set_idle(&s, active);
                let _ = steps.record.write_latest(|| b.record_idle(&s, active));
                return Err(e.into());
            }
            info!(sandbox_id = %s.sandbox_id, generation = %s.generation, "sandbox frozen");
            Ok(())
        })
        .await
    }

    /// Pushes the memory of the frozen `s` to swap when the node has room
    /// for its anonymous memory; records it reclaimed when all of it went.
    /// Never thaws it: what fails leaves it frozen, with the reason.
    pub(super) async fn reclaim_sandbox(
        &self,
        s: &SandboxRef,
    ) -> Result<ReclaimOutcome, NativeError> {
        let (cg, steps) = self.hibernation(s)?;
        let _step = steps.lock.lock().await;
        if self.idle_state(s) != Some(IdleState::Frozen) {
            let id = s.sandbox_id.clone();
            return Err(NativeError::NotFrozen { id });
        }
        let (b, s, steps) = (self.clone(), s.clone(), steps.clone());
        blocking(move || {
            let usage = cg.memory_usage()?;
            let swap = swap_info();
            if swap.total_bytes == 0 {
                return Ok(ReclaimOutcome {
                    bytes: 0,
                    failure: Some("no_swap"),
                    detail: "the node has no swap".into(),
                });
            }
            if swap.free_bytes < usage.anon {
                return Ok(ReclaimOutcome {
                    bytes: 0,
                    failure: Some("swap_full"),
                    detail: format!(
                        "{} MiB of swap free, the sandbox holds {} MiB of anonymous memory",
                        swap.free_bytes >> 20,
                        usage.anon >> 20
                    ),
                });
            }
            let r = cg.reclaim()?;
            let left = r.anon_left();
            let incomplete =
                left > INCOMPLETE_FLOOR && left as f64 > r.before.anon as f64 * INCOMPLETE_SHARE;
            if incomplete {
                let free = swap_info().free_bytes;
                return Ok(ReclaimOutcome {
                    bytes: r.reclaimed(),
                    failure: Some(if free < left {
                        "swap_full"
                    } else {
                        "incomplete"
                    }),
                    detail: format!(
                        "{} of {} MiB of anonymous memory still in memory, {} MiB of swap free",
                        left >> 20,
                        r.before.anon >> 20,
                        free >> 20
                    ),
                });
            }
            let mark = IdleMark::now(IdleState::Reclaimed);
            steps.record.write_latest(|| b.record_idle(&s, mark))?;
            b.set_idle(&s, mark);
            info!(sandbox_id = %s.sandbox_id, generation = %s.generation,
                  reclaimed_mib = r.reclaimed() >> 20, usage_mib = r.after.bytes >> 20,
                  swap_mib = r.after.swap >> 20, "sandbox memory reclaimed");
            Ok(ReclaimOutcome {
                bytes: r.reclaimed(),
                failure: None,
                detail: String::new(),
            })
        })
        .await
    }

    /// Wakes `s` when it is asleep and returns the state it woke from
    /// (`None`: active already, e.g. woken by a concurrent request, which
    /// this one waited for). On the request's path: its cgroup is thawed
    /// here (one small write) and the table says active at once; its
    /// `state.json` is written behind, on a blocking thread (a crash before
    /// that write leaves a record that says asleep over a thawed sandbox,
    /// which the next request "wakes" again, a thaw of a thawed cgroup
    /// being a no-op; never the other way round).
    pub(super) async fn wake_sandbox(
        &self,
        s: &SandboxRef,
    ) -> Result<Option<IdleState>, NativeError> {
        let (cg, steps) = self.hibernation(s)?;
        let _step = steps.lock.lock().await;
        let from = match self.idle_state(s) {
            Some(state) if state.asleep() => state,
            Some(_) => return Ok(None),
            None => {
                let id = s.sandbox_id.clone();
                return Err(NativeError::NotRunning { id });
            }
        };
        cg.thaw()?;
        let mark = IdleMark::now(IdleState::Active);
        self.set_idle(s, mark);
        let seq = steps.record.intent();
        let (b, s, steps) = (self.clone(), s.clone(), steps.clone());
        tokio::task::spawn_blocking(move || {
            if let Some(Err(e)) = steps
                .record
                .write_if_latest(seq, || b.record_idle(&s, mark))
            {
                warn!(sandbox_id = %s.sandbox_id, error = %e, "cannot record the woken sandbox active");
            }
        });
        Ok(Some(from))
    }

    /// What the idle reaper reads of `sandboxes`: for each running one its
    /// idle state (from the table) and its cgroup's CPU time (a file read
    /// each, outside the table's lock).
    pub(super) fn idle_samples(&self, sandboxes: &[SandboxRef]) -> Vec<Option<IdleSample>> {
        let parts: Vec<Option<(IdleState, Arc<SandboxCgroup>)>> = {
            let live = self.live();
            sandboxes
                .iter()
                .map(|s| {
                    let l = live
                        .get(&s.sandbox_id)
                        .filter(|l| l.record.generation == s.generation)
                        .filter(|l| l.record.status == SandboxStatus::Running)?;
                    Some((l.record.idle?.state, l.cgroup.clone()?))
                })
                .collect()
        };
        parts
            .into_iter()
            .map(|p| {
                let (state, cg) = p?;
                Some(IdleSample {
                    state,
                    cpu_usec: cg.cpu_usage_usec().ok(),
                })
            })
            .collect()
    }

    /// The idle state to adopt a sandbox with: its record's, or frozen when
    /// its cgroup is frozen without one (frozen by hand, or by a daemon
    /// that did not record it), which is then recorded.
    pub(super) fn adopted_idle(&self, st: &mut super::SandboxState, cg: Option<&SandboxCgroup>) {
        if st.idle.is_some() || !cg.is_some_and(|cg| cg.is_frozen().unwrap_or(false)) {
            return;
        }
        warn!(sandbox_id = %st.sandbox_id, "adopted sandbox is frozen without a record of it: recorded frozen (the next request wakes it)");
        st.idle = Some(IdleMark::now(IdleState::Frozen));
        if let Err(e) = self.sandboxes.state.update(st) {
            warn!(sandbox_id = %st.sandbox_id, error = %e, "cannot record the adopted sandbox frozen");
        }
    }
}

/// The node's swap: `/proc/swaps` (devices and kinds) and `/proc/meminfo`
/// (`SwapTotal`, `SwapFree`).
pub fn swap_info() -> SwapInfo {
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    parse_swap(&swaps, &meminfo)
}

fn parse_swap(swaps: &str, meminfo: &str) -> SwapInfo {
    let devices = swaps
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (name, kind) = (f.next()?, f.next()?);
            let kind = if name.starts_with("/dev/zram") {
                "zram"
            } else {
                kind
            };
            Some((name.to_string(), kind.to_string()))
        })
        .collect();
    let kib = |key: &str| {
        meminfo.lines().find_map(|l| {
            let rest = l.strip_prefix(key)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse::<u64>().ok()
        })
    };
    SwapInfo {
        devices,
        total_bytes: kib("SwapTotal").unwrap_or(0) * 1024,
        free_bytes: kib("SwapFree").unwrap_or(0) * 1024,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_written_behind_never_overwrites_a_later_one() {
        let rec = IdleRecord::default();
        let log = Mutex::new(Vec::new());
        // A wake's record, not written yet ...
        let behind = rec.intent();
        // ... a freeze comes first and writes its own ...
        rec.write_latest(|| log.lock().unwrap().push("frozen"));
        // ... then the wake's turn comes: dropped.
        assert_eq!(
            rec.write_if_latest(behind, || log.lock().unwrap().push("active")),
            None
        );
        // Alone, it is written.
        let s = rec.intent();
        assert_eq!(
            rec.write_if_latest(s, || log.lock().unwrap().push("active")),
            Some(())
        );
        assert_eq!(*log.lock().unwrap(), ["frozen", "active"]);
    }

    #[test]
    fn swap_kinds_and_sizes() {
        let swaps = "Filename\tType\tSize\tUsed\tPriority\n\
                     /dev/zram0   partition\t4194300\t0\t100\n\
                     /swapfile    file\t1048572\t0\t-2\n";
        let meminfo = "MemTotal: 100 kB\nSwapTotal:  5242872 kB\nSwapFree:   5242000 kB\n";
        let s = parse_swap(swaps, meminfo);
        assert_eq!(
            s.devices,
            vec![
                ("/dev/zram0".to_string(), "zram".to_string()),
                ("/swapfile".to_string(), "file".to_string())
            ]
        );
        assert_eq!(s.kind(), "zram+disk");
        assert_eq!(s.total_bytes, 5_242_872 * 1024);
        assert_eq!(s.free_bytes, 5_242_000 * 1024);
        let none = parse_swap(
            "Filename\tType\tSize\tUsed\tPriority\n",
            "SwapTotal: 0 kB\n",
        );
        assert_eq!((none.kind(), none.total_bytes), ("none", 0));
        let disk = parse_swap("h\n/dev/sda2 partition 1 0 -2\n", "");
        assert_eq!(disk.kind(), "disk");
    }
}
