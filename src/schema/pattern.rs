//! Regular expressions as the API server runs them: a schema's `pattern` and
//! CEL's `matches()` are Go's RE2, whose `\w`, `\d`, `\s` and `\b` are ASCII
//! (Rust's `regex` makes them Unicode: `café` would match `^\w+$` here
//! only, and `\w{1,30}` would compile a hundred times larger). [`go`]
//! rewrites them to their ASCII forms before `regex` compiles them.
//!
//! Why bounded: patterns come from CRDs. Each is compiled at most once per
//! process ([`compiled`]; a pattern inside `allOf`/`anyOf`/`oneOf` or a
//! constant `matches()` argument on every item of a list is not compiled
//! again), its compiled program is capped at [`PATTERN_SIZE_LIMIT`], and at
//! most [`MAX_PATTERNS`] are kept (past that a pattern is compiled each time
//! it is used, still within the size cap).
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use regex::Regex;

/// The compiled size a pattern may take. RE2's default program budget is
/// 8 MiB of memory; Go's regexp has none but refuses a repetition over
/// 1,000. 1 MiB holds what CRDs use (`^(\w{1,30}\.){0,8}\w{1,30}$` with
/// ASCII classes takes a few KiB) and keeps matching linear and small.
pub(super) const PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// The most compiled patterns kept.
pub(super) const MAX_PATTERNS: usize = 512;

/// A pattern, or why it cannot be used.
type Compiled = Result<Arc<Regex>, String>;

static PATTERNS: LazyLock<Mutex<HashMap<String, Compiled>>> = LazyLock::new(Default::default);

/// How many times each pattern was compiled (tests count them).
#[cfg(test)]
static COMPILATIONS: LazyLock<Mutex<HashMap<String, usize>>> = LazyLock::new(Default::default);

/// How many times `pattern` was compiled in this process.
#[cfg(test)]
pub(super) fn compilations(pattern: &str) -> usize {
    let counts = COMPILATIONS.lock().unwrap_or_else(|e| e.into_inner());
    counts.get(pattern).copied().unwrap_or(0)
}

/// `pattern` compiled with Go's semantics, once per process.
pub(super) fn compiled(pattern: &str) -> Compiled {
    let patterns = || PATTERNS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(found) = patterns().get(pattern) {
        return found.clone();
    }
    #[cfg(test)]
    {
        let mut counts = COMPILATIONS.lock().unwrap_or_else(|e| e.into_inner());
        *counts.entry(pattern.to_string()).or_default() += 1;
    }
    let result = regex::RegexBuilder::new(&go(pattern))
        .size_limit(PATTERN_SIZE_LIMIT)
        .build()
        .map(Arc::new)
        .map_err(|e| e.to_string());
    let mut cache = patterns();
    if cache.len() < MAX_PATTERNS {
        cache.insert(pattern.to_string(), result.clone());
    }
    result
}

/// `pattern` with Go's ASCII Perl classes: `\d` `[0-9]`, `\w`
/// `[0-9A-Za-z_]`, `\s` `[\t\n\f\r ]` (and their negations, as nested
/// classes, which `regex` takes inside a class too), `\b` `\B` ASCII word
/// boundaries outside a class.
fn go(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len());
    let mut chars = pattern.chars().peekable();
    let mut in_class = false;
    let mut class_start = false;
    while let Some(c) = chars.next() {
        let first_in_class = std::mem::take(&mut class_start);
        match c {
            '\\' => {
                let Some(next) = chars.next() else {
                    out.push(c);
                    break;
                };
                match (next, in_class) {
                    ('d', _) => out.push_str("[0-9]"),
                    ('D', _) => out.push_str("[^0-9]"),
                    ('w', _) => out.push_str("[0-9A-Za-z_]"),
                    ('W', _) => out.push_str("[^0-9A-Za-z_]"),
                    ('s', _) => out.push_str(r"[\t\n\f\r ]"),
                    ('S', _) => out.push_str(r"[^\t\n\f\r ]"),
                    ('b', false) => out.push_str(r"(?-u:\b)"),
                    ('B', false) => out.push_str(r"(?-u:\B)"),
                    _ => {
                        out.push(c);
                        out.push(next);
                    }
                }
            }
            '[' if !in_class => {
                in_class = true;
                class_start = true;
                out.push(c);
                if chars.peek() == Some(&'^') {
                    out.push('^');
                    chars.next();
                }
            }
            '[' if chars.peek() == Some(&':') => {
                // A POSIX class, `[:alpha:]`: copied to its `:]`.
                out.push(c);
                while let Some(p) = chars.next() {
                    out.push(p);
                    if p == ':' && chars.peek() == Some(&']') {
                        out.push(']');
                        chars.next();
                        break;
                    }
                }
            }
            '[' => out.push_str(r"\["), // literal in Go, a nested class in Rust
            ']' if in_class && !first_in_class => {
                in_class = false;
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perl_classes_are_ascii_as_in_go() {
        let matches = |p: &str, t: &str| compiled(p).unwrap().is_match(t);
        assert!(matches(r"^\w+$", "cafe_9"));
        assert!(!matches(r"^\w+$", "café"));
        assert!(!matches(r"^\d$", "٣")); // an Arabic-Indic digit
        assert!(matches(r"^\s$", "\t"));
        assert!(!matches(r"^\s$", "\u{a0}"));
        assert!(!matches(r"^\s$", "\u{b}")); // Go's \s has no \v
        assert!(matches(r"^[\w-]+$", "a-b_c"));
        assert!(!matches(r"^[\w-]+$", "é"));
        assert!(matches(r"^[^\W]+$", "ab"));
        assert!(!matches(r"\bé", "é")); // é is no ASCII word character
        assert!(matches(r"\bab\b", "ab"));
        assert!(matches(r"a\Bb", "ab"));
        assert!(matches(r"^[]a]+$", "]a"));
        assert!(matches(r"^[a[]+$", "[a"));
        assert!(matches(r"^[[:alpha:]]+$", "ab"));
        assert!(matches(r"^\\w$", r"\w"));
        assert!(matches(r"^\p{L}+$", "café"));
    }

    #[test]
    fn a_pattern_go_compiles_small_is_not_refused_for_its_unicode_size() {
        let pattern = r"^(\w{1,30}\.){0,8}\w{1,30}$";
        let re = compiled(pattern).unwrap();
        assert!(re.is_match("a.b.c"));
        assert!(!re.is_match("é.b"));
        // The same with Unicode classes is over the limit.
        assert!(regex::RegexBuilder::new(pattern)
            .size_limit(PATTERN_SIZE_LIMIT)
            .build()
            .is_err());
    }
}
