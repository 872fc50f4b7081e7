//! Property tests of image references (proptest): any string is parsed or
//! refused without a panic, and a reference that parses is normalised to a
//! fixpoint whose parts are safe to name files and URLs by. Manifests and
//! configs are fuzzed where they are parsed (`src/image/pull/manifest.rs`).
//! `scripts/fuzz.sh` runs these with many more cases (`PROPTEST_CASES`).

use proptest::prelude::*;
use xfn::image::ImageReference;

/// Strings made of what references are made of, hostile parts often.
fn reference_like() -> impl Strategy<Value = String> {
    let part = prop_oneof![
        3 => "[a-z0-9]{1,8}",
        1 => "[A-Za-z0-9._-]{0,6}",
        1 => prop::sample::select(vec![
            "/", ":", "@", "..", ".", "//", "localhost", "127.0.0.1:5000", "docker.io",
            "index.docker.io", "sha256:", "latest", "[::1]:80", " ", "%2e%2e", "\u{0}",
        ]).prop_map(str::to_string),
        1 => "[0-9a-f]{64}",
    ];
    prop::collection::vec(part, 1..8).prop_map(|parts| parts.concat())
}

fn check(s: &str) -> Result<(), TestCaseError> {
    let Ok(parsed) = ImageReference::parse(s, "") else {
        return Ok(());
    };
    // Normalised once, it stays as it is.
    let normal = parsed.to_string();
    let again = ImageReference::parse(&normal, "")
        .map_err(|e| TestCaseError::fail(format!("{s:?} → {normal:?} does not parse: {e}")))?;
    prop_assert_eq!(&again.registry, &parsed.registry);
    prop_assert_eq!(&again.repository, &parsed.repository);
    prop_assert_eq!(&again.tag, &parsed.tag);
    prop_assert_eq!(&again.digest, &parsed.digest);
    prop_assert_eq!(again.to_string(), normal.clone());
    // Parts that become paths and URLs hold nothing that walks or splits.
    for part in parsed.repository.split('/') {
        prop_assert!(
            !part.is_empty() && part != "." && part != "..",
            "{:?}",
            normal
        );
    }
    prop_assert!(!normal.chars().any(char::is_whitespace), "{:?}", normal);
    if let Some(tag) = &parsed.tag {
        prop_assert!(!tag.contains('/') && !tag.contains(':'), "{:?}", normal);
    }
    if let Some(digest) = &parsed.digest {
        prop_assert!(
            !digest.contains('/') && !digest.contains(".."),
            "{:?}",
            normal
        );
    }
    let _ = parsed.to_oci();
    Ok(())
}

proptest! {
    #![proptest_config(xfn_testkit::fuzz::config(512))]

    #[test]
    fn reference_like_strings_parse_to_a_safe_fixpoint(s in reference_like()) {
        check(&s)?;
    }

    #[test]
    fn any_string_is_parsed_or_refused(s in any::<String>()) {
        check(&s)?;
    }
}
