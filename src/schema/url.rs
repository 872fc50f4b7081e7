//! Kubernetes' CEL URL library (apiserver `pkg/cel/library/urls.go`) on
//! Go's `net/url`, which it is made of: `url()` and `isURL()` accept what
//! `url.ParseRequestURI` accepts (an absolute URI or an absolute path), the
//! value is what `url.Parse` makes of it, and the getters are its fields
//! and methods (`Scheme`, `Host`, `Hostname()`, `Port()`, `EscapedPath()`,
//! `Query()`). The `uri` format ([`super::format`]) is `ParseRequestURI`
//! too.
//!
//! Why xfn's own and not kube-cel's (0.8): kube-cel parses with the
//! `url` crate (WHATWG), reading `/path` as `http://localhost/path` and
//! giving an empty path as `/`, so `url('/path').getHost()` was
//! `localhost` and `url('https://example.com').getEscapedPath()` `/`,
//! where the API server says `''`; its URL type is private, so its getters
//! cannot be corrected one by one.
//!
//! Go as of 1.25 (Kubernetes v1.35's): bracketed hosts must be IPv6
//! addresses (1.25.2), a query of more than 10,000 parameters has none
//! (1.25.6); a host's port is after its last colon (1.26's strict colons
//! for http(s) are not in 1.25). Every step is linear in the string.
use std::net::Ipv6Addr;
use std::sync::Arc;

use cel::extractors::This;
use cel::objects::{Key, Opaque};
use cel::{Context, ExecutionError, FunctionContext, Value};

/// A URL as Go's `url.URL` holds it (the fields the library reads).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct Url {
    scheme: String,
    opaque: String,
    host: String,
    /// Unescaped.
    path: String,
    /// The path as written, when it is not the default escaping of `path`.
    raw_path: String,
    raw_query: String,
}

impl Opaque for Url {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.URL"
    }
}

/// The parts of a URL `%`-escapes are read in (Go's `encoding`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Path,
    Host,
    Zone,
    UserPassword,
    QueryComponent,
    Fragment,
}

/// Go's `shouldEscape`.
fn should_escape(c: u8, part: Part) -> bool {
    if c.is_ascii_alphanumeric() {
        return false;
    }
    if matches!(part, Part::Host | Part::Zone) && b"!$&'()*+,;=:[]<>\"".contains(&c) {
        return false;
    }
    match c {
        b'-' | b'_' | b'.' | b'~' => return false,
        b'$' | b'&' | b'+' | b',' | b'/' | b':' | b';' | b'=' | b'?' | b'@' => match part {
            Part::Path => return c == b'?',
            Part::UserPassword => return matches!(c, b'@' | b'/' | b'?' | b':'),
            Part::QueryComponent => return true,
            Part::Fragment => return false,
            Part::Host | Part::Zone => {}
        },
        _ => {}
    }
    !(part == Part::Fragment && matches!(c, b'!' | b'(' | b')' | b'*'))
}

fn hex(c: u8) -> Option<u8> {
    char::from(c)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// Go's `unescape`: `%XY` decoded (whole, and in a host only for a
/// non-ASCII byte or `%25`), `+` a space in a query component.
fn unescape(s: &str, part: Part) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let (Some(hi), Some(lo)) = (
                    b.get(i + 1).copied().and_then(hex),
                    b.get(i + 2).copied().and_then(hex),
                ) else {
                    let end = (i + 3).min(b.len());
                    return Err(format!(
                        "invalid URL escape {:?}",
                        String::from_utf8_lossy(&b[i..end])
                    ));
                };
                let escape = &s[i..i + 3];
                let byte = hi << 4 | lo;
                let refused = match part {
                    Part::Host => hi < 8 && escape != "%25",
                    Part::Zone => {
                        escape != "%25" && byte != b' ' && should_escape(byte, Part::Host)
                    }
                    _ => false,
                };
                if refused {
                    return Err(format!("invalid URL escape {escape:?}"));
                }
                out.push(byte);
                i += 3;
            }
            b'+' if part == Part::QueryComponent => {
                out.push(b' ');
                i += 1;
            }
            c => {
                if matches!(part, Part::Host | Part::Zone) && c < 0x80 && should_escape(c, part) {
                    return Err(format!(
                        "invalid character {:?} in host name",
                        char::from(c)
                    ));
                }
                out.push(c);
                i += 1;
            }
        }
    }
    // Go's strings hold any bytes; a decoded non-UTF-8 byte is kept as
    // U+FFFD (only what the getters return can show it).
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Go's `escape` of a path.
fn escape_path(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &c in s.as_bytes() {
        if should_escape(c, Part::Path) {
            out.push_str(&format!("%{c:02X}"));
        } else {
            out.push(char::from(c));
        }
    }
    out
}

