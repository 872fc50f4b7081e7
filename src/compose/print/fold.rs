//! Long scalars folded as `crossplane render` folds them: sigs.k8s.io/yaml
//! prints through go-yaml v2 (go.yaml.in/yaml/v2 v2.4.4), whose emitter
//! has a line width of 80 (`emitterc.go:286`, `best_width = 80`) and breaks
//! a plain, single- or double-quoted scalar at a space once the line has
//! passed it (`yaml_emitter_write_plain_scalar`, `…single_quoted_scalar`,
//! `…double_quoted_scalar`, lines 1324, 1380, 1521); yaml_serde's emitter
//! has no width (`yaml_emitter_set_width(-1)`), so every scalar is one line.
//!
//! Invariant: the text reads back as the same value. A break replaces one
//! space, which a reader folds back into one space; it is never at the
//! scalar's first or last character nor next to another space (plain,
//! single-quoted), and a double-quoted break before a second space escapes
//! that space (`\ `), as go-yaml's do. Keys are never broken: go-yaml
//! writes a simple key with no breaks (`allow_breaks` is `!simple_key_context`).
//!
//! How: yaml_serde's output is block style, a scalar last on its line, so
//! each line is read for where its value scalar starts and which node owns
//! it: the continuation indentation is the owner's column plus 2 (go-yaml's
//! `increase_indent` for a scalar); the owner is the key of `key: value`,
//! else the last `- `, `? ` or `: ` indicator. Literal blocks (`|`) are
//! left as they are, as go-yaml never folds them; so is a document with a
//! string holding a `\r`, NEL, LS or PS break (see `fold`).

/// go-yaml v2's line width.
const WIDTH: usize = 80;

/// `text` (one YAML document as yaml_serde writes it) with each line's
/// value scalar folded at go-yaml v2's width.
pub(crate) fn fold(text: &str) -> String {
    // A line break other than `\n` in a string is written raw inside its
    // quotes and the scalar goes on on a new line, which this line-wise
    // reading cannot follow: such a document is left unfolded (the same
    // value, wider lines than the CLI's).
    if text.contains(['\r', '\u{85}', '\u{2028}', '\u{2029}']) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    // The indentation of the literal block the lines are in.
    let mut literal: Option<usize> = None;
    for line in text.split_inclusive('\n') {
        let body = line.strip_suffix('\n').unwrap_or(line);
        let chars: Vec<char> = body.chars().collect();
        let indentation = chars.iter().take_while(|c| **c == ' ').count();
        if let Some(indent) = literal {
            if chars.is_empty() || indentation >= indent {
                out.push_str(line);
                continue;
            }
            literal = None;
        }
        match node(&chars, indentation) {
            Node::Literal { indent } => {
                literal = Some(indent);
                out.push_str(line);
            }
            Node::Scalar { start, indent } if chars.len() > WIDTH => {
                out.extend(&chars[..start]);
                write_scalar(&mut out, &chars[start..], start, indent);
                out.push_str(&line[body.len()..]);
            }
            _ => out.push_str(line),
        }
    }
    out
}

/// What a line's value is.
enum Node {
    /// A plain or quoted scalar from column `start` to the end of the line,
    /// its continuation lines indented by `indent`.
    Scalar { start: usize, indent: usize },
    /// A literal block's header; its lines are indented by `indent`.
    Literal { indent: usize },
    /// A key of a nested collection, an empty `{}` or `[]`, nothing.
    Other,
}

fn node(line: &[char], indentation: usize) -> Node {
    let mut pos = indentation;
    let mut owner = indentation;
    while pos + 1 < line.len() && matches!(line[pos], '-' | '?' | ':') && line[pos + 1] == ' ' {
        owner = pos;
        pos += 2;
    }
    match key_end(line, pos) {
        // `key: value`: the key is owned by the mapping at its column.
        Some(end) if end + 2 < line.len() => value(line, end + 2, pos + 2),
        Some(_) => Node::Other,
        None => value(line, pos, owner + 2),
    }
}

