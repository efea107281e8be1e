//! OOM kills for list without a file read per sandbox per listing.
//!
//! A sandbox's `oom_killed` is its cgroup's `oom_kill` counter (v2
//! `memory.events`, v1 `memory.oom_control`) being above zero: a file read
//! of about 15 µs. Reading it for every live sandbox on every list made
//! list cost grow with the number of sandboxes. Instead, the kernel's
//! node-wide count of OOM kills (`oom_kill` in `/proc/vmstat`, one read)
//! says whether any cgroup's counter can have changed: the kernel counts
//! every OOM kill in both, in the same place (`__oom_kill_process`), before
//! it sends the victim its SIGKILL. So when the node-wide count equals the
//! one a completed scan started from, every flag is as the cgroups' own
//! counters would give it, and nothing is read; else the counters of the
//! live sandboxes not yet flagged are read once (then the count is
//! remembered), which costs what every list used to cost.
//!
//! No stale window: a client can only learn of an OOM kill after its
//! victim got the SIGKILL (a command's exit status through the proxy, the
//! agent's logs), by which time both counters have moved, so the next
//! list reads the sandboxes' counters again. Events (v2 `memory.events`
//! notifications, v1 `cgroup.event_control`) would not give this: v2
//! notifications of a cgroup file are rate-limited (20 ms) and delivered
//! from a work queue, and v1's OOM eventfd is not signalled for a kill by
//! the node-wide OOM killer.
//!
//! Why the scan is correct (a scan reads the node-wide count first, then
//! takes the list of live sandboxes, then reads their counters): a kill
//! counted in the node-wide figure it read happened before it took the
//! list, so it sees the kill in the sandbox's counter, or the sandbox was
//! tracked after the list was taken and [`check`] read its counter after
//! tracking it. A sandbox that exited had its counter read by the exit
//! watcher before its cgroup went. Flags only ever go from unset to set.
//!
//! Discover (one record) still reads its own counter: one read costs less
//! than `/proc/vmstat` (about 50 µs), and so does a list of at most
//! [`DIRECT_MAX`] sandboxes not yet flagged. Without `oom_kill` in
//! `/proc/vmstat` (a kernel without `CONFIG_VM_EVENT_COUNTERS`) every list
//! reads every counter, as before; the daemon says so at start.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tracing::{info, warn};

use super::watch::LiveMap;
use super::Live;
use crate::cgroups::SandboxCgroup;

/// The node-wide counters.
const VMSTAT: &str = "/proc/vmstat";

/// Up to this many sandboxes to check, a list reads their counters
/// directly (cheaper than `/proc/vmstat`).
pub(super) const DIRECT_MAX: usize = 4;

/// The node-wide OOM-kill count a completed scan started from.
pub(super) struct Gate {
    /// `None`: no node-wide count on this kernel (scan every time).
    source: Option<PathBuf>,
    /// That count plus one; 0 before the first scan.
    synced: AtomicU64,
}

impl Gate {
    /// The gate on `/proc/vmstat` (logged once: whether it is usable).
    pub fn new() -> Gate {
        let g = Gate::at(Path::new(VMSTAT));
        match &g.source {
            Some(_) => info!(
                "OOM kills: list reads the sandboxes' counters only after the node-wide oom_kill count in {VMSTAT} moved"
            ),
            None => warn!(
                "no oom_kill count in {VMSTAT}: every list reads the OOM counter of every live sandbox"
            ),
        }
        g
    }

    /// The gate on the node-wide count in `path` (tests: a fake file).
    pub fn at(path: &Path) -> Gate {
        Gate {
            source: node_kills(path).map(|_| path.to_path_buf()),
            synced: AtomicU64::new(0),
        }
    }

    /// Runs `scan` unless no OOM kill happened on the node since a scan
    /// that started after reading the same count completed. Returns
    /// whether it ran.
    pub fn sync(&self, scan: impl FnOnce()) -> bool {
        let node = self.source.as_deref().and_then(node_kills);
        if let Some(n) = node {
            if self.synced.load(Ordering::Acquire) > n {
                return false;
            }
        }
        scan();
        if let Some(n) = node {
            // Another scan that read a later count may have finished
            // first: keep the later one.
            self.synced.fetch_max(n + 1, Ordering::AcqRel);
        }
        true
    }
}

/// `oom_kill` of a `/proc/vmstat`-format file.
fn node_kills(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
}

/// Live sandboxes with a cgroup and no OOM kill recorded yet.
fn unflagged(map: &HashMap<String, Live>) -> impl Iterator<Item = &Live> {
    map.values()
        .filter(|l| l.cgroup.is_some() && l.record.oom_killed != Some(true))
}

