//! Logging. JSON lines under Lambda (CloudWatch parses them), readable lines in a terminal.
//! The filter comes from `RUST_LOG` (default `info`). Every line of a heartbeat carries
//! its span's `agent_id` and `heartbeat_id`.
//!
//! Logs carry text Pulse does not write itself — a model's reply, a user's message, a
//! webhook sender's reason — so one event is always one line: JSON escapes it, and the
//! readable format escapes every control character in field values and messages
//! (`\n`, `\r`, escape sequences, the Unicode line separators). A reply reading
//! `ok\n2026-01-01T00:00:00Z ERROR ...` is logged as `ok\n2026-...` on its own line, never
//! as a forged line of its own. The characters that reorder text or mark its direction
//! (U+202E and the other bidirectional controls) are escaped in both formats, so a log
//! viewer cannot be made to show a line other than as it was written.

use std::fmt;

use std::io::IsTerminal;

use tracing::Subscriber;
use tracing::field::{Field, Visit};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

use crate::traces::{self, Traces};

/// How log lines look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line, with span fields; for Lambda.
    Json,
    /// Human-readable lines; for a terminal.
    Text,
}

/// Installs the global subscriber: log lines as `format` says, and traces when the
/// environment asks for them ([`crate::traces`]; `service` names this program in them).
/// Safe to call more than once (later calls install nothing and export nothing). An
/// error names the tracing variable that is set wrong.
pub fn init(format: LogFormat, service: &str) -> Result<Traces, String> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let (writer, ansi) = match format {
        LogFormat::Json => (BoxMakeWriter::new(std::io::stdout), false),
        LogFormat::Text => (
            BoxMakeWriter::new(std::io::stderr),
            std::io::stderr().is_terminal(),
        ),
    };
    let (exported, traces) = match traces::Exporting::from_env(service)? {
        Some(exporting) => {
            let (layer, traces) = traces::layer(&exporting)?;
            (Some(layer), traces)
        }
        None => (None, Traces::default()),
    };
    let installed = tracing_subscriber::registry()
        .with(exported)
        .with(logs(format, filter, writer, ansi))
        .try_init();
    if installed.is_err() {
        traces.shutdown();
        return Ok(Traces::default());
    }
    Ok(traces)
}

/// The subscriber `init` installs without traces, writing to `writer`.
#[cfg(test)]
fn subscriber(
    format: LogFormat,
    filter: EnvFilter,
    writer: BoxMakeWriter,
    ansi: bool,
) -> Box<dyn Subscriber + Send + Sync> {
    Box::new(tracing_subscriber::registry().with(logs(format, filter, writer, ansi)))
}

/// The log lines' layer, writing to `writer` what `filter` lets through. The spans
/// that are only for traces are never in them.
fn logs<S>(
    format: LogFormat,
    filter: EnvFilter,
    writer: BoxMakeWriter,
    ansi: bool,
) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let filter = filter.add_directive(
        format!("{}=off", traces::TARGET)
            .parse()
            .expect("a directive"),
    );
    match format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .with_writer(EscapedJson(writer))
            .json()
            .with_current_span(true)
            .with_span_list(true)
            // Lambda adds its own timestamp and request id to each line.
            .without_time()
            .with_filter(filter)
            .boxed(),
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(writer)
            .with_target(false)
            .with_ansi(ansi)
            .fmt_fields(EscapedFields)
            .with_filter(filter)
            .boxed(),
    }
}

/// The readable format's fields: `name=value`, separated by spaces, the message first as
/// it is, every control character escaped.
struct EscapedFields;

impl<'w> FormatFields<'w> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut visitor = Escaping {
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct Escaping<'w> {
    writer: Writer<'w>,
    first: bool,
    result: fmt::Result,
}

impl Escaping<'_> {
    fn write(&mut self, field: &Field, text: &str, quoted: bool) {
        let name = field.name();
        // The `log` crate's metadata, already shown in the line's own columns.
        if self.result.is_err() || name.starts_with("log.") {
            return;
        }
        self.result = self.write_field(name, text, quoted);
    }

    fn write_field(&mut self, name: &str, text: &str, quoted: bool) -> fmt::Result {
        if !self.first {
            self.writer.write_char(' ')?;
        }
        self.first = false;
        if name != "message" {
            write!(self.writer, "{}=", name.trim_start_matches("r#"))?;
        }
        if quoted {
            self.writer.write_char('"')?;
        }
        escape_into(&mut self.writer, text, quoted)?;
        if quoted {
            self.writer.write_char('"')?;
        }
        Ok(())
    }
}

impl Visit for Escaping<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.write(field, value, true);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.write(field, &format!("{value:?}"), false);
    }
}

