//! A string's `format` as the API server checks it: kube-openapi's strfmt
//! registry (`pkg/validation/strfmt`, its `govalidator` and Go's
//! `net`, `net/mail`, `net/url`, `time`), restricted to the formats
//! apiextensions-apiserver keeps (`pkg/apiserver/validation/formats.go`:
//! the 1.0 set plus `k8s-short-name`/`k8s-long-name` from 1.34). Any other
//! format, `int32`, `int64`, `float` and `double` among them, is stripped
//! from a CRD's schema before validation and checks nothing.
//!
//! Invariant: each check is the Go function's verdict, quirks included
//! (`1.1.1.1` is no hostname, `root@localhost` is an email, `1wk` a
//! duration, a `:60` second no date-time, `""` no `byte`), so that a value
//! xfn passes is one the API server passes, and the other way round.
//! Format names are matched as strfmt matches them: with every `-` removed.
//!
//! Why bounded: every check is linear in the string (the regular
//! expressions are compiled once, from constants).
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::LazyLock;

use regex::Regex;

/// Whether `text` is a valid `format`; `None` for a format the API server
/// does not check.
pub(super) fn check(format: &str, text: &str) -> Option<bool> {
    Some(match format.replace('-', "").as_str() {
        "bsonobjectid" => text.len() == 24 && text.bytes().all(|b| b.is_ascii_hexdigit()),
        "uri" => super::url::Url::parse_request_uri(text).is_ok(),
        "email" => email(text),
        "hostname" => hostname(text),
        "ipv4" => ip_sloppy(text).is_some() && text.contains('.'),
        "ipv6" => text.parse::<Ipv6Addr>().is_ok() && text.contains(':'),
        "cidr" => cidr(text),
        "mac" => mac(text),
        "uuid" => matches(&UUID, text),
        "uuid3" => matches(&UUID3, text),
        "uuid4" => matches(&UUID4, text),
        "uuid5" => matches(&UUID5, text),
        "isbn" => isbn10(text) || isbn13(text),
        "isbn10" => isbn10(text),
        "isbn13" => isbn13(text),
        "creditcard" => credit_card(text),
        "ssn" => text.len() == 11 && matches(&SSN, text),
        "hexcolor" => matches(&HEXCOLOR, text),
        "rgbcolor" => matches(&RGBCOLOR, text),
        "byte" => matches(&BASE64, text),
        "password" => true,
        "date" => date(text),
        "datetime" => date_time(text),
        "duration" => duration(text),
        "k8sshortname" => text.len() <= 63 && matches(&SHORT_NAME, text),
        "k8slongname" => text.len() <= 253 && matches(&LONG_NAME, text),
        _ => return None,
    })
}

macro_rules! pattern {
    ($name:ident, $re:expr) => {
        static $name: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new($re).ok());
    };
}

