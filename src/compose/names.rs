//! Names as Crossplane gives them: the XR's uid when it has none, composed
//! resource names derived from it, and the RFC 1123 check every composed
//! resource name must pass. Deterministic, so a render is reproducible and
//! matches what Crossplane would create.
use sha2::{Digest, Sha256};

/// Label naming the XR a resource belongs to (and the prefix of its
/// composed resources' names).
pub(crate) const COMPOSITE_LABEL: &str = "crossplane.io/composite";

/// The longest Kubernetes object name a child name may have.
const MAX_CHILD_NAME: usize = 63;
/// Hex characters of the hash that ends a child name.
const CHILD_HASH_LEN: usize = 12;
/// The longest DNS-1123 subdomain.
const MAX_SUBDOMAIN: usize = 253;

/// The uid Crossplane's renderer gives an XR that has none: a SHA-1
/// (version 5) UUID in the nil namespace of `<gvk>\0<namespace>\0<name>`,
/// where `<gvk>` is written as Go's `GroupVersionKind.String()` does
/// (`group/version, Kind=kind`).
pub(crate) fn xr_uid(api_version: &str, kind: &str, namespace: &str, name: &str) -> String {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = format!("{group}/{version}, Kind={kind}");
    let data = format!("{gvk}\0{namespace}\0{name}");
    uuid::Uuid::new_v5(&uuid::Uuid::nil(), data.as_bytes()).to_string()
}

/// The name of composed resource `resource_name` of the XR with `parent_uid`
/// and generate-name prefix `prefix`: the prefix (ending in one `-`,
/// truncated to fit 63 characters) and 12 hex characters of
/// `sha256(parent_uid + resource_name)`, as Crossplane names it.
pub(crate) fn child_name(prefix: &str, parent_uid: &str, resource_name: &str) -> String {
    let digest = Sha256::digest(format!("{parent_uid}{resource_name}"));
    let suffix = &hex::encode(digest)[..CHILD_HASH_LEN];
    let mut parent = prefix.to_string();
    if !parent.is_empty() && !parent.ends_with('-') {
        parent.push('-');
    }
    if parent.len() + CHILD_HASH_LEN <= MAX_CHILD_NAME {
        return parent + suffix;
    }
    // Prefixes are label values (ASCII); cut on a char boundary regardless.
    let mut keep = MAX_CHILD_NAME - CHILD_HASH_LEN;
    while !parent.is_char_boundary(keep) {
        keep -= 1;
    }
    let mut truncated = parent[..keep].to_string();
    if !truncated.ends_with('-') {
        truncated.pop();
        truncated.push('-');
    }
    truncated + suffix
}

/// Whether `name` is a valid RFC 1123 subdomain (what Kubernetes requires of
/// most object names): at most 253 characters, lowercase alphanumerics, `-`
/// and `.`, each dot-separated label starting and ending alphanumeric. RBAC
/// kinds may also hold `:`, as Crossplane allows.
pub(crate) fn valid_object_name(name: &str, api_version: &str, kind: &str) -> bool {
    let rbac = api_version.starts_with("rbac.authorization.k8s.io/")
        && matches!(
            kind,
            "Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding"
        );
    let name = if rbac {
        name.replace(':', "")
    } else {
        name.to_string()
    };
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !name.is_empty()
        && name.len() <= MAX_SUBDOMAIN
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.chars().all(|c| alnum(c) || c == '-')
                && label.starts_with(alnum)
                && label.ends_with(alnum)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    // The cases Crossplane's own tests of its child names use.
    #[test]
    fn child_names_are_crossplanes() {
        let uid = "75e4a668-035f-4ce8-8c45-f4d3ac850155";
        assert_eq!(
            child_name("cool-resource-", uid, "database"),
            "cool-resource-38ce86992a27"
        );
        assert_eq!(
            child_name("resource", uid, "database"),
            "resource-38ce86992a27"
        );
        assert_eq!(
            child_name(&"very-long-parent-name-".repeat(3), uid, "database"),
            "very-long-parent-name-very-long-parent-name-very-l-38ce86992a27"
        );
        assert_eq!(
            child_name(
                &"very-long-parent-name-without-ending-hyphen".repeat(2),
                uid,
                "database"
            ),
            "very-long-parent-name-without-ending-hyphenvery-lo-38ce86992a27"
        );
    }

    #[test]
    fn uids_are_version_5_and_stable() {
        let a = xr_uid("example.org/v1", "XBucket", "", "demo");
        assert_eq!(a, xr_uid("example.org/v1", "XBucket", "", "demo"));
        assert_ne!(a, xr_uid("example.org/v1", "XBucket", "team", "demo"));
        assert_eq!(&a[14..15], "5", "{a}");
    }

    #[test]
    fn names_must_be_rfc_1123_subdomains() {
        assert!(valid_object_name("demo-2fnzx", "v1", "ConfigMap"));
        assert!(valid_object_name("a.b-c", "v1", "ConfigMap"));
        for bad in [
            "",
            "Demo",
            "demo_",
            "-demo",
            "demo-",
            "a..b",
            &"a".repeat(254),
        ] {
            assert!(!valid_object_name(bad, "v1", "ConfigMap"), "{bad:?}");
        }
        assert!(!valid_object_name("system:x", "v1", "ConfigMap"));
        assert!(valid_object_name(
            "system:x",
            "rbac.authorization.k8s.io/v1",
            "ClusterRole"
        ));
    }
}
