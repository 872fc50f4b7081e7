//! YAML as `crossplane render` prints it for YAML 1.1 readers: a string that
//! go-yaml v2 (behind sigs.k8s.io/yaml, which the CLI prints with) would
//! read back as anything but a string is double-quoted, as go-yaml's
//! encoder quotes it (`stringv`: `resolve("", s)` is not `!!str`, or a base
//! 60 float).
//!
//! Why: yaml_serde quotes only what YAML 1.2 reads as another type, so
//! `2023-11-03T09:07:31Z`, `yes`, `on`, `~`, `0777` or `1:20` came out plain
//! and PyYAML, go-yaml v2 and kubectl's decoders read a timestamp, a bool, a
//! null, an octal int or a sexagesimal float where the object said string.
//!
//! Beyond go-yaml, what PyYAML's YAML 1.1 resolvers would not read back as
//! a string is quoted too (`<<`, `=`, `2023-02-29`, `._5`): go-yaml reads
//! those quoted as the same strings, so only the text differs from the CLI.
//!
//! How: the strings to quote (keys and values) are swapped for placeholders
//! no input can hold (a fixed-width counter after a digest of the whole
//! document) while serializing through yaml_serde, keys in go-yaml v2's
//! order (digit runs as numbers), then each placeholder is replaced by the JSON-escaped string
//! (valid YAML double-quoted style). Everything else is yaml_serde's, its
//! long scalars then folded at go-yaml's width (`fold`).
use regex::RegexSet;
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::cell::RefCell;
use std::sync::LazyLock;

/// `value` as YAML whose strings a YAML 1.1 reader reads back as strings,
/// long scalars folded as go-yaml v2 folds them (`fold`).
pub(crate) fn to_string(value: &Value) -> Result<String, yaml_serde::Error> {
    let digest = Sha256::digest(value.to_string().as_bytes());
    let quoting = Quoting {
        nonce: format!("xfnq{}", hex::encode(&digest[..12])),
        quoted: RefCell::new(Vec::new()),
    };
    let text = yaml_serde::to_string(&Quoted(value, &quoting))?;
    let quoted = quoting.quoted.into_inner();
    if quoted.is_empty() {
        return Ok(super::fold::fold(&text));
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find(&quoting.nonce) {
        out.push_str(&rest[..at]);
        let after = &rest[at + quoting.nonce.len()..];
        let index = after
            .get(..8)
            .and_then(|n| n.parse::<usize>().ok())
            .and_then(|n| quoted.get(n));
        match index {
            Some(s) => {
                out.push_str(&serde_json::Value::String(s.clone()).to_string());
                rest = &after[8..];
            }
            // Cannot happen: the nonce is derived from the document.
            None => {
                out.push_str(&quoting.nonce);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    Ok(super::fold::fold(&out))
}

struct Quoting {
    nonce: String,
    quoted: RefCell<Vec<String>>,
}

impl Quoting {
    fn string<S: Serializer>(&self, s: &str, serializer: S) -> Result<S::Ok, S::Error> {
        if s.contains('\n') || !quotes(s) {
            return serializer.serialize_str(s);
        }
        let mut quoted = self.quoted.borrow_mut();
        let placeholder = format!("{}{:08}", self.nonce, quoted.len());
        quoted.push(s.to_string());
        serializer.serialize_str(&placeholder)
    }
}

struct Quoted<'a>(&'a Value, &'a Quoting);
struct Key<'a>(&'a str, &'a Quoting);

impl Serialize for Key<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.1.string(self.0, serializer)
    }
}

impl Serialize for Quoted<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::String(s) => self.1.string(s, serializer),
            Value::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(&Quoted(item, self.1))?;
                }
                seq.end()
            }
            Value::Object(map) => {
                let mut out = serializer.serialize_map(Some(map.len()))?;
                for (key, value) in in_go_yaml_order(map) {
                    out.serialize_entry(&Key(key, self.1), &Quoted(value, self.1))?;
                }
                out.end()
            }
            other => other.serialize(serializer),
        }
    }
}

