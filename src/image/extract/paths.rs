//! Lexical normalisation of tar entry paths.
//!
//! Entry names are made relative to the layer root: a leading `/` is dropped
//! (as tar does), empty and `.` components vanish, and `..` pops the previous
//! component. A `..` that would climb above the root is refused. No symlink is
//! ever consulted here: the filesystem side then walks the normalised path
//! refusing symlinks (see `tree.rs`), so the lexical result is what is written.

/// Why a path was refused.
pub(crate) const ESCAPES_ROOT: &str = "its path climbs above the layer root with `..`";

/// Normalises `raw` to `a/b/c` form (no leading or trailing `/`; empty for the
/// root itself), or refuses it.
pub(crate) fn normalize(raw: &[u8]) -> Result<Vec<u8>, &'static str> {
    let mut parts: Vec<&[u8]> = Vec::new();
    for comp in raw.split(|&b| b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => {
                if parts.pop().is_none() {
                    return Err(ESCAPES_ROOT);
                }
            }
            other => parts.push(other),
        }
    }
    Ok(parts.join(&b'/'))
}

/// Splits a normalised path into its parent (possibly empty) and last name.
pub(crate) fn split_last(rel: &[u8]) -> (&[u8], &[u8]) {
    match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => (&[], rel),
    }
}

/// Joins a normalised parent and a name.
pub(crate) fn join(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(parent.len() + 1 + name.len());
    if !parent.is_empty() {
        out.extend_from_slice(parent);
        out.push(b'/');
    }
    out.extend_from_slice(name);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_relative_forms() {
        assert_eq!(normalize(b"./a/b/").unwrap(), b"a/b");
        assert_eq!(normalize(b"/etc//passwd").unwrap(), b"etc/passwd");
        assert_eq!(normalize(b"a/./b/../c").unwrap(), b"a/c");
        assert_eq!(normalize(b"./").unwrap(), b"");
        assert_eq!(normalize(b"a/..").unwrap(), b"");
    }

    #[test]
    fn refuses_climbing_out() {
        assert_eq!(normalize(b"../x"), Err(ESCAPES_ROOT));
        assert_eq!(normalize(b"a/../../x"), Err(ESCAPES_ROOT));
        assert_eq!(normalize(b"/../x"), Err(ESCAPES_ROOT));
        assert_eq!(normalize(b"./.."), Err(ESCAPES_ROOT));
    }

    #[test]
    fn splits_and_joins() {
        assert_eq!(split_last(b"a/b/c"), (&b"a/b"[..], &b"c"[..]));
        assert_eq!(split_last(b"c"), (&b""[..], &b"c"[..]));
        assert_eq!(join(b"", b"c"), b"c");
        assert_eq!(join(b"a/b", b"c"), b"a/b/c");
    }
}
