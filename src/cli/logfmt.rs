//! The daemon's JSON log lines: one object per line with `timestamp`,
//! `level`, `target`, `message`, the event's fields and the fields of every
//! enclosing span, all at the top level (a span's `sandbox_id` and
//! `generation` reach every line logged inside a create, delete, proxied
//! request or reap, so a log shipper or `jq 'select(.sandbox_id == "…")'`
//! selects one sandbox). Inner spans and the event win over outer spans on
//! a name clash.

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

#[cfg(test)]
mod tests {
    use super::*;
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
}
