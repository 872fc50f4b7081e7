//! An error and its causes as one message: the one place a chain of
//! `source()`s becomes text, for the CLI's last line, the daemon's logs and
//! a gRPC status's message (`grpc::status`).
//!
//! Why a chain: xfn's errors say their own step only ("cannot prepare the
//! run bundle /x") and hold what went wrong beneath as a typed `#[source]`
//! (an `io::Error`, the lower module's enum), so a caller can still match
//! on the cause and no message repeats another. Their `Display` alone is
//! therefore only the top step: anything shown to a person goes through
//! [`Chain`] or [`one_line`], never a bare `to_string()` of an error.
use std::error::Error;
use std::fmt;

/// Displays an error and its causes joined by ": ", each step once:
/// `tracing::warn!(error = %Chain(&err), …)`, `format!("{}", Chain(&err))`.
///
/// A cause whose text its parent's message already ends with is left out:
/// some errors of other crates inline their source as `"…: {source}"`.
/// Messages keep their own line breaks (a function's stderr tail spans
/// lines, and a gRPC status carries it as it was); [`one_line`] folds them.
#[derive(Clone, Copy)]
pub struct Chain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parent = String::new();
        let mut first = true;
        let mut next: Option<&(dyn Error + 'static)> = Some(self.0);
        while let Some(err) = next {
            let text = err.to_string();
            let text = text.trim();
            if !text.is_empty() && !parent.trim_end().ends_with(text) {
                if !first {
                    f.write_str(": ")?;
                }
                f.write_str(text)?;
                first = false;
            }
            parent = text.to_string();
            next = err.source();
        }
        Ok(())
    }
}

impl fmt::Debug for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// One line a person can act on (the CLI's last words, a log field): the
/// [`Chain`], with line breaks inside a message (a stderr tail) shown as
/// " | ".
pub fn one_line(err: &(dyn Error + 'static)) -> String {
    Chain(err)
        .to_string()
        .lines()
        .map(str::trim_end)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("pulling fn:v1")]
    struct Pull {
        source: Layer,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("extracting layer sha256:1")]
    struct Layer {
        source: std::io::Error,
    }

    fn three_levels() -> Pull {
        Pull {
            source: Layer {
                source: std::io::Error::other("the image unpacks to more than 8 bytes"),
            },
        }
    }

    #[test]
    fn a_three_level_chain_prints_each_step_once_in_order() {
        assert_eq!(
            one_line(&three_levels()),
            "pulling fn:v1: extracting layer sha256:1: the image unpacks to more than 8 bytes"
        );
    }

    #[test]
    fn an_anyhow_context_chain_reads_the_same() {
        let err = anyhow::Error::new(three_levels()).context("xfn run");
        assert_eq!(
            one_line(err.as_ref()),
            "xfn run: pulling fn:v1: extracting layer sha256:1: the image unpacks to more than 8 bytes"
        );
        let plain = anyhow::anyhow!("root").context("middle").context("top");
        assert_eq!(one_line(plain.as_ref()), "top: middle: root");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("connecting: {source}")]
    struct Inlines {
        source: std::io::Error,
    }

    #[test]
    fn a_cause_its_parent_already_ends_with_is_printed_once() {
        let err = Inlines {
            source: std::io::Error::other("connection refused"),
        };
        assert_eq!(one_line(&err), "connecting: connection refused");
    }

    #[test]
    fn a_cause_named_earlier_but_not_by_its_parent_is_still_printed() {
        // "timed out" appears in the top step's text, yet is the leaf's own
        // step: only a parent's inlined tail is a repeat.
        #[derive(Debug, thiserror::Error)]
        #[error("the call timed out once, then")]
        struct Top {
            source: Layer,
        }
        let err = Top {
            source: Layer {
                source: std::io::Error::other("timed out"),
            },
        };
        assert_eq!(
            one_line(&err),
            "the call timed out once, then: extracting layer sha256:1: timed out"
        );
    }

    /// The crate's own errors hold their cause as a source and never also
    /// print it: a `#[error]` message naming `{source}`, or `{0}` of a
    /// `#[from]`/`#[source]` field, would repeat it in every chain.
    #[test]
    fn no_error_of_the_crate_repeats_its_source_in_its_own_message() {
        let mut found = Vec::new();
        visit(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut found,
        );
        assert!(
            found.is_empty(),
            "messages that repeat their source: {found:#?}"
        );
    }

    fn visit(dir: &std::path::Path, found: &mut Vec<String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                visit(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("chain.rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for item in text.split("#[error(").skip(1) {
                    // The attribute, then the lines of its item up to the
                    // variant (or struct) that carries it.
                    let (attr, rest) = item.split_once(")]").unwrap_or((item, ""));
                    let holder = rest
                        .lines()
                        .map(str::trim)
                        .find(|l| !l.is_empty() && !l.starts_with("///") && !l.starts_with("#["))
                        .unwrap_or_default();
                    let names_source = attr.contains("{source}") || attr.contains("{source:");
                    let names_0 = attr.contains("{0}") || attr.contains("{0:");
                    let zero_is_source =
                        holder.contains("(#[from]") || holder.contains("(#[source]");
                    if names_source || (names_0 && zero_is_source) {
                        found.push(format!("{}: {holder}", path.display()));
                    }
                }
            }
        }
    }

    #[test]
    fn line_breaks_inside_a_step_become_bars_on_one_line_and_stay_in_the_chain() {
        let err = Layer {
            source: std::io::Error::other("boom\nat line 2\n"),
        };
        assert_eq!(
            one_line(&err),
            "extracting layer sha256:1: boom | at line 2"
        );
        assert_eq!(
            Chain(&err).to_string(),
            "extracting layer sha256:1: boom\nat line 2"
        );
    }
}