// kube-openapi's patterns; Go's `\d` and `\s` are ASCII, spelled out here.
pattern!(
    UUID,
    r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$"
);
pattern!(
    UUID3,
    r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?3[0-9a-f]{3}-?[0-9a-f]{4}-?[0-9a-f]{12}$"
);
pattern!(
    UUID4,
    r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?4[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$"
);
pattern!(
    UUID5,
    r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?5[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$"
);
// strfmt's HostnamePattern's character classes, each compiled alone: the
// whole pattern (`\p{L}` repeated up to 63 times) takes ~1 s and 25 MiB to
// compile in a debug build; `hostname_pattern` follows its structure.
pattern!(NOT_HOST_CHAR, r"[^a-zA-Z0-9\p{S}\p{L}]");
pattern!(NOT_LETTER, r"[^a-zA-Z\p{L}]");
pattern!(
    CREDIT_CARD,
    r"^(?:4[0-9]{12}(?:[0-9]{3})?|5[1-5][0-9]{14}|6(?:011|5[0-9][0-9])[0-9]{12}|3[47][0-9]{13}|3(?:0[0-5]|[68][0-9])[0-9]{11}|(?:2131|1800|35[0-9]{3})[0-9]{11})$"
);
pattern!(HEXCOLOR, r"^#?([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$");
pattern!(
    RGBCOLOR,
    r"^rgb\([\t\n\f\r ]*(0|[1-9][0-9]?|1[0-9][0-9]?|2[0-4][0-9]|25[0-5])[\t\n\f\r ]*,[\t\n\f\r ]*(0|[1-9][0-9]?|1[0-9][0-9]?|2[0-4][0-9]|25[0-5])[\t\n\f\r ]*,[\t\n\f\r ]*(0|[1-9][0-9]?|1[0-9][0-9]?|2[0-4][0-9]|25[0-5])[\t\n\f\r ]*\)$"
);
pattern!(
    BASE64,
    r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})$"
);
pattern!(SSN, r"^[0-9]{3}[- ]?[0-9]{2}[- ]?[0-9]{4}$");
pattern!(SHORT_NAME, r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$");
pattern!(
    LONG_NAME,
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
);
pattern!(
    TIME,
    r"^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))$"
);
pattern!(DURATION_PART, r"([0-9]+)[\t\n\f\r ]*([A-Za-zµ]+)");

fn matches(re: &LazyLock<Option<Regex>>, text: &str) -> bool {
    re.as_ref().is_some_and(|r| r.is_match(text))
}

/// strfmt's `IsHostname`: its pattern (a single label, or labels and a
/// top-level domain of letters), at most 255 bytes, labels at most 63.
fn hostname(text: &str) -> bool {
    hostname_pattern(text) && text.len() <= 255 && text.split('.').all(|p| p.len() <= 63)
}

/// strfmt's `HostnamePattern`, `^(C(-?C{0,62})?|(C(D{0,61}C)?\.)+L{2,63})$`
/// with C a letter, digit or symbol, D those or `-`, L a letter.
fn hostname_pattern(text: &str) -> bool {
    let only = |re: &LazyLock<Option<Regex>>, s: &str| re.as_ref().is_some_and(|r| !r.is_match(s));
    let host = |c: char| only(&NOT_HOST_CHAR, c.encode_utf8(&mut [0; 4]));
    let Some((labels, tld)) = text.rsplit_once('.') else {
        let mut chars = text.chars();
        let Some(first) = chars.next() else {
            return false;
        };
        let rest = chars.as_str();
        let rest = rest.strip_prefix('-').unwrap_or(rest);
        return host(first) && rest.chars().count() <= 62 && only(&NOT_HOST_CHAR, rest);
    };
    let label_ok = |label: &str| {
        let count = label.chars().count();
        let (Some(first), Some(last)) = (label.chars().next(), label.chars().last()) else {
            return false;
        };
        count <= 63 && host(first) && host(last) && label.chars().all(|c| c == '-' || host(c))
    };
    (2..=63).contains(&tld.chars().count())
        && only(&NOT_LETTER, tld)
        && labels.split('.').all(label_ok)
}

/// Go's `time.Parse("2006-01-02", …)`: the days of the month checked.
fn date(text: &str) -> bool {
    let b = text.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return false;
    }
    let number = |range: std::ops::Range<usize>| -> Option<u32> {
        let part = &text[range];
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())
            .flatten()
    };
    let (Some(year), Some(month), Some(day)) = (number(0..4), number(5..7), number(8..10)) else {
        return false;
    };
    crate::calendar::days_in_month(year, month).is_some_and(|days| (1..=days).contains(&day))
}

/// strfmt's `IsDateTime`: lower-cased and split at every `t`, the first
/// part a date, the second a time of at most `23:59:59` (no leap second);
/// the offset's digits are not range-checked, parts after a second `t`
/// not looked at.
fn date_time(text: &str) -> bool {
    if text.len() < 4 {
        return false;
    }
    let lower = text.to_lowercase();
    let mut parts = lower.split('t');
    let (Some(day), Some(time)) = (parts.next(), parts.next()) else {
        return false;
    };
    let Some(c) = TIME.as_ref().and_then(|r| r.captures(time)) else {
        return false;
    };
    let field = |i: usize| c.get(i).map_or("", |m| m.as_str());
    date(day) && field(1) <= "23" && field(2) <= "59" && field(3) <= "59"
}