/// `map`'s entries in the order go-yaml v2 writes a map's keys
/// (`keyList.Less`, sorter.go), not byte order: a run of digits compares as
/// its number (`a9` before `a10`, `572124335820673165` before
/// `3209049587904145910`), other runes before letters. Sorted by a merge
/// sort, which never panics, as `sort_by` may on an order that is not total
/// (go-yaml's is not, with leading zeros).
fn in_go_yaml_order(map: &serde_json::Map<String, Value>) -> Vec<(&String, &Value)> {
    let entries: Vec<(&String, &Value)> = map.iter().collect();
    // Each key's runes once, not at every comparison.
    let runes: Vec<Vec<char>> = entries.iter().map(|(k, _)| k.chars().collect()).collect();
    let mut order: Vec<usize> = (0..entries.len()).collect();
    let mut merged = order.clone();
    let mut width = 1;
    while width < order.len() {
        for start in (0..order.len()).step_by(2 * width) {
            let middle = (start + width).min(order.len());
            let end = (start + 2 * width).min(order.len());
            let (mut left, mut right) = (start, middle);
            for slot in &mut merged[start..end] {
                let take_right = right < end
                    && (left == middle || go_yaml_less(&runes[order[right]], &runes[order[left]]));
                let next = if take_right { &mut right } else { &mut left };
                *slot = order[*next];
                *next += 1;
            }
        }
        std::mem::swap(&mut order, &mut merged);
        width *= 2;
    }
    order.into_iter().map(|i| entries[i]).collect()
}

/// go-yaml v2's `keyList.Less` of two string keys: at the first rune that
/// differs, two letters compare as runes, a letter goes after anything
/// else, and otherwise the runs of digits starting there compare as numbers
/// (wrapping at 64 bits as Go's int64 does; a zero after a non-zero digit
/// counts), then by length, then as runes; a prefix goes first. Digits are
/// ASCII here (Go's `unicode.IsDigit` takes every decimal digit).
fn go_yaml_less(a: &[char], b: &[char]) -> bool {
    let Some(i) = (0..a.len().min(b.len())).find(|&i| a[i] != b[i]) else {
        return a.len() < b.len();
    };
    let (a_letter, b_letter) = (a[i].is_alphabetic(), b[i].is_alphabetic());
    if a_letter && b_letter {
        return a[i] < b[i];
    }
    if a_letter || b_letter {
        return b_letter;
    }
    let mut start: i64 = 0;
    if a[i] == '0' || b[i] == '0' {
        let before = a[..i].iter().rev().take_while(|c| c.is_ascii_digit());
        if before.into_iter().any(|&c| c != '0') {
            start = 1;
        }
    }
    let number = |runes: &[char]| {
        let digits = runes[i..].iter().take_while(|c| c.is_ascii_digit());
        digits.fold((start, i), |(n, end), &c| {
            (
                n.wrapping_mul(10).wrapping_add(i64::from(c as u8 - b'0')),
                end + 1,
            )
        })
    };
    let ((an, a_end), (bn, b_end)) = (number(a), number(b));
    if an != bn {
        return an < bn;
    }
    if a_end != b_end {
        return a_end < b_end;
    }
    a[i] < b[i]
}

/// Whether `s` is quoted: go-yaml v2 quotes it, or PyYAML (whose implicit
/// resolvers are YAML 1.1's regular expressions, looser than go-yaml's
/// parsers: `2023-02-29` is a timestamp it then fails to build, `._5` a
/// float, `=` a value) would not read it plain as a string.
fn quotes(s: &str) -> bool {
    go_yaml_quotes(s) || yaml11_resolves(s)
}

