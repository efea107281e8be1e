//! The part of the OCI runtime spec (`config.json`) the launcher reads,
//! as serde structs of its own: the field names, defaults and required
//! fields are those of the `oci-spec` crate's types (which the daemon
//! writes the bundle with), the accessors too, so the launch sequence
//! reads the same values. Everything else in the file (the seccomp
//! profile, `linux.resources`, ...) is skipped by the parser. Keeping the
//! launcher off `oci-spec` is part of its dependency budget
//! (`docs/architecture.md`, "Crate map").

use std::collections::HashMap;
use std::path::PathBuf;

use serde::Deserialize;

/// `config.json`, the fields the launcher reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Spec {
    #[serde(default)]
    root: Option<Root>,
    #[serde(default)]
    mounts: Option<Vec<Mount>>,
    #[serde(default)]
    process: Option<Process>,
    #[serde(default)]
    hostname: Option<String>,
    #[serde(default)]
    linux: Option<Linux>,
    #[serde(default)]
    annotations: Option<HashMap<String, String>>,
}

impl Spec {
    pub fn root(&self) -> &Option<Root> {
        &self.root
    }
    pub fn mounts(&self) -> &Option<Vec<Mount>> {
        &self.mounts
    }
    pub fn process(&self) -> &Option<Process> {
        &self.process
    }
    pub fn hostname(&self) -> &Option<String> {
        &self.hostname
    }
    pub fn linux(&self) -> &Option<Linux> {
        &self.linux
    }
    pub fn annotations(&self) -> &Option<HashMap<String, String>> {
        &self.annotations
    }
    /// Whether `linux.seccomp` is there (the launcher compiles it only
    /// with the `compile` feature, from the file's text).
    pub fn has_seccomp(&self) -> bool {
        self.linux.as_ref().is_some_and(|l| l.seccomp.is_some())
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Root {
    #[serde(default)]
    path: PathBuf,
    #[serde(default)]
    readonly: Option<bool>,
}

impl Root {
    pub fn path(&self) -> &PathBuf {
        &self.path
    }
    pub fn readonly(&self) -> Option<bool> {
        self.readonly
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Mount {
    destination: PathBuf,
    #[serde(default, rename = "type")]
    typ: Option<String>,
    #[serde(default)]
    source: Option<PathBuf>,
    #[serde(default)]
    options: Option<Vec<String>>,
}

impl Mount {
    pub fn destination(&self) -> &PathBuf {
        &self.destination
    }
    pub fn typ(&self) -> &Option<String> {
        &self.typ
    }
    pub fn source(&self) -> &Option<PathBuf> {
        &self.source
    }
    pub fn options(&self) -> &Option<Vec<String>> {
        &self.options
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Process {
    user: User,
    #[serde(default)]
    args: Option<Vec<String>>,
    #[serde(default)]
    env: Option<Vec<String>>,
    cwd: PathBuf,
    #[serde(default)]
    capabilities: Option<Capabilities>,
    #[serde(default)]
    rlimits: Option<Vec<PosixRlimit>>,
    #[serde(default)]
    oom_score_adj: Option<i32>,
}

impl Process {
    pub fn user(&self) -> &User {
        &self.user
    }
    pub fn args(&self) -> &Option<Vec<String>> {
        &self.args
    }
    pub fn env(&self) -> &Option<Vec<String>> {
        &self.env
    }
    pub fn cwd(&self) -> &PathBuf {
        &self.cwd
    }
    pub fn capabilities(&self) -> &Option<Capabilities> {
        &self.capabilities
    }
    pub fn rlimits(&self) -> &Option<Vec<PosixRlimit>> {
        &self.rlimits
    }
    pub fn oom_score_adj(&self) -> Option<i32> {
        self.oom_score_adj
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct User {
    #[serde(default)]
    uid: u32,
    #[serde(default)]
    gid: u32,
    #[serde(default)]
    umask: Option<u32>,
    #[serde(default)]
    additional_gids: Option<Vec<u32>>,
}

impl User {
    pub fn uid(&self) -> u32 {
        self.uid
    }
    pub fn gid(&self) -> u32 {
        self.gid
    }
    pub fn umask(&self) -> Option<u32> {
        self.umask
    }
    pub fn additional_gids(&self) -> &Option<Vec<u32>> {
        &self.additional_gids
    }
}

/// The five capability sets, by name (the launcher refuses any that is
/// not empty, so the names are not interpreted).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Capabilities {
    #[serde(default)]
    bounding: Option<Vec<String>>,
    #[serde(default)]
    effective: Option<Vec<String>>,
    #[serde(default)]
    inheritable: Option<Vec<String>>,
    #[serde(default)]
    permitted: Option<Vec<String>>,
    #[serde(default)]
    ambient: Option<Vec<String>>,
}

impl Capabilities {
    /// Whether any of the five sets lists a capability.
    pub fn any(&self) -> bool {
        [
            &self.bounding,
            &self.effective,
            &self.permitted,
            &self.inheritable,
            &self.ambient,
        ]
        .iter()
        .any(|s| s.as_ref().is_some_and(|s| !s.is_empty()))
    }
}

/// `process.rlimits[].type`; the names `oci-spec` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PosixRlimitType {
    RlimitCpu,
    RlimitFsize,
    RlimitData,
    RlimitStack,
    RlimitCore,
    RlimitRss,
    RlimitNproc,
    RlimitNofile,
    RlimitMemlock,
    RlimitAs,
    RlimitLocks,
    RlimitSigpending,
    RlimitMsgqueue,
    RlimitNice,
    RlimitRtprio,
    RlimitRttime,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PosixRlimit {
    #[serde(rename = "type")]
    typ: PosixRlimitType,
    #[serde(default)]
    hard: u64,
    #[serde(default)]
    soft: u64,
}

impl PosixRlimit {
    pub fn typ(&self) -> PosixRlimitType {
        self.typ
    }
    pub fn hard(&self) -> u64 {
        self.hard
    }
    pub fn soft(&self) -> u64 {
        self.soft
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Linux {
    #[serde(default)]
    uid_mappings: Option<Vec<LinuxIdMapping>>,
    #[serde(default)]
    gid_mappings: Option<Vec<LinuxIdMapping>>,
    #[serde(default)]
    cgroups_path: Option<PathBuf>,
    #[serde(default)]
    namespaces: Option<Vec<LinuxNamespace>>,
    #[serde(default)]
    devices: Option<Vec<LinuxDevice>>,
    #[serde(default)]
    masked_paths: Option<Vec<String>>,
    #[serde(default)]
    readonly_paths: Option<Vec<String>>,
    #[serde(default)]
    seccomp: Option<serde::de::IgnoredAny>,
}

impl Linux {
    pub fn uid_mappings(&self) -> &Option<Vec<LinuxIdMapping>> {
        &self.uid_mappings
    }
    pub fn gid_mappings(&self) -> &Option<Vec<LinuxIdMapping>> {
        &self.gid_mappings
    }
    pub fn cgroups_path(&self) -> &Option<PathBuf> {
        &self.cgroups_path
    }
    pub fn namespaces(&self) -> &Option<Vec<LinuxNamespace>> {
        &self.namespaces
    }
    pub fn devices(&self) -> &Option<Vec<LinuxDevice>> {
        &self.devices
    }
    pub fn masked_paths(&self) -> &Option<Vec<String>> {
        &self.masked_paths
    }
    pub fn readonly_paths(&self) -> &Option<Vec<String>> {
        &self.readonly_paths
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct LinuxIdMapping {
    #[serde(default, rename = "hostID")]
    host_id: u32,
    #[serde(default, rename = "containerID")]
    container_id: u32,
    #[serde(default)]
    size: u32,
}

impl LinuxIdMapping {
    pub fn host_id(&self) -> u32 {
        self.host_id
    }
    pub fn container_id(&self) -> u32 {
        self.container_id
    }
    pub fn size(&self) -> u32 {
        self.size
    }
}

/// `linux.namespaces[].type`; the names `oci-spec` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinuxNamespaceType {
    Mount,
    Cgroup,
    Uts,
    Ipc,
    User,
    Pid,
    Network,
    Time,
}

#[derive(Debug, Clone, Deserialize)]
pub struct LinuxNamespace {
    #[serde(rename = "type")]
    typ: LinuxNamespaceType,
    #[serde(default)]
    path: Option<PathBuf>,
}

impl LinuxNamespace {
    pub fn typ(&self) -> LinuxNamespaceType {
        self.typ
    }
    pub fn path(&self) -> &Option<PathBuf> {
        &self.path
    }
}

/// `linux.devices[].type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinuxDeviceType {
    A,
    B,
    C,
    U,
    P,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinuxDevice {
    #[serde(default)]
    path: PathBuf,
    #[serde(rename = "type")]
    typ: LinuxDeviceType,
    #[serde(default)]
    major: i64,
    #[serde(default)]
    minor: i64,
    #[serde(default)]
    file_mode: Option<u32>,
    #[serde(default)]
    uid: Option<u32>,
    #[serde(default)]
    gid: Option<u32>,
}

impl LinuxDevice {
    pub fn path(&self) -> &PathBuf {
        &self.path
    }
    pub fn typ(&self) -> LinuxDeviceType {
        self.typ
    }
    pub fn major(&self) -> i64 {
        self.major
    }
    pub fn minor(&self) -> i64 {
        self.minor
    }
    pub fn file_mode(&self) -> Option<u32> {
        self.file_mode
    }
    pub fn uid(&self) -> Option<u32> {
        self.uid
    }
    pub fn gid(&self) -> Option<u32> {
        self.gid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped base spec with what a create adds that the launcher
    /// reads (user namespace, id maps, cgroup path, a seccomp section,
    /// a hostname, the skeleton annotation, an rlimit and an OOM score).
    fn sample() -> String {
        let mut v: serde_json::Value =
            serde_json::from_str(include_str!("../../../oci/base.json")).unwrap();
        v["hostname"] = "sbx-a".into();
        v["annotations"] = serde_json::json!({"sandboxd.io/root-skeleton": "{}"});
        v["process"]["oomScoreAdj"] = 500.into();
        v["process"]["user"]["additionalGids"] = serde_json::json!([5, 6]);
        v["process"]["rlimits"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"type": "RLIMIT_RTTIME", "hard": 7, "soft": 3}));
        let linux = &mut v["linux"];
        linux["cgroupsPath"] = "/sandboxd/a".into();
        linux["namespaces"]
            .as_array_mut()
            .unwrap()
            .insert(0, serde_json::json!({"type": "user"}));
        linux["uidMappings"] =
            serde_json::json!([{"containerID": 0, "hostID": 100000, "size": 65536}]);
        linux["gidMappings"] =
            serde_json::json!([{"containerID": 0, "hostID": 200000, "size": 65536}]);
        linux["seccomp"] = serde_json::json!({"defaultAction": "SCMP_ACT_ERRNO"});
        v.to_string()
    }

    /// The launcher's own parser reads what `oci-spec` (the daemon's
    /// writer) reads, field for field.
    #[test]
    fn reads_what_oci_spec_reads() {
        let text = sample();
        let ours: Spec = serde_json::from_str(&text).unwrap();
        let theirs: oci_spec::runtime::Spec = serde_json::from_str(&text).unwrap();
        assert!(ours.has_seccomp());
        assert_eq!(ours.hostname(), theirs.hostname());
        assert_eq!(ours.annotations(), theirs.annotations());
        let (r, tr) = (ours.root().clone().unwrap(), theirs.root().clone().unwrap());
        assert_eq!((r.path(), r.readonly()), (tr.path(), tr.readonly()));

        let (p, tp) = (
            ours.process().clone().unwrap(),
            theirs.process().clone().unwrap(),
        );
        assert_eq!(p.args(), tp.args());
        assert_eq!(p.env(), tp.env());
        assert_eq!(p.cwd(), tp.cwd());
        assert_eq!(p.oom_score_adj(), tp.oom_score_adj());
        let (u, tu) = (p.user(), tp.user());
        assert_eq!(
            (u.uid(), u.gid(), u.umask(), u.additional_gids()),
            (tu.uid(), tu.gid(), tu.umask(), tu.additional_gids())
        );
        let caps = tp.capabilities().as_ref().is_some_and(|c| {
            [
                c.bounding(),
                c.effective(),
                c.permitted(),
                c.inheritable(),
                c.ambient(),
            ]
            .iter()
            .any(|s| s.as_ref().is_some_and(|s| !s.is_empty()))
        });
        assert_eq!(p.capabilities().as_ref().is_some_and(|c| c.any()), caps);
        let rl: Vec<_> = p
            .rlimits()
            .clone()
            .unwrap()
            .iter()
            .map(|l| (format!("{:?}", l.typ()), l.soft(), l.hard()))
            .collect();
        let trl: Vec<_> = tp
            .rlimits()
            .clone()
            .unwrap()
            .iter()
            .map(|l| (format!("{:?}", l.typ()), l.soft(), l.hard()))
            .collect();
        assert_eq!(rl, trl);
        assert!(
            rl.iter()
                .any(|(t, s, h)| t == "RlimitRttime" && *s == 3 && *h == 7),
            "{rl:?}"
        );

        let ms = ours.mounts().clone().unwrap();
        let tms = theirs.mounts().clone().unwrap();
        assert_eq!(ms.len(), tms.len());
        for (m, t) in ms.iter().zip(&tms) {
            assert_eq!(
                (m.destination(), m.typ(), m.source(), m.options()),
                (t.destination(), t.typ(), t.source(), t.options())
            );
        }

        let (l, tl) = (
            ours.linux().clone().unwrap(),
            theirs.linux().clone().unwrap(),
        );
        assert_eq!(l.cgroups_path(), tl.cgroups_path());
        assert_eq!(l.masked_paths(), tl.masked_paths());
        assert_eq!(l.readonly_paths(), tl.readonly_paths());
        let ns: Vec<_> = l
            .namespaces()
            .clone()
            .unwrap()
            .iter()
            .map(|n| (format!("{:?}", n.typ()), n.path().clone()))
            .collect();
        let tns: Vec<_> = tl
            .namespaces()
            .clone()
            .unwrap()
            .iter()
            .map(|n| (format!("{:?}", n.typ()), n.path().clone()))
            .collect();
        assert_eq!(ns, tns);
        for (m, t) in [
            (l.uid_mappings(), tl.uid_mappings()),
            (l.gid_mappings(), tl.gid_mappings()),
        ] {
            let m: Vec<_> = m
                .clone()
                .unwrap()
                .iter()
                .map(|x| (x.container_id(), x.host_id(), x.size()))
                .collect();
            let t: Vec<_> = t
                .clone()
                .unwrap()
                .iter()
                .map(|x| (x.container_id(), x.host_id(), x.size()))
                .collect();
            assert_eq!(m, t);
        }
        let ds = l.devices().clone().unwrap();
        let tds = tl.devices().clone().unwrap();
        assert_eq!(ds.len(), tds.len());
        assert!(!ds.is_empty());
        for (d, t) in ds.iter().zip(&tds) {
            assert_eq!(format!("{:?}", d.typ()), format!("{:?}", t.typ()));
            assert_eq!(
                (
                    d.path(),
                    d.major(),
                    d.minor(),
                    d.file_mode(),
                    d.uid(),
                    d.gid()
                ),
                (
                    t.path(),
                    t.major(),
                    t.minor(),
                    t.file_mode(),
                    t.uid(),
                    t.gid()
                )
            );
        }
    }

    /// What `oci-spec` refuses, the launcher refuses too (at its first
    /// step): an unknown namespace, rlimit or device type, a process
    /// without `user` or `cwd`.
    #[test]
    fn refuses_what_oci_spec_refuses() {
        let base: serde_json::Value = serde_json::from_str(&sample()).unwrap();
        let mut cases = Vec::new();
        let mut v = base.clone();
        v["linux"]["namespaces"][0]["type"] = "bogus".into();
        cases.push(v);
        let mut v = base.clone();
        v["process"]["rlimits"][0]["type"] = "RLIMIT_BOGUS".into();
        cases.push(v);
        let mut v = base.clone();
        v["linux"]["devices"][0]["type"] = "x".into();
        cases.push(v);
        let mut v = base.clone();
        v["process"].as_object_mut().unwrap().remove("user");
        cases.push(v);
        let mut v = base.clone();
        v["process"].as_object_mut().unwrap().remove("cwd");
        cases.push(v);
        for v in cases {
            let text = v.to_string();
            assert!(serde_json::from_str::<oci_spec::runtime::Spec>(&text).is_err());
            assert!(serde_json::from_str::<Spec>(&text).is_err(), "{text}");
        }
        let ok: Spec = serde_json::from_str(&base.to_string()).unwrap();
        assert!(ok.process().is_some());
    }
}