/// strfmt's `ParseDuration`: Go's `time.ParseDuration`, else any
/// `<digits> <unit>` in the string with a unit strfmt knows (`ns`, `us`,
/// `µs`, `ms`, `s`, `m`, `h`, `hr`, `d`, `w`, `wk`, or a word starting
/// `nano`, `micro`, `milli`, `sec`, `min`, `hour`, `day`, `week`).
fn duration(text: &str) -> bool {
    if go_duration(text) {
        return true;
    }
    const UNITS: [&[&str]; 8] = [
        &["ns", "nano"],
        &["us", "µs", "micro"],
        &["ms", "milli"],
        &["s", "sec"],
        &["m", "min"],
        &["h", "hr", "hour"],
        &["d", "day"],
        &["w", "wk", "week"],
    ];
    let Some(re) = DURATION_PART.as_ref() else {
        return false;
    };
    let mut known = false;
    for c in re.captures_iter(text) {
        let digits = c.get(1).map_or("", |m| m.as_str());
        // Go's strconv.Atoi: a count that overflows ends the parse.
        if digits.parse::<i64>().is_err() {
            return false;
        }
        let unit = c.get(2).map_or("", |m| m.as_str()).to_lowercase();
        known |= UNITS.iter().any(|variants| {
            let last = variants.len() - 1;
            variants
                .iter()
                .enumerate()
                .any(|(i, v)| (i == last && unit.starts_with(v)) || unit == *v)
        });
    }
    known
}

/// Go's `time.ParseDuration`: `[-+]`, then `0` or one or more decimal
/// numbers each with a unit (`ns`, `us`, `µs`, `μs`, `ms`, `s`, `m`, `h`),
/// within ±2⁶³ nanoseconds, counted exactly as Go counts them.
fn go_duration(text: &str) -> bool {
    let negative = text.starts_with('-');
    let s = text.strip_prefix(['-', '+']).unwrap_or(text);
    if s == "0" {
        return true;
    }
    if s.is_empty() {
        return false;
    }
    let mut rest = s;
    let limit: u128 = (1 << 63) - u128::from(!negative);
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int, after) = rest.split_at(int_len);
        let (frac, after) = match after.strip_prefix('.') {
            Some(after) => {
                let n = after.bytes().take_while(u8::is_ascii_digit).count();
                after.split_at(n)
            }
            None => ("", after),
        };
        if int.is_empty() && frac.is_empty() {
            return false;
        }
        let unit_len = after
            .char_indices()
            .find(|(_, c)| *c == '.' || c.is_ascii_digit())
            .map_or(after.len(), |(i, _)| i);
        let (unit, after) = after.split_at(unit_len);
        let nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return false,
        };
        // Go: the integer part overflows past 2⁶³; the fraction is cut
        // to what fits and scaled down.
        let Some(whole) = (if int.is_empty() {
            Some(0)
        } else {
            int.parse::<u128>().ok()
        })
        .filter(|w| *w <= 1 << 63) else {
            return false;
        };
        let digits = &frac[..frac.len().min(18)];
        let scale = 10u128.pow(digits.len() as u32);
        let fraction = digits.parse::<u128>().unwrap_or(0) * nanos / scale;
        total += whole * nanos + fraction;
        if total > 1 << 63 {
            return false;
        }
        rest = after;
    }
    total <= limit
}