/// PyYAML's implicit resolvers (yaml/resolver.py), the YAML 1.1 type
/// repository's regular expressions.
fn yaml11_resolves(s: &str) -> bool {
    static RESOLVERS: LazyLock<Option<RegexSet>> = LazyLock::new(|| {
        RegexSet::new([
            r"^(?:yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$",
            r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9_]+(?:[eE][-+][0-9]+)?|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
            r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+)$",
            r"^(?:<<)$",
            r"^(?:~|null|Null|NULL|)$",
            r"^(?:[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]|[0-9][0-9][0-9][0-9]-[0-9][0-9]?-[0-9][0-9]?(?:[Tt]|[ \t]+)[0-9][0-9]?:[0-9][0-9]:[0-9][0-9](?:\.[0-9]*)?(?:[ \t]*(?:Z|[-+][0-9][0-9]?(?::[0-9][0-9])?))?)$",
            r"^(?:=)$",
        ])
        .ok()
    });
    // The patterns are constants; should they not build, quote everything
    // rather than risk a misread.
    RESOLVERS.as_ref().is_none_or(|set| set.is_match(s))
}

/// Whether go-yaml v2's encoder double-quotes `s`: its `resolve("", s)`
/// (goyaml.v2/resolve.go) gives another tag than `!!str`, or it is a base
/// 60 float (`isBase60Float`).
fn go_yaml_quotes(s: &str) -> bool {
    const MAPPED: &[&str] = &[
        "y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON", "n", "N", "no",
        "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF", "", "~", "null", "Null",
        "NULL", ".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf",
        "-.Inf", "-.INF",
    ];
    let Some(&first) = s.as_bytes().first() else {
        return true; // "" is null
    };
    if is_base60_float(s) {
        return true;
    }
    match first {
        b'y' | b'Y' | b'n' | b'N' | b't' | b'T' | b'f' | b'F' | b'o' | b'O' | b'~' => {
            MAPPED.contains(&s)
        }
        b'.' => MAPPED.contains(&s) || go_float(s),
        b'+' | b'-' | b'0'..=b'9' => {
            if MAPPED.contains(&s) || is_timestamp(s) {
                return true;
            }
            let plain = s.replace('_', "");
            go_int_literal(&plain) || (yaml_style_float(&plain) && go_float(&plain))
        }
        _ => false,
    }
}

/// `strconv.ParseFloat` succeeds (finite: an overflow is an error in Go).
fn go_float(s: &str) -> bool {
    let decimal = |s: &str| {
        let (mantissa, exponent) = match s.find(['e', 'E']) {
            Some(at) => (&s[..at], Some(&s[at + 1..])),
            None => (s, None),
        };
        let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
        (!int.is_empty() || !frac.is_empty())
            && digits(int)
            && digits(frac)
            && exponent.is_none_or(|e| {
                let e = e.strip_prefix(['+', '-']).unwrap_or(e);
                !e.is_empty() && digits(e)
            })
    };
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(s);
    decimal(unsigned) && s.parse::<f64>().is_ok_and(f64::is_finite)
}

/// `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`
fn yaml_style_float(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(at) => (&s[..at], Some(&s[at + 1..])),
        None => (s, None),
    };
    let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match mantissa.split_once('.') {
        Some(("", frac)) => digits(frac),
        Some((int, frac)) => digits(int) && (frac.is_empty() || digits(frac)),
        None => digits(mantissa),
    };
    mantissa_ok && exponent.is_none_or(|e| digits(e.strip_prefix(['+', '-']).unwrap_or(e)))
}

/// `strconv.ParseInt(s, 0, 64)` (or `big.Int.SetString(s, 0)` past 64
/// bits): Go's integer literal syntax, underscores already removed.
fn go_int_literal(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let all = |d: &str, radix: u32| !d.is_empty() && d.chars().all(|c| c.is_digit(radix));
    if let Some(d) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        return all(d, 16);
    }
    if let Some(d) = s.strip_prefix("0o").or_else(|| s.strip_prefix("0O")) {
        return all(d, 8);
    }
    if let Some(d) = s.strip_prefix("0b").or_else(|| s.strip_prefix("0B")) {
        return all(d, 2);
    }
    if let Some(d) = s.strip_prefix('0') {
        return d.is_empty() || all(d, 8);
    }
    all(s, 10)
}

