//! The daemon's JSON log lines: one object per line with `timestamp`,
//! `level`, `target`, `message`, the event's fields and the fields of every
//! enclosing span, all at the top level (a span's `sandbox_id` and
//! `generation` reach every line logged inside a create, delete, proxied
//! request or reap, so a log shipper or `jq 'select(.sandbox_id == "…")'`
//! selects one sandbox). Inner spans and the event win over outer spans on
//! a name clash.
//!
//! Under journald the daemon logs through `tracing-journald` instead (see
//! [`journald_layer`]): the same fields arrive as journal fields
//! (`SANDBOX_ID`, `GENERATION`), so `journalctl SANDBOX_ID=…` selects them.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The JSON event format (span fields formatted with [`JsonFields`]).
pub struct FlatJson;

struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, f: &Field, v: &str) {
        self.0.insert(f.name().to_string(), Value::from(v));
    }
    fn record_bool(&mut self, f: &Field, v: bool) {
        self.0.insert(f.name().to_string(), Value::from(v));
    }
    fn record_u64(&mut self, f: &Field, v: u64) {
        self.0.insert(f.name().to_string(), Value::from(v));
    }
    fn record_i64(&mut self, f: &Field, v: i64) {
        self.0.insert(f.name().to_string(), Value::from(v));
    }
    fn record_f64(&mut self, f: &Field, v: f64) {
        self.0.insert(f.name().to_string(), Value::from(v));
    }
    fn record_debug(&mut self, f: &Field, v: &dyn fmt::Debug) {
        self.0
            .insert(f.name().to_string(), Value::from(format!("{v:?}")));
    }
}

impl<S> FormatEvent<S, JsonFields> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut obj = Map::new();
        let mut ts = String::new();
        SystemTime.format_time(&mut Writer::new(&mut ts))?;
        obj.insert("timestamp".into(), Value::from(ts));
        let meta = event.metadata();
        obj.insert("level".into(), Value::from(meta.level().as_str()));
        obj.insert("target".into(), Value::from(meta.target()));
        if let Some(scope) = ctx.event_scope() {
            let mut spans = Vec::new();
            for span in scope.from_root() {
                spans.push(span.name());
                let ext = span.extensions();
                if let Some(f) = ext.get::<FormattedFields<JsonFields>>() {
                    if let Ok(Value::Object(m)) = serde_json::from_str::<Value>(f.fields.as_str()) {
                        obj.extend(m);
                    }
                }
            }
            obj.insert("spans".into(), Value::from(spans.join(":")));
        }
        event.record(&mut Fields(&mut obj));
        let line = serde_json::to_string(&obj).map_err(|_| fmt::Error)?;
        writeln!(writer, "{line}")
    }
}

/// Where `tracing-journald` sends its datagrams (fixed in the crate).
pub const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

/// Whether a `JOURNAL_STREAM` value (`<device>:<inode>`, both decimal, as
/// systemd sets it for a unit whose stdout/stderr is the journal) names the
/// file with device `dev` and inode `ino`.
pub fn journal_stream_names(value: &str, dev: u64, ino: u64) -> bool {
    let Some((d, i)) = value.trim().split_once(':') else {
        return false;
    };
    d.parse::<u64>().ok() == Some(dev) && i.parse::<u64>().ok() == Some(ino)
}

/// Whether this process's stderr is the journal stream systemd gave it:
/// `JOURNAL_STREAM` is set and names fd 2's device and inode (a daemon
/// started from a shell of a unit inherits the variable but not the
/// stream; see `sd_journal_stream_fd(3)` and `systemd.exec(5)`).
pub fn stderr_is_journal() -> bool {
    use std::os::fd::AsFd;
    is_journal_stream(
        std::env::var_os("JOURNAL_STREAM").as_deref(),
        std::io::stderr().as_fd(),
    )
}

/// Whether `journal_stream` (a `JOURNAL_STREAM` value, if any) names the
/// file open at `fd` (its fstat(2) device and inode).
fn is_journal_stream(
    journal_stream: Option<&std::ffi::OsStr>,
    fd: std::os::fd::BorrowedFd<'_>,
) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(value) = journal_stream.and_then(|v| v.to_str()) else {
        return false;
    };
    // fstat(2) of a duplicate of `fd` (the same open file).
    let meta = fd
        .try_clone_to_owned()
        .map(std::fs::File::from)
        .and_then(|f| f.metadata());
    match meta {
        Ok(m) => journal_stream_names(value, m.dev(), m.ino()),
        Err(_) => false,
    }
}

/// The journald layer: every field of the event and of its spans is a
/// journal field of its own, named by upper-casing (`sandbox_id` →
/// `SANDBOX_ID`, no `F_` prefix), next to `MESSAGE`, `PRIORITY`, `TARGET`,
/// `CODE_FILE`, `CODE_LINE`, `SPAN_NAME` (one per enclosing span) and
/// `SYSLOG_IDENTIFIER=sandboxd`. Levels map to syslog priorities the usual
/// way (error 3, warn 4, info 6, debug and trace 7). Fails when the journal
/// socket cannot be reached.
pub fn journald_layer() -> std::io::Result<tracing_journald::Layer> {
    use tracing_journald::{Priority, PriorityMappings};
    Ok(tracing_journald::layer()?
        .with_field_prefix(None)
        .with_syslog_identifier("sandboxd".into())
        .with_priority_mappings(PriorityMappings {
            error: Priority::Error,
            warn: Priority::Warning,
            info: Priority::Informational,
            debug: Priority::Debug,
            trace: Priority::Debug,
        }))
}