/// The column of the `:` ending the key that starts at `pos`, if one does.
fn key_end(line: &[char], pos: usize) -> Option<usize> {
    let end = match line.get(pos)? {
        '\'' | '"' => quoted_end(line, pos)? + 1,
        '|' | '>' | '{' | '[' => return None,
        // A plain scalar holds no `: ` and does not end with `:`.
        _ => (pos..line.len())
            .find(|&i| line[i] == ':' && line.get(i + 1).is_none_or(|c| *c == ' '))?,
    };
    (line.get(end) == Some(&':') && line.get(end + 1).is_none_or(|c| *c == ' ')).then_some(end)
}

/// The column of the quote closing the quoted scalar opened at `pos`.
fn quoted_end(line: &[char], pos: usize) -> Option<usize> {
    let quote = line[pos];
    let mut i = pos + 1;
    while i < line.len() {
        match line[i] {
            '\\' if quote == '"' => i += 2,
            '\'' if quote == '\'' && line.get(i + 1) == Some(&'\'') => i += 2,
            c if c == quote => return Some(i),
            _ => i += 1,
        }
    }
    None
}

fn value(line: &[char], pos: usize, indent: usize) -> Node {
    match line.get(pos) {
        Some('|') => Node::Literal { indent },
        Some('{' | '[') | None => Node::Other,
        Some(_) => Node::Scalar { start: pos, indent },
    }
}

/// The scalar `text` (to the end of its line, from column `column`) as
/// go-yaml v2 writes it, broken at `WIDTH`.
fn write_scalar(out: &mut String, text: &[char], column: usize, indent: usize) {
    // (the character of the value, its text in the output)
    let (quote, tokens) = match text[0] {
        q @ ('\'' | '"') => (Some(q), quoted_tokens(&text[1..text.len() - 1], q)),
        _ => (None, text.iter().map(|c| (*c, &text[0..0])).collect()),
    };
    let mut column = column;
    if let Some(q) = quote {
        out.push(q);
        column += 1;
    }
    let n = tokens.len();
    let mut spaces = false;
    for (i, (c, escaped)) in tokens.iter().enumerate() {
        let next_is_space = tokens
            .get(i + 1)
            .is_some_and(|(c, e)| *c == ' ' && e.is_empty());
        if *c == ' ' && escaped.is_empty() {
            let breaks = !spaces
                && column > WIDTH
                && match quote {
                    None => !next_is_space,
                    Some('\'') => i > 0 && i < n - 1 && !next_is_space,
                    Some(_) => i > 0 && i < n - 1,
                };
            if breaks {
                out.push('\n');
                out.extend(std::iter::repeat_n(' ', indent));
                column = indent;
                if quote == Some('"') && next_is_space {
                    out.push('\\');
                    column += 1;
                }
            } else {
                out.push(' ');
                column += 1;
            }
            spaces = true;
        } else {
            if escaped.is_empty() {
                out.push(*c);
                column += 1;
            } else {
                out.extend(escaped.iter());
                column += escaped.len();
            }
            spaces = false;
        }
    }
    if let Some(q) = quote {
        out.push(q);
    }
}

/// The body of a quoted scalar as (character, its escape or `''` when it
/// is written as more than itself, else empty).
fn quoted_tokens(body: &[char], quote: char) -> Vec<(char, &[char])> {
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < body.len() {
        let len = match (quote, body[i]) {
            ('\'', '\'') => 2,
            ('"', '\\') => match body.get(i + 1) {
                Some('x') => 4,
                Some('u') => 6,
                Some('U') => 10,
                _ => 2,
            },
            _ => 1,
        };
        let len = len.min(body.len() - i);
        let written = if len == 1 {
            &body[0..0]
        } else {
            &body[i..i + len]
        };
        // Only whether a character is a space matters: `''` is a quote, an
        // escape is never a plain space.
        tokens.push((if len == 1 { body[i] } else { quote }, written));
        i += len;
    }
    tokens
}

#[cfg(test)]
mod tests;
