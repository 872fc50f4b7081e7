//! The text log's fields, escaped: one event is one line, whatever it
//! carries.
//!
//! Why: errors name what functions wrote (a failed run's stderr tail, a
//! runtime's message), and tracing's text format writes a `Display` field
//! and the event's message as they are. A function that prints a newline
//! and `... ERROR xfn: ...` to its stderr would otherwise write whole lines
//! of its own choosing into the daemon's log, CR and NUL included. The JSON
//! format escapes by construction.
use std::fmt::{self, Write};

use tracing_subscriber::field::{RecordFields, VisitOutput};
use tracing_subscriber::fmt::format::{DefaultVisitor, Writer};
use tracing_subscriber::fmt::FormatFields;

/// tracing's own field format with every control character (C0, DEL, C1
/// such as NEL) and the Unicode line and paragraph separators written as
/// Rust escapes (`\n`, `\r`, `\u{0}`, `\u{1b}`). Field names lose their
/// italics on a terminal: the escaping cannot tell a style's ESC from one
/// that came with a value.
#[derive(Debug, Default)]
pub(crate) struct EscapedFields;

impl<'writer> FormatFields<'writer> for EscapedFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        let mut escaping = Escaping(&mut writer);
        let mut visitor = DefaultVisitor::new(Writer::new(&mut escaping), true);
        fields.record(&mut visitor);
        visitor.finish()
    }
}

/// Whether `c` could end, rewrite or restyle a log line.
fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')
}

/// Writes through to `W`, escaping what [`needs_escape`].
struct Escaping<'a, W: Write>(&'a mut W);

impl<W: Write> Write for Escaping<'_, W> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        let mut clean = 0;
        for (at, c) in text.char_indices().filter(|&(_, c)| needs_escape(c)) {
            self.0.write_str(&text[clean..at])?;
            write!(self.0, "{}", c.escape_default())?;
            clean = at + c.len_utf8();
        }
        self.0.write_str(&text[clean..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// What a text subscriber with [`EscapedFields`] writes for `log`.
    fn logged(log: impl FnOnce()) -> String {
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .fmt_fields(EscapedFields)
            .with_writer(move || Sink(sink.clone()))
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        let bytes = out.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn what_a_function_wrote_stays_on_its_event_s_line() {
        let stderr = "boom\n2026-01-01T00:00:00Z ERROR xfn: forged\r\0\u{85}x\u{2028}y";
        let text = logged(|| {
            tracing::warn!(error = %stderr, "call failed: {stderr}");
        });
        assert_eq!(text.lines().count(), 1, "{text:?}");
        assert!(text.ends_with('\n'), "{text:?}");
        let escaped = r"boom\n2026-01-01T00:00:00Z ERROR xfn: forged\r\u{0}\u{85}x\u{2028}y";
        assert_eq!(text.matches(escaped).count(), 2, "{text:?}");
        // A terminal escape, in the message (which tracing itself escapes
        // as `\x1b`) and in a field.
        let text = logged(|| tracing::warn!(error = %"a\u{1b}[2Jb", "c\u{1b}[2Jd"));
        assert!(!text.contains('\u{1b}'), "{text:?}");
        assert_eq!(text.lines().count(), 1, "{text:?}");
    }

    #[test]
    fn plain_fields_read_as_before() {
        let text = logged(|| tracing::info!(n = 3, name = "a b", "started, ünïcode kept"));
        assert!(
            text.ends_with("started, ünïcode kept n=3 name=\"a b\"\n"),
            "{text:?}"
        );
    }
}