/// Go's `getScheme`: the scheme and the rest.
fn split_scheme(raw: &str) -> Result<(&str, &str), String> {
    for (i, c) in raw.bytes().enumerate() {
        match c {
            b'a'..=b'z' | b'A'..=b'Z' => {}
            b'0'..=b'9' | b'+' | b'-' | b'.' if i > 0 => {}
            b':' if i == 0 => return Err("missing protocol scheme".into()),
            b':' => return Ok((&raw[..i], &raw[i + 1..])),
            _ => return Ok(("", raw)),
        }
    }
    Ok(("", raw))
}

/// Go's `validOptionalPort`: empty, or `:` and digits.
fn valid_port(port: &str) -> bool {
    port.is_empty()
        || port
            .strip_prefix(':')
            .is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()))
}

/// Go's `parseHost`: `host[:port]`, unescaped.
fn parse_host(host: &str) -> Result<String, String> {
    match host.rfind('[') {
        Some(open) if open > 0 => Err("invalid IP-literal".into()),
        Some(_) => {
            let close = host.rfind(']').ok_or("missing ']' in host")?;
            let colon_port = &host[close + 1..];
            if !valid_port(colon_port) {
                return Err(format!("invalid port {colon_port:?} after host"));
            }
            let colon_port = unescape(colon_port, Part::Host)?;
            // `[` is at 0, so `close` (the last `]`) is at least 1.
            let inner = host.get(1..close).ok_or("missing ']' in host")?;
            let name = match inner.find("%25") {
                Some(zone) => {
                    unescape(&inner[..zone], Part::Host)? + &unescape(&inner[zone..], Part::Zone)?
                }
                None => unescape(inner, Part::Host)?,
            };
            // netip.ParseAddr: an IPv6 address (an IPv4 one is refused
            // here), with a non-empty zone.
            let (address, zone) = name.split_once('%').unwrap_or((&name, "x"));
            if zone.is_empty() || address.parse::<Ipv6Addr>().is_err() {
                return Err(format!("invalid host: {name:?}"));
            }
            Ok(format!("[{name}]{colon_port}"))
        }
        None => {
            if let Some(colon) = host.rfind(':') {
                if !valid_port(&host[colon..]) {
                    return Err(format!("invalid port {:?} after host", &host[colon..]));
                }
            }
            unescape(host, Part::Host)
        }
    }
}

/// Go's `validUserinfo`.
fn valid_userinfo(s: &str) -> bool {
    s.bytes()
        .all(|c| c.is_ascii_alphanumeric() || b"-._:~!$&'()*+,;=%@".contains(&c))
}

impl Url {
    /// Go's `url.Parse`: `raw` with its fragment, relative or absolute.
    pub(super) fn parse(raw: &str) -> Result<Url, String> {
        let (url, fragment) = raw.split_once('#').unwrap_or((raw, ""));
        let parsed = Url::parse_inner(url, false)?;
        unescape(fragment, Part::Fragment)?;
        Ok(parsed)
    }

    /// Go's `url.ParseRequestURI`: an absolute URI or an absolute path.
    pub(super) fn parse_request_uri(raw: &str) -> Result<Url, String> {
        Url::parse_inner(raw, true)
    }

    /// Go's `parse`.
    fn parse_inner(raw: &str, via_request: bool) -> Result<Url, String> {
        if raw.bytes().any(|b| b < b' ' || b == 0x7f) {
            return Err("net/url: invalid control character in URL".into());
        }
        if raw.is_empty() && via_request {
            return Err("empty url".into());
        }
        let mut url = Url::default();
        if raw == "*" {
            url.path = "*".into();
            return Ok(url);
        }
        let (scheme, rest) = split_scheme(raw)?;
        url.scheme = scheme.to_ascii_lowercase();
        let mut rest = if rest.ends_with('?') && rest.matches('?').count() == 1 {
            &rest[..rest.len() - 1]
        } else {
            let (before, query) = rest.split_once('?').unwrap_or((rest, ""));
            url.raw_query = query.to_string();
            before
        };
        if !rest.starts_with('/') {
            if !url.scheme.is_empty() {
                url.opaque = rest.to_string();
                return Ok(url);
            }
            if via_request {
                return Err("invalid URI for request".into());
            }
            let segment = rest.split('/').next().unwrap_or_default();
            if segment.contains(':') {
                return Err("first path segment in URL cannot contain colon".into());
            }
        }
        if (!url.scheme.is_empty() || !via_request && !rest.starts_with("///"))
            && rest.starts_with("//")
        {
            let after = &rest[2..];
            let (authority, path) = after.find('/').map_or((after, ""), |i| after.split_at(i));
            let host = match authority.rfind('@') {
                Some(at) => {
                    let host = parse_host(&authority[at + 1..])?;
                    let userinfo = &authority[..at];
                    if !valid_userinfo(userinfo) {
                        return Err("net/url: invalid userinfo".into());
                    }
                    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
                    unescape(user, Part::UserPassword)?;
                    unescape(password, Part::UserPassword)?;
                    host
                }
                None => parse_host(authority)?,
            };
            url.host = host;
            rest = path;
        }
        // Go's `setPath`.
        url.path = unescape(rest, Part::Path)?;
        if escape_path(&url.path) != rest {
            url.raw_path = rest.to_string();
        }
        Ok(url)
    }

