//! Image references, parsed and normalised as Docker and Kubernetes do
//! (distribution/reference's grammar):
//!
//! ```text
//! [registry[:port]/]path[/path…][:tag][@algorithm:hex]
//! ```
//!
//! - The first path component is a registry when it contains `.` or `:`, is
//!   `localhost`, or has an upper-case letter; otherwise the default registry
//!   (`-r/--registry`, `index.docker.io` by default) is used.
//! - On Docker Hub a one-word repository gets `library/` (`busybox` →
//!   `docker.io/library/busybox`); every Hub alias is shown as `docker.io`.
//! - No tag and no digest means `:latest`. With a digest the digest decides
//!   (the tag is kept only for display), as in Kubernetes.

use std::fmt;
use std::net::IpAddr;

use crate::echo::Echo;

/// Registry names that all mean Docker Hub.
const DOCKER_HUB_ALIASES: &[&str] = &["docker.io", "index.docker.io", "registry-1.docker.io"];
/// How Docker Hub is named in normalised references.
const DOCKER_HUB: &str = "docker.io";
/// Longest repository path Distribution accepts.
const MAX_NAME_LEN: usize = 255;
/// Longest tag Distribution accepts.
const MAX_TAG_LEN: usize = 128;
/// Longest reference read at all: a registry host (253) and port, a
/// repository (255), a tag (128) and a digest (71) fit with room to spare.
const MAX_REFERENCE_LEN: usize = 1024;

/// Why a reference is not valid.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReferenceError {
    /// The reference is empty.
    #[error("invalid image reference: empty")]
    Empty,
    /// Some part does not follow the reference grammar.
    #[error("invalid image reference {:?}: {reason}", Echo(.reference))]
    Invalid {
        /// The reference as given.
        reference: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// A parsed, normalised image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageReference {
    /// The full reference as given.
    pub original: String,
    /// Registry host (and port), normalised (`docker.io` for Docker Hub).
    pub registry: String,
    /// Repository path (`library/busybox`, `team/fn`).
    pub repository: String,
    /// The tag, `latest` when neither tag nor digest was given.
    pub tag: Option<String>,
    /// `sha256:<hex>` when pinned by digest.
    pub digest: Option<String>,
}

impl ImageReference {
    /// Parses `reference`; names without a registry get `default_registry`
    /// (empty means Docker Hub).
    pub fn parse(reference: &str, default_registry: &str) -> Result<Self, ReferenceError> {
        let invalid = |reason: &str| ReferenceError::Invalid {
            reference: reference.to_string(),
            reason: reason.to_string(),
        };
        if reference.is_empty() {
            return Err(ReferenceError::Empty);
        }
        if reference.len() > MAX_REFERENCE_LEN {
            return Err(invalid("longer than 1024 bytes"));
        }
        if reference.trim() != reference || reference.chars().any(char::is_whitespace) {
            return Err(invalid("contains whitespace"));
        }

        let (rest, digest) = match reference.split_once('@') {
            Some((rest, digest)) => {
                validate_digest(digest).map_err(|r| invalid(&r))?;
                (rest, Some(digest.to_string()))
            }
            None => (reference, None),
        };

        // A `:` after the last `/` starts the tag; an earlier one is a port.
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].find(':') {
            Some(i) => {
                let at = last_slash + i;
                let tag = &rest[at + 1..];
                validate_tag(tag).map_err(|r| invalid(&r))?;
                (&rest[..at], Some(tag.to_string()))
            }
            None => (rest, None),
        };
        if name.is_empty() {
            return Err(invalid("no repository name"));
        }

        let (registry, path) = match name.split_once('/') {
            Some((first, path)) if looks_like_registry(first) => (first.to_string(), path),
            _ => {
                let default = if default_registry.is_empty() {
                    DOCKER_HUB
                } else {
                    default_registry
                };
                (default.to_string(), name)
            }
        };
        validate_registry(&registry).map_err(|r| invalid(&r))?;
        let registry = if is_docker_hub(&registry) {
            DOCKER_HUB.to_string()
        } else {
            registry
        };
        validate_path(path).map_err(|r| invalid(&r))?;
        let repository = if registry == DOCKER_HUB && !path.contains('/') {
            format!("library/{path}")
        } else {
            path.to_string()
        };
        if repository.len() > MAX_NAME_LEN {
            return Err(invalid("repository name longer than 255 characters"));
        }
        let tag = match (&tag, &digest) {
            (None, None) => Some("latest".to_string()),
            _ => tag,
        };
        Ok(ImageReference {
            original: reference.to_string(),
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// The registry host to connect to (Docker Hub's API host for `docker.io`).
    pub fn registry_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            "index.docker.io"
        } else {
            &self.registry
        }
    }