/// Go's `net/mail.ParseAddress`: an addr-spec (`local@domain`, the local
/// part a dot-atom or a quoted string, the domain a dot-atom or a
/// `[literal]`), alone or in angle brackets after a display name.
fn email(text: &str) -> bool {
    let mut text = text.trim_matches([' ', '\t']);
    // A trailing comment, `(…)`, is whitespace to Go's parser.
    while let Some(open) = text.strip_suffix(')').and_then(|t| t.rfind('(')) {
        text = text[..open].trim_end_matches([' ', '\t']);
    }
    if addr_spec(text) {
        return true;
    }
    let Some(inner) = text.strip_suffix('>') else {
        return false;
    };
    let Some((name, address)) = inner.split_once('<') else {
        return false;
    };
    phrase(name.trim_matches([' ', '\t'])) && addr_spec(address.trim_matches([' ', '\t']))
}

/// RFC 5322 atext as Go's net/mail takes it: a visible character (or any
/// non-ASCII one) other than the specials.
fn atext(c: char) -> bool {
    !matches!(
        c,
        '(' | ')' | '<' | '>' | '[' | ']' | ':' | ';' | '@' | '\\' | ',' | '"' | '.'
    ) && (('!'..='~').contains(&c) || !c.is_ascii())
}

fn dot_atom(s: &str) -> bool {
    !s.is_empty() && s.split('.').all(|a| !a.is_empty() && a.chars().all(atext))
}

fn quoted_string(s: &str) -> bool {
    let Some(inner) = s.strip_prefix('"').and_then(|s| s.strip_suffix('"')) else {
        return false;
    };
    let mut escaped = false;
    for c in inner.chars() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == '"' || (c.is_ascii_control() && c != '\t') {
            return false;
        }
    }
    !escaped
}

fn addr_spec(s: &str) -> bool {
    let Some(at) = s.rfind('@') else {
        return false;
    };
    let (local, domain) = (&s[..at], s[at + 1..].trim_start_matches([' ', '\t']));
    let local_ok = if local.starts_with('"') {
        quoted_string(local) && local.len() > 2
    } else {
        dot_atom(local)
    };
    let domain_ok = match domain.strip_prefix('[') {
        Some(literal) => literal.strip_suffix(']').is_some_and(|l| {
            l.chars()
                .all(|c| ('!'..='~').contains(&c) && !matches!(c, '[' | ']' | '\\'))
        }),
        None => dot_atom(domain),
    };
    local_ok && domain_ok
}

/// A display name: words (atoms, dots allowed, or quoted strings), or none.
fn phrase(s: &str) -> bool {
    s.is_empty()
        || quoted_string(s)
        || s.split([' ', '\t'])
            .filter(|w| !w.is_empty())
            .all(|w| quoted_string(w) || w.chars().all(|c| c == '.' || atext(c)))
}