    /// Go's `EscapedPath()`.
    fn escaped_path(&self) -> String {
        if !self.raw_path.is_empty() && valid_encoded_path(&self.raw_path) {
            if let Ok(path) = unescape(&self.raw_path, Part::Path) {
                if path == self.path {
                    return self.raw_path.clone();
                }
            }
        }
        if self.path == "*" {
            return "*".into();
        }
        escape_path(&self.path)
    }

    /// Go's `splitHostPort` of the host: `(hostname, port)`.
    fn host_port(&self) -> (&str, &str) {
        let mut host = self.host.as_str();
        let mut port = "";
        if let Some(colon) = host.rfind(':') {
            if valid_port(&host[colon..]) {
                port = &host[colon + 1..];
                host = &host[..colon];
            }
        }
        if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            host = inner;
        }
        (host, port)
    }

    /// Go's `Query()`: every well-formed `key=value` of the query, values
    /// in order; none past 10,000 parameters.
    fn query(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        if self.raw_query.matches('&').count() + 1 > 10_000 {
            return out;
        }
        let mut index = std::collections::HashMap::new();
        for pair in self.raw_query.split('&') {
            if pair.is_empty() || pair.contains(';') {
                continue;
            }
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let (Ok(key), Ok(value)) = (
                unescape(key, Part::QueryComponent),
                unescape(value, Part::QueryComponent),
            ) else {
                continue;
            };
            let at = *index.entry(key.clone()).or_insert_with(|| {
                out.push((key, Vec::new()));
                out.len() - 1
            });
            out[at].1.push(value);
        }
        out
    }
}

/// Go's `validEncoded` for a path.
fn valid_encoded_path(s: &str) -> bool {
    s.bytes()
        .all(|c| b"!$&'()*+,;=:@[]%".contains(&c) || !should_escape(c, Part::Path))
}

/// Registers the library in `context`, over kube-cel's.
pub(super) fn register(context: &mut Context) {
    context.add_function("url", url);
    context.add_function("isURL", is_url);
    context.add_function("getScheme", |ftx: &FunctionContext, this: This<Value>| {
        with(ftx, this, |u| text(&u.scheme))
    });
    context.add_function("getHost", |ftx: &FunctionContext, this: This<Value>| {
        with(ftx, this, |u| text(&u.host))
    });
    context.add_function("getHostname", |ftx: &FunctionContext, this: This<Value>| {
        with(ftx, this, |u| text(u.host_port().0))
    });
    context.add_function("getPort", |ftx: &FunctionContext, this: This<Value>| {
        with(ftx, this, |u| text(u.host_port().1))
    });
    context.add_function(
        "getEscapedPath",
        |ftx: &FunctionContext, this: This<Value>| with(ftx, this, |u| text(&u.escaped_path())),
    );
    context.add_function("getQuery", |ftx: &FunctionContext, this: This<Value>| {
        with(ftx, this, |u| {
            let map: std::collections::HashMap<Key, Value> = u
                .query()
                .into_iter()
                .map(|(k, vs)| {
                    let list = vs.iter().map(|v| text(v)).collect();
                    (Key::from(k), Value::List(Arc::new(list)))
                })
                .collect();
            Value::Map(map.into())
        })
    });
}

fn text(s: &str) -> Value {
    Value::String(Arc::new(s.to_string()))
}