/// Crates whose warnings are noise for an operator, held at `error`:
/// libcgroups warns about every v1 controller a host lacks, on every cgroup
/// it opens.
const QUIET: &[&str] = &["libcgroups"];

/// The `tracing` filter: `RUST_LOG` when set and non-empty (else `info`),
/// with `<crate>=error` appended for each [`QUIET`] crate it does not name,
/// so `RUST_LOG=warn` or `debug` still keeps their noise out while
/// `RUST_LOG=info,libcgroups=debug` shows it.
pub fn filter_directives(rust_log: Option<&str>) -> String {
    let base = rust_log
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .unwrap_or("info");
    let named = |krate: &str| {
        base.split(',').any(|d| {
            let target = d.trim().split(['=', '[']).next().unwrap_or("");
            target == krate || target.starts_with(&format!("{krate}::"))
        })
    };
    let mut spec = base.to_string();
    for krate in QUIET.iter().filter(|k| !named(k)) {
        spec.push_str(&format!(",{krate}=error"));
    }
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_keeps_dependency_noise_out_unless_named() {
        let quiet = ",libcgroups=error";
        assert_eq!(filter_directives(None), format!("info{quiet}"));
        assert_eq!(filter_directives(Some("  ")), format!("info{quiet}"));
        assert_eq!(filter_directives(Some("warn")), format!("warn{quiet}"));
        assert_eq!(
            filter_directives(Some("sandboxd=debug,info")),
            format!("sandboxd=debug,info{quiet}")
        );
        assert_eq!(
            filter_directives(Some("info,libcgroups=debug")),
            "info,libcgroups=debug"
        );
        assert_eq!(
            filter_directives(Some("libcgroups::v1[x]=trace")),
            "libcgroups::v1[x]=trace"
        );
        // A crate whose name only starts with a quiet one is not it.
        assert_eq!(
            filter_directives(Some("libcgroupsx=debug")),
            format!("libcgroupsx=debug{quiet}")
        );
        // Every result is a filter tracing accepts, and it filters.
        use tracing_subscriber::layer::SubscriberExt;
        let f = tracing_subscriber::EnvFilter::try_new(filter_directives(Some("warn"))).unwrap();
        let buf = Buf::default();
        let w = buf.clone();
        let sub = tracing_subscriber::registry().with(f).with(
            tracing_subscriber::fmt::layer()
                .with_writer(move || w.clone())
                .with_ansi(false),
        );
        tracing::subscriber::with_default(sub, || {
            tracing::warn!(target: "libcgroups::v1", "noise");
            tracing::error!(target: "libcgroups::v1", "kept");
            tracing::warn!(target: "sandboxd::api", "ours");
            tracing::info!(target: "sandboxd::api", "below warn");
        });
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert!(
            !out.contains("noise") && !out.contains("below warn"),
            "{out}"
        );
        assert!(out.contains("kept") && out.contains("ours"), "{out}");
    }
    use std::sync::{Arc, Mutex};
    use tracing::Instrument;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn span_fields_are_top_level_and_recorded_late() {
        let buf = Buf::default();
        let w = buf.clone();
        let sub = tracing_subscriber::fmt()
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson)
            .with_writer(move || w.clone())
            .finish();
        tracing::subscriber::with_default(sub, || {
            let span = tracing::info_span!(
                "create",
                sandbox_id = "s1",
                generation = tracing::field::Empty
            );
            span.in_scope(|| tracing::info!(n = 3, "before"));
            span.record("generation", "g1");
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(async { tracing::warn!(ok = true, "inside \"quoted\"") }.instrument(span));
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0]["sandbox_id"], "s1");
        assert_eq!(lines[0]["n"], 3);
        assert_eq!(lines[0]["message"], "before");
        assert!(lines[0].get("generation").is_none());
        assert_eq!(lines[1]["generation"], "g1");
        assert_eq!(lines[1]["sandbox_id"], "s1");
        assert_eq!(lines[1]["level"], "WARN");
        assert_eq!(lines[1]["message"], "inside \"quoted\"");
        assert!(lines[1]["timestamp"].as_str().unwrap().contains('T'));
    }

    #[test]
    fn journal_stream_matches_device_and_inode() {
        assert!(journal_stream_names("8:1234", 8, 1234));
        assert!(journal_stream_names("66311:48120\n", 66311, 48120));
        assert!(journal_stream_names(
            &format!("{}:{}", u64::MAX, 1),
            u64::MAX,
            1
        ));
        for other in [
            "8:1235", "9:1234", "1234:8", "8", "8:", ":1234", "", "8:1234:5", "x:y", "-8:1234",
        ] {
            assert!(!journal_stream_names(other, 8, 1234), "{other:?}");
        }
    }

    #[test]
    fn the_journal_stream_is_the_file_at_the_fd() {
        use std::ffi::OsStr;
        use std::os::fd::AsFd;
        use std::os::unix::fs::MetadataExt;
        let f = tempfile::tempfile().unwrap();
        let other = tempfile::tempfile().unwrap();
        let m = f.metadata().unwrap();
        let value = format!("{}:{}", m.dev(), m.ino());
        let value = Some(OsStr::new(&value));
        assert!(is_journal_stream(value, f.as_fd()));
        assert!(!is_journal_stream(value, other.as_fd()));
        assert!(!is_journal_stream(None, f.as_fd()));
        assert!(!is_journal_stream(Some(OsStr::new("")), f.as_fd()));
        // The process's own stderr is not a file of this test's.
        assert!(!is_journal_stream(value, std::io::stderr().as_fd()));
    }
}
