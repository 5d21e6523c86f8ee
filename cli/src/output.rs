//! Printing: aligned tables for people, JSON for programs (`--json`). Records go to
//! stdout; messages meant for the person at the terminal go to stderr, so
//! `ID=$(pulse agents create --name x)` captures just the id.

use serde::Serialize;

/// `println!` for records: writes a line to stdout, and when the reader has gone away
/// (`pulse ... | head`) ends the program quietly, as Unix tools do, instead of panicking
/// with "failed printing to stdout: Broken pipe".
macro_rules! outln {
    () => {
        $crate::output::write_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::output::write_line(format_args!($($arg)*))
    };
}
pub(crate) use outln;

/// A line of a report through [`Out::figure`]: `figure!(out, "{n} per second")`.
macro_rules! figure {
    ($out:expr, $($arg:tt)*) => {
        $out.figure(format_args!($($arg)*))
    };
}
pub(crate) use figure;

/// Writes `args` and a newline to stdout, with what could hide or disguise text on a
/// terminal escaped ([`shown`]); see [`outln!`].
pub(crate) fn write_line(args: std::fmt::Arguments<'_>) {
    write_raw(&shown(&args.to_string()));
}

/// Writes `text` and a newline to stdout as it is.
fn write_raw(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out
        .write_all(text.as_bytes())
        .and_then(|()| out.write_all(b"\n"))
    {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}

/// Where a command's results go.
pub(crate) struct Out {
    pub(crate) json: bool,
}

impl Out {
    pub(crate) fn new(json: bool) -> Self {
        Self { json }
    }

    /// A line of a report (a bench's figures): stdout, unless `--json` puts the document
    /// there, when it goes to stderr for the person watching.
    pub(crate) fn figure(&self, args: std::fmt::Arguments<'_>) {
        if self.json {
            eprintln!("{args}");
        } else {
            write_line(args);
        }
    }

    /// A listing: a table, or a JSON array.
    pub(crate) fn table<T: Serialize>(
        &self,
        rows: &[T],
        headers: &[&str],
        cells: impl Fn(&T) -> Vec<String>,
    ) {
        if self.json {
            self.json_value(&rows);
            return;
        }
        if rows.is_empty() {
            eprintln!("(none)");
            return;
        }
        let cells: Vec<Vec<String>> = rows.iter().map(cells).collect();
        let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
        for row in &cells {
            for (w, c) in widths.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |cols: Vec<&str>| {
            let mut s = String::new();
            for (i, (c, w)) in cols.iter().zip(&widths).enumerate() {
                if i + 1 == cols.len() {
                    s.push_str(c);
                } else {
                    s.push_str(&format!("{c:<w$}  "));
                }
            }
            outln!("{}", s.trim_end());
        };
        line(headers.to_vec());
        for row in &cells {
            line(row.iter().map(String::as_str).collect());
        }
    }

    /// A created record: its id on stdout (or the record as JSON), a note on stderr.
    pub(crate) fn created<T: Serialize>(&self, record: &T, id: &str, note: &str) {
        if self.json {
            self.json_value(record);
        } else {
            outln!("{id}");
            eprintln!("{note}");
        }
    }

    /// A change with nothing to return.
    pub(crate) fn done(&self, note: &str) {
        if self.json {
            self.json_value(&serde_json::json!({ "ok": true, "message": note }));
        } else {
            eprintln!("{note}");
        }
    }

    /// `v` as JSON: what could reorder or hide text is written as JSON's own `\uXXXX`
    /// escapes (the JSON reads back the same; a terminal shows the escape).
    pub(crate) fn json_value<T: Serialize + ?Sized>(&self, v: &T) {
        match serde_json::to_string_pretty(v) {
            Ok(s) => write_raw(&escaped_as(&s, |c| format!("\\u{:04x}", u32::from(c)))),
            Err(e) => eprintln!("error: cannot print JSON: {e}"),
        }
    }
}

/// A time to the second, in UTC; `-` when absent.
pub(crate) fn when(t: Option<jiff::Timestamp>) -> String {
    t.map_or("-".into(), |t| t.strftime("%Y-%m-%d %H:%M:%SZ").to_string())
}

/// `text` as a terminal may show it: control characters (but line breaks and tabs),
/// and the characters that reorder or hide text (bidirectional overrides and isolates,
/// direction marks), written as `\u{…}` escapes. A memory or a message that reads
/// `invoice\u{202e}fdp.exe` is shown so, not as `invoiceexe.pdf`.
pub(crate) fn shown(text: &str) -> String {
    escaped_as(text, |c| format!("\\u{{{:04x}}}", u32::from(c)))
}

/// Whether `c` could hide or disguise text on a terminal: a control character (but a
/// line break or a tab), or one that reorders text or marks its direction.
fn hidden(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// `text` with each [`hidden`] character written as `escape` says.
fn escaped_as(text: &str, escape: impl Fn(char) -> String) -> String {
    if !text.chars().any(hidden) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| if hidden(c) { escape(c) } else { c.to_string() })
        .collect()
}

/// At most `n` characters, with an ellipsis when cut.
pub(crate) fn short(s: &str, n: usize) -> String {
    let one_line = s.replace('\n', " ");
    if one_line.chars().count() <= n {
        one_line
    } else {
        one_line
            .chars()
            .take(n.saturating_sub(1))
            .collect::<String>()
            + "…"
    }
}

/// A duration as it is typed on the command line: `5s`, `1m 30s`, `250ms`.
pub(crate) fn duration_ms(ms: u64) -> String {
    let d = jiff::SignedDuration::from_millis(i64::try_from(ms).unwrap_or(i64::MAX));
    format!("{d:#}")
}

/// `1 job`, `2 jobs`, `0 deliveries`.
pub(crate) fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else if let Some(stem) = noun.strip_suffix('y') {
        format!("{n} {stem}ies")
    } else {
        format!("{n} {noun}s")
    }
}

#[cfg(test)]
mod tests {
    use super::{count, duration_ms, shown};

    #[test]
    fn what_reorders_or_hides_text_is_shown_escaped() {
        assert_eq!(
            shown("plain, with\ttabs\nand lines"),
            "plain, with\ttabs\nand lines"
        );
        assert_eq!(shown("invoice\u{202e}fdp.exe"), "invoice\\u{202e}fdp.exe");
        assert_eq!(
            shown("a\u{1b}[2Jb\u{2067}c\u{200f}"),
            "a\\u{001b}[2Jb\\u{2067}c\\u{200f}"
        );
        assert_eq!(shown("café ✓ 日本"), "café ✓ 日本");
        // In JSON, as JSON's own escape: it reads back the same.
        let json = serde_json::to_string(&serde_json::json!({"t": "a\u{202e}b"})).unwrap();
        let escaped = super::escaped_as(&json, |c| format!("\\u{:04x}", u32::from(c)));
        assert_eq!(escaped, r#"{"t":"a\u202eb"}"#);
        let back: serde_json::Value = serde_json::from_str(&escaped).unwrap();
        assert_eq!(back["t"], "a\u{202e}b");
    }

    #[test]
    fn counts_agree_with_their_nouns() {
        assert_eq!(count(1, "job"), "1 job");
        assert_eq!(count(0, "job"), "0 jobs");
        assert_eq!(count(2, "hook attempt"), "2 hook attempts");
        assert_eq!(count(0, "delivery"), "0 deliveries");
    }

    #[test]
    fn durations_print_as_they_are_typed() {
        assert_eq!(duration_ms(5_000), "5s");
        assert_eq!(duration_ms(90_000), "1m 30s");
        assert_eq!(duration_ms(250), "250ms");
    }
}