/// A getter of a URL value.
fn with(
    ftx: &FunctionContext,
    This(this): This<Value>,
    get: impl Fn(&Url) -> Value,
) -> Result<Value, ExecutionError> {
    match &this {
        Value::Opaque(o) => o
            .downcast_ref::<Url>()
            .map(get)
            .ok_or_else(|| ftx.error("no such overload: expects a URL")),
        _ => Err(ftx.error("no such overload: expects a URL")),
    }
}

/// `url()`: checked with `ParseRequestURI`, parsed with `Parse` (as
/// urls.go does: `ParseRequestURI` would read a fragment into the path).
fn url(ftx: &FunctionContext, text: Arc<String>) -> Result<Value, ExecutionError> {
    Url::parse_request_uri(&text)
        .and_then(|_| Url::parse(&text))
        .map(|u| Value::Opaque(Arc::new(u)))
        .map_err(|e| {
            ftx.error(format!(
                "URL parse error during conversion from string: parse {text:?}: {e}"
            ))
        })
}

fn is_url(text: Arc<String>) -> bool {
    Url::parse_request_uri(&text).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(raw: &str) -> Url {
        Url::parse_request_uri(raw).unwrap();
        Url::parse(raw).unwrap()
    }

    /// urls.go's documented examples and validation_test.go's *URL
    /// parsing* cases (kubernetes v1.35.3, lines 1919–1968).
    #[test]
    fn the_getters_give_what_go_s_url_gives() {
        let u = parsed("/path");
        assert_eq!((u.scheme.as_str(), u.host.as_str()), ("", ""));
        assert_eq!(u.host_port(), ("", ""));
        assert_eq!(parsed("https://example.com/").scheme, "https");
        assert_eq!(parsed("https://example.com:80/").host, "example.com:80");
        assert_eq!(
            parsed("https://example.com:80/").host_port(),
            ("example.com", "80")
        );
        assert_eq!(
            parsed("https://example.com/").host_port(),
            ("example.com", "")
        );
        assert_eq!(parsed("https://[::1]:80/").host, "[::1]:80");
        assert_eq!(parsed("https://[::1]:80/").host_port(), ("::1", "80"));
        assert_eq!(parsed("https://[::1]/").host_port(), ("::1", ""));
        assert_eq!(parsed("https://127.0.0.1/").host_port().0, "127.0.0.1");
        assert_eq!(parsed("https://example.com/path").escaped_path(), "/path");
        assert_eq!(
            parsed("https://example.com/with space/").escaped_path(),
            "/with%20space/"
        );
        assert_eq!(parsed("https://example.com").escaped_path(), "");
        assert_eq!(parsed("https://example.com/a%2fb").escaped_path(), "/a%2fb");
        assert_eq!(
            parsed("https://example.com/path?k1=a&k2=b&k2=c").query(),
            vec![
                ("k1".into(), vec!["a".into()]),
                ("k2".into(), vec!["b".into(), "c".into()])
            ]
        );
        assert_eq!(
            parsed("https://example.com/path?key with spaces=value with spaces").query(),
            vec![("key with spaces".into(), vec!["value with spaces".into()])]
        );
        assert!(parsed("https://example.com/path?").query().is_empty());
        assert!(parsed("https://example.com/path").query().is_empty());
        let u = parsed("https://user:pass@kubernetes.io:80/docs/home?k1=a&k2=b&k2=c#anchor");
        assert_eq!(
            (u.host.as_str(), u.escaped_path()),
            ("kubernetes.io:80", "/docs/home".into())
        );
        assert_eq!(u.query().len(), 2);
    }

    #[test]
    fn only_what_parse_request_uri_accepts_is_a_url() {
        for good in [
            "https://user:pass@example.com:80/path?query=val#fragment",
            "/path",
            "*",
            "mailto:a@b",
            "https://[fe80::1%25en0]:8080/",
        ] {
            assert!(Url::parse_request_uri(good).is_ok(), "{good}");
        }
        for bad in [
            "https://a:b:c/",
            "../relative-path",
            "relative",
            "",
            "https://[1.2.3.4]/",
            "https://a[::1]/",
            "https://ex%41mple.com/",
            "https://example.com/%zz",
            "http://a b.com/",
            "https://host/\u{7f}",
            ":foo",
        ] {
            assert!(Url::parse_request_uri(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_query_of_more_than_ten_thousand_parameters_has_none() {
        let many = format!("https://e.com/?{}", vec!["a=1"; 10_001].join("&"));
        assert!(parsed(&many).query().is_empty());
        let most = format!("https://e.com/?{}", vec!["a=1"; 10_000].join("&"));
        assert_eq!(parsed(&most).query()[0].1.len(), 10_000);
    }
}