/// Reads the counters of the unflagged live sandboxes (the list taken
/// now) and flags those with a kill.
fn scan(live: &LiveMap) {
    let todo: Vec<(String, String, Arc<SandboxCgroup>)> = unflagged(&live.lock())
        .filter_map(|l| {
            let cg = l.cgroup.clone()?;
            Some((l.record.sandbox_id.clone(), l.record.generation.clone(), cg))
        })
        .collect();
    // The reads without the table's lock (file reads).
    let hit: Vec<(String, String)> = todo
        .into_iter()
        .filter(|(_, _, cg)| cg.oom_kills() > 0)
        .map(|(id, generation, _)| (id, generation))
        .collect();
    flag(live, hit);
}

fn flag(live: &LiveMap, hit: Vec<(String, String)>) {
    if hit.is_empty() {
        return;
    }
    let mut map = live.lock();
    for (id, generation) in hit {
        if let Some(l) = map
            .get_mut(&id)
            .filter(|l| l.record.generation == generation)
        {
            l.record.oom_killed = Some(true);
        }
    }
}

/// Reads the counter of `id` at `generation` unless it is flagged already:
/// after it was tracked (a kill during the launch, or one a scan that took
/// its list before the tracking missed), and for a get of a few records.
pub(super) fn check(live: &LiveMap, id: &str, generation: &str) {
    let cg = match live.lock().get(id) {
        Some(l) if l.record.generation == generation && l.record.oom_killed != Some(true) => {
            l.cgroup.clone()
        }
        _ => None,
    };
    if cg.is_some_and(|cg| cg.oom_kills() > 0) {
        flag(live, vec![(id.to_string(), generation.to_string())]);
    }
}

/// Brings every live sandbox's `oom_killed` up to date (see the module
/// doc): directly when at most [`DIRECT_MAX`] are not flagged yet, else
/// through the gate.
pub(super) fn sync(gate: &Gate, live: &LiveMap) {
    let few = unflagged(&live.lock()).take(DIRECT_MAX + 1).count() <= DIRECT_MAX;
    if few {
        scan(live);
    } else {
        gate.sync(|| scan(live));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmstat(dir: &Path, kills: u64) -> PathBuf {
        let p = dir.join("vmstat");
        std::fs::write(
            &p,
            format!("pgfault 9\noom_kill {kills}\nthp_fault_alloc 0\n"),
        )
        .unwrap();
        p
    }

    #[test]
    fn scans_only_after_the_node_count_moved() {
        let dir = tempfile::tempdir().unwrap();
        let path = vmstat(dir.path(), 7);
        let gate = Gate::at(&path);
        assert!(gate.source.is_some());
        let mut scans = 0;
        assert!(gate.sync(|| scans += 1), "the first list scans");
        assert!(!gate.sync(|| scans += 1), "nothing killed since");
        assert!(!gate.sync(|| scans += 1));
        vmstat(dir.path(), 8);
        assert!(gate.sync(|| scans += 1), "a kill somewhere on the node");
        assert!(!gate.sync(|| scans += 1));
        assert_eq!(scans, 2);
    }

    #[test]
    fn a_scan_that_started_earlier_does_not_undo_a_later_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = vmstat(dir.path(), 3);
        let gate = Gate::at(&path);
        // A scan reads 3; while it runs a kill happens and a second scan
        // reads 4 and finishes first.
        assert!(gate.sync(|| {
            vmstat(dir.path(), 4);
            assert!(gate.sync(|| {}));
        }));
        assert!(!gate.sync(|| panic!("4 was scanned")));
        vmstat(dir.path(), 5);
        assert!(gate.sync(|| {}));
    }

    #[test]
    fn without_a_node_count_every_list_scans() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vmstat");
        std::fs::write(&path, "pgfault 9\nthp_fault_alloc 0\n").unwrap();
        let gate = Gate::at(&path);
        assert!(gate.source.is_none());
        let mut scans = 0;
        for _ in 0..3 {
            assert!(gate.sync(|| scans += 1));
        }
        assert_eq!(scans, 3);
        assert!(Gate::at(&dir.path().join("missing")).source.is_none());
    }

    #[test]
    fn parses_the_count() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(node_kills(&vmstat(dir.path(), 12)), Some(12));
        std::fs::write(dir.path().join("bad"), "oom_kill x\n").unwrap();
        assert_eq!(node_kills(&dir.path().join("bad")), None);
    }
}
