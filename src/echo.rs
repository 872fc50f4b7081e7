//! Echoing what a caller sent (an image reference, an apiVersion, a
//! quantity) in an error or a log line: whole when it is short, else its
//! first [`ECHO_BYTES`] bytes and how many were cut.
//!
//! Why: an error message becomes a gRPC status, sent in the `grpc-message`
//! header (C-core clients refuse metadata past 8-16 KiB and report
//! RESOURCE_EXHAUSTED instead of the real code) and a log line; a caller
//! may send megabytes. A few hundred bytes still show the caller what was
//! refused; the rest is theirs to see.
use std::fmt;

/// The most bytes of one input an error or log line echoes.
pub(crate) const ECHO_BYTES: usize = 256;

/// `text` as an error or log line echoes it: `Display` as is, `Debug`
/// quoted, both cut past [`ECHO_BYTES`] (at a character boundary) with
/// `…[N more bytes]` after.
#[derive(Clone, Copy)]
pub(crate) struct Echo<'a>(pub(crate) &'a str);

impl Echo<'_> {
    /// The part echoed and how many bytes were cut.
    fn split(&self) -> (&str, usize) {
        if self.0.len() <= ECHO_BYTES {
            return (self.0, 0);
        }
        let mut end = ECHO_BYTES;
        while !self.0.is_char_boundary(end) {
            end -= 1;
        }
        (&self.0[..end], self.0.len() - end)
    }

    fn marker(f: &mut fmt::Formatter<'_>, cut: usize) -> fmt::Result {
        if cut > 0 {
            write!(f, "…[{cut} more bytes]")?;
        }
        Ok(())
    }
}

impl fmt::Display for Echo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (shown, cut) = self.split();
        f.write_str(shown)?;
        Self::marker(f, cut)
    }
}

impl fmt::Debug for Echo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (shown, cut) = self.split();
        fmt::Debug::fmt(shown, f)?;
        Self::marker(f, cut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_input_is_echoed_whole() {
        assert_eq!(Echo("fn:v1").to_string(), "fn:v1");
        assert_eq!(format!("{:?}", Echo("a\"b")), r#""a\"b""#);
        let exact = "x".repeat(ECHO_BYTES);
        assert_eq!(Echo(&exact).to_string(), exact);
    }

    #[test]
    fn long_input_is_cut_at_a_character_boundary_with_what_was_cut() {
        let long = format!("{}é{}", "x".repeat(ECHO_BYTES - 1), "y".repeat(1 << 20));
        let shown = Echo(&long).to_string();
        let cut = long.len() - (ECHO_BYTES - 1);
        assert_eq!(
            shown,
            format!("{}…[{cut} more bytes]", "x".repeat(ECHO_BYTES - 1))
        );
        let quoted = format!("{:?}", Echo(&long));
        assert!(quoted.starts_with("\"xxx") && quoted.ends_with(&format!("\"…[{cut} more bytes]")));
        assert!(quoted.len() < ECHO_BYTES + 40, "{}", quoted.len());
    }
}