    /// Whether the registry is on a loopback address (`127.0.0.0/8`,
    /// `localhost`, `[::1]`): those are reached over plain HTTP.
    pub fn is_loopback(&self) -> bool {
        is_loopback_registry(&self.registry)
    }

    /// `registry/repository`, without tag or digest.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// The reference oci-client speaks.
    pub fn to_oci(&self) -> oci_client::Reference {
        let registry = self.registry_host().to_string();
        let repository = self.repository.clone();
        match (&self.tag, &self.digest) {
            (_, Some(digest)) => {
                oci_client::Reference::with_digest(registry, repository, digest.clone())
            }
            (Some(tag), None) => oci_client::Reference::with_tag(registry, repository, tag.clone()),
            (None, None) => {
                oci_client::Reference::with_tag(registry, repository, "latest".to_string())
            }
        }
    }

    /// The same repository pinned to `digest` (for fetching a platform
    /// manifest out of an index).
    pub fn with_digest(&self, digest: &str) -> oci_client::Reference {
        oci_client::Reference::with_digest(
            self.registry_host().to_string(),
            self.repository.clone(),
            digest.to_string(),
        )
    }
}

impl fmt::Display for ImageReference {
    /// The normalised form, e.g. `docker.io/library/busybox:latest`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// Whether `registry` (`host[:port]`) is a loopback address.
pub(crate) fn is_loopback_registry(registry: &str) -> bool {
    let host = host_of(registry);
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The host part of `host[:port]` or `[v6]:port`.
pub(crate) fn host_of(registry: &str) -> &str {
    if registry.starts_with('[') {
        return match registry.find(']') {
            Some(end) => &registry[..=end],
            None => registry,
        };
    }
    match registry.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => registry,
    }
}

/// Whether `registry` names Docker Hub.
pub(crate) fn is_docker_hub(registry: &str) -> bool {
    DOCKER_HUB_ALIASES
        .iter()
        .any(|alias| registry.eq_ignore_ascii_case(alias))
}

fn looks_like_registry(first: &str) -> bool {
    first.contains('.')
        || first.contains(':')
        || first == "localhost"
        || first.chars().any(|c| c.is_ascii_uppercase())
}

fn validate_registry(registry: &str) -> Result<(), String> {
    let bad = || format!("invalid registry {:?}", Echo(registry));
    if registry.starts_with('[') {
        let end = registry.find(']').ok_or_else(bad)?;
        registry[1..end]
            .parse::<std::net::Ipv6Addr>()
            .map_err(|_| bad())?;
        let rest = &registry[end + 1..];
        return match rest.strip_prefix(':') {
            Some(port) => validate_port(port).ok_or_else(bad),
            None if rest.is_empty() => Ok(()),
            None => Err(bad()),
        };
    }
    let (host, port) = match registry.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (registry, None),
    };
    if let Some(port) = port {
        validate_port(port).ok_or_else(bad)?;
    }
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if host.is_empty() || !host.split('.').all(label_ok) {
        return Err(bad());
    }
    Ok(())
}

fn validate_port(port: &str) -> Option<()> {
    (!port.is_empty() && port.chars().all(|c| c.is_ascii_digit()) && port.parse::<u16>().is_ok())
        .then_some(())
}

/// Each component: `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`.
fn validate_path(path: &str) -> Result<(), String> {
    for component in path.split('/') {
        if !valid_component(component) {
            return Err(format!(
                "invalid repository path component {:?} \
                 (lower-case letters, digits and single separators . _ __ - only)",
                Echo(component)
            ));
        }
    }
    Ok(())
}

fn valid_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        // A separator run: ".", "_", "__" or "-+", followed by an alnum.
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let sep = &component[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.chars().all(|c| c == '-');
        if !ok {
            return false;
        }
    }
    true
}

/// `[\w][\w.-]{0,127}`.
fn validate_tag(tag: &str) -> Result<(), String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut chars = tag.chars();
    let ok = tag.len() <= MAX_TAG_LEN
        && chars.next().is_some_and(word)
        && chars.all(|c| word(c) || c == '.' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid tag {:?} (letters, digits, _ . - ; at most 128; not starting with . or -)",
            Echo(tag)
        ))
    }
}