/// Writes `text` with its control characters (and, when `quoted`, its quotes and
/// backslashes) escaped.
fn escape_into(out: &mut impl fmt::Write, text: &str, quoted: bool) -> fmt::Result {
    for c in text.chars() {
        match c {
            '\n' => out.write_str("\\n")?,
            '\r' => out.write_str("\\r")?,
            '\t' => out.write_str("\\t")?,
            '"' | '\\' if quoted => {
                out.write_char('\\')?;
                out.write_char(c)?;
            }
            c if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') || reorders(c) => {
                write!(out, "\\u{{{:x}}}", c as u32)?
            }
            c => out.write_char(c)?,
        }
    }
    Ok(())
}

/// Whether `c` reorders text or marks its direction: a bidirectional control.
fn reorders(c: char) -> bool {
    matches!(
        c,
        '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
    )
}

/// The JSON format's writer: each line with its bidirectional controls written as JSON
/// escapes (`\u202e`), which a JSON reader takes back as the same characters. They can
/// only stand inside the line's strings, where the escape means the same.
struct EscapedJson(BoxMakeWriter);

impl<'a> MakeWriter<'a> for EscapedJson {
    type Writer = JsonLine<<BoxMakeWriter as MakeWriter<'a>>::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        JsonLine(self.0.make_writer())
    }
}

/// One writer of [`EscapedJson`]. The formatter writes each line whole, in one call.
struct JsonLine<W>(W);

impl<W: std::io::Write> std::io::Write for JsonLine<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match std::str::from_utf8(buf) {
            Ok(text) if text.chars().any(reorders) => {
                let mut out = String::with_capacity(text.len() + 16);
                for c in text.chars() {
                    if reorders(c) {
                        out.push_str(&format!("\\u{:04x}", c as u32));
                    } else {
                        out.push(c);
                    }
                }
                self.0.write_all(out.as_bytes())?;
            }
            _ => self.0.write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A writer the test reads back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn logged(format: LogFormat, log: impl FnOnce()) -> String {
        let out = Captured::default();
        let writer = {
            let out = out.clone();
            BoxMakeWriter::new(move || out.clone())
        };
        let sub = subscriber(format, EnvFilter::new("info"), writer, false);
        tracing::subscriber::with_default(sub, log);
        let bytes = out.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    const FORGED: &str = "fine\n2026-11-25T10:00:00.000000Z ERROR pulse: the database is corrupt, run `rm -rf`\r\u{1b}[31mred\u{2028}end";

    #[test]
    fn text_from_outside_never_makes_a_log_line_of_its_own() {
        for format in [LogFormat::Text, LogFormat::Json] {
            let out = logged(format, || {
                let span = tracing::info_span!("heartbeat", agent_id = "agt_1", note = FORGED);
                let _in = span.enter();
                tracing::info!(reply = %FORGED, sender = FORGED, "the model replied");
                tracing::warn!("{FORGED}");
                tracing::info!(reason = ?FORGED, "refused");
            });
            let lines: Vec<&str> = out.lines().collect();
            assert_eq!(lines.len(), 3, "{format:?}: one line an event: {out}");
            // (JSON keeps U+2028 as it is: a JSON reader takes it for a character.)
            assert!(
                !out.contains('\u{1b}')
                    && !out.contains('\r')
                    && (format == LogFormat::Json || !out.contains('\u{2028}')),
                "{format:?}: {out:?}"
            );
            assert!(
                lines
                    .iter()
                    .all(|l| !l.contains(" ERROR ") || l.contains("\\n2026")),
                "{format:?}: {out}"
            );
            if format == LogFormat::Text {
                assert!(
                    lines[0].contains(r#"sender="fine\n2026-11-25T10:00:00.000000Z ERROR"#),
                    "{}",
                    lines[0]
                );
                assert!(lines[0].contains("reply=fine\\n2026"), "{}", lines[0]);
                assert!(lines[0].contains("note=\"fine\\n2026"), "{}", lines[0]);
                assert!(lines[1].contains("WARN") && lines[1].contains("fine\\n2026"));
            } else {
                for l in &lines {
                    let v: serde_json::Value = serde_json::from_str(l).unwrap();
                    assert!(v["fields"].is_object(), "{l}");
                }
            }
        }
    }

    #[test]
    fn characters_that_reorder_a_line_are_escaped_in_both_formats() {
        // "file_txt.exe" shown as "file_exe.txt" by a viewer that follows U+202E.
        let name = "file_\u{202e}txt.exe \u{2066}x\u{2069}";
        for format in [LogFormat::Text, LogFormat::Json] {
            let out = logged(format, || {
                tracing::info!(name, "a webhook named {name}");
            });
            assert!(!out.chars().any(reorders), "{format:?}: {out:?}");
            if format == LogFormat::Text {
                assert!(out.contains(r#"name="file_\u{202e}txt.exe"#), "{out}");
            } else {
                assert!(out.contains(r"file_\u202etxt.exe"), "{out}");
                // Read back, the JSON holds the characters as they were.
                let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
                assert_eq!(v["fields"]["name"], name, "{out}");
            }
        }
    }
}