/// Go's (pre-1.17, forked by k8s.io/utils) `net.ParseIP`: IPv4 fields may
/// have leading zeros.
fn ip_sloppy(text: &str) -> Option<IpAddr> {
    if text.contains(':') {
        return text.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    let mut octets = [0u8; 4];
    let mut fields = text.split('.');
    for octet in &mut octets {
        let field = fields.next()?;
        if field.is_empty() || !field.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let value: u64 = field.parse().ok()?;
        *octet = u8::try_from(value).ok()?;
    }
    fields
        .next()
        .is_none()
        .then_some(IpAddr::V4(Ipv4Addr::from(octets)))
}

/// k8s.io/utils' `ParseCIDRSloppy`: an address and a decimal prefix length
/// within its family's bits.
fn cidr(text: &str) -> bool {
    let Some((address, bits)) = text.split_once('/') else {
        return false;
    };
    if bits.is_empty() || !bits.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    let bits: u32 = bits.parse().unwrap_or(u32::MAX);
    match ip_sloppy(address) {
        Some(IpAddr::V4(_)) => bits <= 32,
        Some(IpAddr::V6(_)) => bits <= 128,
        None => false,
    }
}

/// Go's `net.ParseMAC`: 6, 8 or 20 octets as `xx:xx…`, `xx-xx…` (one
/// separator throughout) or `xxxx.xxxx…`.
fn mac(text: &str) -> bool {
    let b = text.as_bytes();
    if b.len() < 14 {
        return false;
    }
    let hex = |s: &[u8]| s.iter().all(u8::is_ascii_hexdigit);
    let (group, separator) = if b[2] == b':' || b[2] == b'-' {
        (2, b[2])
    } else if b[4] == b'.' {
        (4, b'.')
    } else {
        return false;
    };
    if (b.len() + 1) % (group + 1) != 0 {
        return false;
    }
    let octets = (b.len() + 1) / (group + 1) * group / 2;
    if !matches!(octets, 6 | 8 | 20) {
        return false;
    }
    b.chunks(group + 1)
        .all(|chunk| hex(&chunk[..group]) && (chunk.len() == group || chunk[group] == separator))
}

/// govalidator's `IsISBN10`: spaces and dashes dropped, 9 digits and a
/// digit or `X`, the weighted sum a multiple of 11.
fn isbn10(text: &str) -> bool {
    let s: Vec<u8> = isbn_digits(text);
    if s.len() != 10
        || !s[..9].iter().all(u8::is_ascii_digit)
        || !(s[9].is_ascii_digit() || s[9] == b'X')
    {
        return false;
    }
    let mut sum: u32 = (0..9)
        .map(|i| (i as u32 + 1) * u32::from(s[i] - b'0'))
        .sum();
    sum += 10
        * if s[9] == b'X' {
            10
        } else {
            u32::from(s[9] - b'0')
        };
    sum % 11 == 0
}

/// govalidator's `IsISBN13`: 13 digits, weights 1 and 3.
fn isbn13(text: &str) -> bool {
    let s = isbn_digits(text);
    if s.len() != 13 || !s.iter().all(u8::is_ascii_digit) {
        return false;
    }
    let sum: u32 = (0..12)
        .map(|i| [1, 3][i % 2] * u32::from(s[i] - b'0'))
        .sum();
    u32::from(s[12] - b'0') == (10 - sum % 10) % 10
}

fn isbn_digits(text: &str) -> Vec<u8> {
    text.bytes()
        .filter(|b| !matches!(b, b'\t' | b'\n' | b'\x0c' | b'\r' | b' ' | b'-'))
        .collect()
}

/// govalidator's `IsCreditCard`: every non-digit dropped, an issuer's
/// pattern, the Luhn checksum.
fn credit_card(text: &str) -> bool {
    let digits: String = text.chars().filter(char::is_ascii_digit).collect();
    if !matches(&CREDIT_CARD, &digits) {
        return false;
    }
    let mut sum = 0;
    for (i, d) in digits.bytes().rev().enumerate() {
        let mut n = u32::from(d - b'0');
        if i % 2 == 1 {
            n *= 2;
            if n >= 10 {
                n = n % 10 + 1;
            }
        }
        sum += n;
    }
    sum % 10 == 0
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::check;

    /// tests/validate/formats/cases.yaml: one resource per case, its `spec`
    /// one field named for its format, its annotation `expect` what
    /// kube-openapi's strfmt says (the peers test holds the same file
    /// against `crossplane resource validate`).
    #[test]
    fn every_format_gives_kube_openapis_verdict() {
        let cases = include_str!("../../tests/validate/formats/cases.yaml");
        let mut checked = 0;
        for line in cases.lines().filter(|l| l.starts_with('{')) {
            let case: Value = serde_json::from_str(line).unwrap();
            let expect = case["metadata"]["annotations"]["expect"] == "valid";
            let (format, value) = case["spec"].as_object().unwrap().iter().next().unwrap();
            let Some(text) = value.as_str() else { continue };
            assert_eq!(
                check(format, text).unwrap_or(true),
                expect,
                "format {format:?}, value {text:?}"
            );
            checked += 1;
        }
        assert!(checked > 300, "only {checked} cases read");
    }

    #[test]
    fn formats_the_api_server_strips_check_nothing() {
        for format in [
            "int32", "int64", "float", "double", "binary", "quantity", "url",
        ] {
            assert_eq!(check(format, "anything"), None, "{format}");
        }
    }
}