/// `sha256:<64 lower-case hex>` (the only algorithm registries serve).
fn validate_digest(digest: &str) -> Result<(), String> {
    let (algorithm, hex) = digest.split_once(':').ok_or_else(|| {
        format!(
            "invalid digest {:?} (want sha256:<64 hex digits>)",
            Echo(digest)
        )
    })?;
    if algorithm != "sha256" {
        return Err(format!(
            "unsupported digest algorithm {:?} (only sha256)",
            Echo(algorithm)
        ));
    }
    if hex.len() != 64 || !hex.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')) {
        return Err(format!(
            "invalid digest {:?} (want sha256:<64 lower-case hex digits>)",
            Echo(digest)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn parse(s: &str) -> ImageReference {
        ImageReference::parse(s, "index.docker.io").unwrap()
    }

    #[test]
    fn one_word_names_are_docker_hub_library_latest() {
        let r = parse("busybox");
        assert_eq!(r.registry, "docker.io");
        assert_eq!(r.repository, "library/busybox");
        assert_eq!(r.tag.as_deref(), Some("latest"));
        assert_eq!(r.digest, None);
        assert_eq!(r.to_string(), "docker.io/library/busybox:latest");
        assert_eq!(r.registry_host(), "index.docker.io");
    }

    #[test]
    fn two_word_hub_names_keep_their_path() {
        let r = parse("crossplane/function-patch:v1.2.3");
        assert_eq!(r.registry, "docker.io");
        assert_eq!(r.repository, "crossplane/function-patch");
        assert_eq!(r.tag.as_deref(), Some("v1.2.3"));
    }

    #[test]
    fn hub_aliases_normalise() {
        for name in [
            "docker.io/busybox",
            "index.docker.io/busybox",
            "registry-1.docker.io/library/busybox",
        ] {
            assert_eq!(parse(name).to_string(), "docker.io/library/busybox:latest");
        }
    }

    #[test]
    fn registry_with_port_tag_and_digest() {
        let r = parse(&format!("127.0.0.1:5000/team/fn:v1@sha256:{HEX}"));
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "team/fn");
        assert_eq!(r.tag.as_deref(), Some("v1"));
        assert_eq!(r.digest, Some(format!("sha256:{HEX}")));
        assert!(r.is_loopback());
        assert_eq!(r.to_oci().digest(), Some(format!("sha256:{HEX}").as_str()));
    }

    #[test]
    fn digest_only_has_no_tag() {
        let r = parse(&format!("ghcr.io/o/fn@sha256:{HEX}"));
        assert_eq!(r.tag, None);
        assert_eq!(r.registry, "ghcr.io");
        assert!(!r.is_loopback());
    }

    #[test]
    fn default_registry_applies_to_names_without_one() {
        let r = ImageReference::parse("fn:v1", "127.0.0.1:5000").unwrap();
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "fn");
        let r = ImageReference::parse("team/fn", "registry.example.com").unwrap();
        assert_eq!(r.to_string(), "registry.example.com/team/fn:latest");
    }

    #[test]
    fn localhost_and_uppercase_first_components_are_registries() {
        assert_eq!(parse("localhost/fn").registry, "localhost");
        assert_eq!(parse("localhost:5000/fn").registry, "localhost:5000");
        assert_eq!(parse("Myhost/fn").registry, "Myhost");
        assert_eq!(parse("[::1]:5000/fn:v1").registry, "[::1]:5000");
        assert!(parse("[::1]:5000/fn:v1").is_loopback());
        assert!(parse("localhost:5000/fn").is_loopback());
        assert!(parse("127.1.2.3/fn").is_loopback());
    }

    #[test]
    fn invalid_references_are_rejected_with_a_reason() {
        let cases = [
            "",
            "fn/UPPER",
            "fn:",
            "fn:-bad",
            "fn@sha256:abc",
            "fn@md5:0123",
            &format!("fn@sha256:{}", HEX.to_uppercase()),
            "a//b",
            "fn::v1",
            "has space",
            "fn_-x",
            "-fn",
            "host:notaport/fn",
            "/fn",
            "fn/",
            &format!("fn:{}", "t".repeat(129)),
        ];
        for case in cases {
            let err = ImageReference::parse(case, "index.docker.io")
                .expect_err(&format!("{case:?} should be invalid"));
            let msg = err.to_string();
            assert!(msg.contains("invalid image reference"), "{case:?}: {msg}");
        }
    }

    #[test]
    fn separators_in_components() {
        assert_eq!(parse("x/a.b_c__d-e---f").repository, "x/a.b_c__d-e---f");
        // A first component with a dot is a registry, and `_` is no host character.
        assert!(ImageReference::parse("a.b_c/x", "").is_err());
        assert!(ImageReference::parse("a..b", "").is_err());
        assert!(ImageReference::parse("a___b", "").is_err());
    }

    #[test]
    fn host_of_strips_ports() {
        assert_eq!(host_of("127.0.0.1:5000"), "127.0.0.1");
        assert_eq!(host_of("[::1]:5000"), "[::1]");
        assert_eq!(host_of("example.com"), "example.com");
    }
}
