//! The syntax of `xfn render`'s `key=value` flags, parsed where the flags
//! are: `--context-files`/`--context-values` are kong map flags as
//! upstream's (repeatable, each value `key=value` entries separated by `;`,
//! `\;` a literal `;`), `-a/--function-annotations` one `KEY=VALUE` each.
//! The composition core gets the entries, never the flag text; a malformed
//! entry is refused naming its flag, as a file of the render names its path.
use std::path::PathBuf;

use crate::compose::ComposeError;

/// The `key=value` entries of a kong map flag's values: each value split
/// at every `;` not escaped by a backslash, each entry at its first `=`.
pub(crate) fn map_entries(
    flag: &str,
    values: &[String],
) -> Result<Vec<(String, String)>, ComposeError> {
    let mut entries = Vec::new();
    for value in values {
        let mut entry = String::new();
        let mut chars = value.chars().peekable();
        let mut tokens = Vec::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&';') => entry.push(chars.next().unwrap_or(';')),
                ';' => tokens.push(std::mem::take(&mut entry)),
                c => entry.push(c),
            }
        }
        tokens.push(entry);
        for token in tokens.into_iter().filter(|t| !t.is_empty()) {
            let (key, value) = token.split_once('=').ok_or_else(|| ComposeError::Invalid {
                path: PathBuf::from(flag),
                message: format!("expected \"<key>=<value>\" but got {token:?}"),
            })?;
            entries.push((key.to_string(), value.to_string()));
        }
    }
    Ok(entries)
}

/// `-a/--function-annotations KEY=VALUE`: parsed, in order (a later one
/// for the same key wins, and all win over the Functions' own).
pub(crate) fn annotation_overrides(
    entries: &[String],
) -> Result<Vec<(String, String)>, ComposeError> {
    entries
        .iter()
        .map(|entry| {
            entry
                .split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| ComposeError::Invalid {
                    path: PathBuf::from("--function-annotations"),
                    message: format!("invalid function annotation {entry:?}, expected KEY=VALUE"),
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn context_flags_split_as_kong_maps() {
        let entries = map_entries(
            "--context-values",
            &values(&["a=1;b=x=y", r"c=p\;q;", "d="]),
        )
        .unwrap();
        let expected = [("a", "1"), ("b", "x=y"), ("c", "p;q"), ("d", "")];
        assert_eq!(
            entries,
            expected.map(|(k, v)| (k.to_string(), v.to_string()))
        );
        let err = map_entries("--context-files", &values(&["a=f;b"]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "--context-files: expected \"<key>=<value>\" but got \"b\""
        );
    }

    #[test]
    fn function_annotations_split_at_the_first_equals_and_name_the_flag() {
        let entries = annotation_overrides(&values(&["a=b=c", "d="])).unwrap();
        assert_eq!(
            entries,
            [
                ("a".to_string(), "b=c".to_string()),
                ("d".into(), "".into())
            ]
        );
        let err = annotation_overrides(&values(&["nokey"]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "--function-annotations: invalid function annotation \"nokey\", expected KEY=VALUE"
        );
    }
}