/// `^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$`
fn is_base60_float(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (body, frac) = s.split_once('.').unwrap_or((s, ""));
    if !frac.bytes().all(|b| b.is_ascii_digit() || b == b'_') {
        return false;
    }
    let mut parts = body.split(':');
    let head = parts.next().unwrap_or_default();
    let head_ok = head.as_bytes().first().is_some_and(u8::is_ascii_digit)
        && head.bytes().all(|b| b.is_ascii_digit() || b == b'_');
    let mut sexagesimal = 0;
    for part in parts {
        let b = part.as_bytes();
        let ok = match b {
            [d] => d.is_ascii_digit(),
            [t, d] => (b'0'..=b'5').contains(t) && d.is_ascii_digit(),
            _ => false,
        };
        if !ok {
            return false;
        }
        sexagesimal += 1;
    }
    head_ok && sexagesimal > 0
}

/// go-yaml v2's `parseTimestamp`: `YYYY-` then one of `2006-1-2T15:4:5.999999999Z07:00`
/// (`T` or `t`), `2006-1-2 15:4:5.999999999` or `2006-1-2`, as Go's
/// `time.Parse` reads them (1 or 2 digit fields, ranges checked).
fn is_timestamp(s: &str) -> bool {
    fn number(s: &str, max_digits: usize) -> Option<(u32, &str)> {
        let n = s
            .bytes()
            .take(max_digits)
            .take_while(u8::is_ascii_digit)
            .count();
        if n == 0 {
            return None;
        }
        Some((s[..n].parse().ok()?, &s[n..]))
    }
    let bytes = s.as_bytes();
    if bytes.len() < 5 || !bytes[..4].iter().all(u8::is_ascii_digit) || bytes[4] != b'-' {
        return false;
    }
    let Ok(year) = s[..4].parse::<u32>() else {
        return false;
    };
    let date = (|| {
        let (month, rest) = number(&s[5..], 2)?;
        let rest = rest.strip_prefix('-')?;
        let (day, rest) = number(rest, 2)?;
        let days = crate::calendar::days_in_month(year, month)?;
        (1..=days).contains(&day).then_some(rest)
    })();
    let Some(rest) = date else {
        return false;
    };
    if rest.is_empty() {
        return true;
    }
    let (zoned, rest) = match rest.as_bytes()[0] {
        b'T' | b't' => (true, &rest[1..]),
        b' ' => (false, &rest[1..]),
        _ => return false,
    };
    let time = (|| {
        let (hour, rest) = number(rest, 2)?;
        let (minute, rest) = number(rest.strip_prefix(':')?, 2)?;
        let (second, mut rest) = number(rest.strip_prefix(':')?, 2)?;
        if hour > 23 || minute > 59 || second > 59 {
            return None;
        }
        if let Some(frac) = rest.strip_prefix('.') {
            let n = frac.bytes().take_while(u8::is_ascii_digit).count();
            if n == 0 {
                return None;
            }
            rest = &frac[n..];
        }
        Some(rest)
    })();
    let Some(rest) = time else {
        return false;
    };
    if !zoned {
        return rest.is_empty();
    }
    if rest == "Z" {
        return true;
    }
    let Some(offset) = rest.strip_prefix(['+', '-']) else {
        return false;
    };
    let b = offset.as_bytes();
    b.len() == 5
        && b[2] == b':'
        && [b[0], b[1], b[3], b[4]].iter().all(u8::is_ascii_digit)
        && offset[..2].parse::<u32>().is_ok_and(|h| h <= 23)
        && offset[3..].parse::<u32>().is_ok_and(|m| m <= 59)
}

#[cfg(test)]
mod tests;
