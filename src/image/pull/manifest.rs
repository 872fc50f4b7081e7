//! Manifests and indexes as registries serve them (OCI and Docker schema 2),
//! parsed leniently into what the store needs, and choosing the host's
//! image from an index.
use oci_client::manifest::{IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE};
use serde::Deserialize;

use super::PullError;
use crate::image::descriptor::{is_sha256_digest, BlobRef, Manifest};
use crate::image::reference::ImageReference;

#[derive(Debug, Deserialize)]
pub(super) struct RawManifest {
    #[serde(rename = "schemaVersion", default)]
    schema_version: u32,
    #[serde(rename = "mediaType", default)]
    media_type: Option<String>,
    config: Option<BlobRef>,
    layers: Option<Vec<BlobRef>>,
    pub(super) manifests: Option<Vec<IndexEntry>>,
}

#[derive(Debug, Deserialize)]
pub(super) struct IndexEntry {
    digest: String,
    #[serde(rename = "mediaType", default)]
    media_type: String,
    platform: Option<Platform>,
}

#[derive(Debug, Deserialize)]
pub(super) struct Platform {
    os: String,
    architecture: String,
    #[serde(default)]
    variant: Option<String>,
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// The host platform in OCI terms: (`linux`, `amd64`).
pub(super) fn host_platform() -> (&'static str, &'static str) {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    };
    (std::env::consts::OS, arch)
}

pub(super) fn bad(reference: &ImageReference, reason: &str) -> PullError {
    PullError::BadManifest {
        reference: reference.to_string(),
        reason: reason.to_string(),
    }
}

pub(super) fn parse_raw(
    reference: &ImageReference,
    bytes: &[u8],
) -> Result<RawManifest, PullError> {
    let raw: RawManifest = serde_json::from_slice(bytes)
        .map_err(|e| bad(reference, &format!("not a manifest: {e}")))?;
    if raw.schema_version != 2 {
        return Err(bad(
            reference,
            &format!(
                "schema version {} (only Docker schema 2 and OCI are supported)",
                raw.schema_version
            ),
        ));
    }
    Ok(raw)
}

pub(super) fn to_manifest(
    reference: &ImageReference,
    raw: RawManifest,
) -> Result<Manifest, PullError> {
    if let Some(mt) = &raw.media_type {
        if mt != OCI_IMAGE_MEDIA_TYPE && mt != IMAGE_MANIFEST_MEDIA_TYPE {
            return Err(bad(reference, &format!("media type {mt}")));
        }
    }
    let config = raw
        .config
        .ok_or_else(|| bad(reference, "no config descriptor"))?;
    let layers = raw.layers.unwrap_or_default();
    for blob in std::iter::once(&config).chain(&layers) {
        if !is_sha256_digest(&blob.digest) {
            return Err(bad(reference, &format!("bad digest {:?}", blob.digest)));
        }
    }
    Ok(Manifest { config, layers })
}

/// Picks the host's image from an index: same os and architecture; on arm
/// the variant too when the index names one (`v8` for arm64 is implied).
pub(super) fn choose_platform(
    reference: &ImageReference,
    entries: &[IndexEntry],
) -> Result<String, PullError> {
    let (os, arch) = host_platform();
    let matches = |p: &Platform| p.os == os && p.architecture == arch;
    let candidates: Vec<&IndexEntry> = entries
        .iter()
        .filter(|e| e.platform.as_ref().is_some_and(matches))
        .filter(|e| e.media_type != "application/vnd.in-toto+json")
        .collect();
    // Prefer an entry without a variant or the default one for the arch.
    let best = candidates
        .iter()
        .find(|e| {
            e.platform.as_ref().is_some_and(|p| {
                p.variant.is_none() || (arch == "arm64" && p.variant.as_deref() == Some("v8"))
            })
        })
        .or_else(|| candidates.first());
    match best {
        // The digest goes into a URL and names a file: only a well-formed
        // one is followed.
        Some(entry) if !is_sha256_digest(&entry.digest) => Err(bad(
            reference,
            &format!(
                "bad digest {:?} in the index",
                super::super::extract::quote(entry.digest.as_bytes())
            ),
        )),
        Some(entry) => Ok(entry.digest.clone()),
        None => {
            let available: Vec<String> = entries
                .iter()
                .map(|e| match &e.platform {
                    Some(p) => p.to_string(),
                    None => format!("(no platform) {}", e.digest),
                })
                .collect();
            Err(PullError::NoMatchingPlatform {
                reference: reference.to_string(),
                wanted: format!("{os}/{arch}"),
                available: if available.is_empty() {
                    "nothing".to_string()
                } else {
                    available.join(", ")
                },
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::ImageErrorKind;

    fn reference() -> ImageReference {
        ImageReference::parse("127.0.0.1:5000/fn:v1", "").unwrap()
    }

    fn entry(os: &str, arch: &str, variant: Option<&str>, digest: &str) -> IndexEntry {
        IndexEntry {
            digest: digest.to_string(),
            media_type: OCI_IMAGE_MEDIA_TYPE.to_string(),
            platform: Some(Platform {
                os: os.into(),
                architecture: arch.into(),
                variant: variant.map(Into::into),
            }),
        }
    }

    #[test]
    fn chooses_the_host_platform() {
        let (os, arch) = host_platform();
        let (a, b) = (
            format!("sha256:{}", "a".repeat(64)),
            format!("sha256:{}", "b".repeat(64)),
        );
        let entries = vec![entry("linux", "s390x", None, &a), entry(os, arch, None, &b)];
        assert_eq!(choose_platform(&reference(), &entries).unwrap(), b);
        // A malformed digest is never followed (it would go into a URL).
        let entries = vec![entry(os, arch, None, "sha256:../../x")];
        let err = choose_platform(&reference(), &entries).unwrap_err();
        assert_eq!(err.kind(), ImageErrorKind::Corrupt, "{err}");
    }

    #[test]
    fn no_matching_platform_lists_what_is_offered() {
        let entries = vec![
            entry("linux", "s390x", None, "sha256:a"),
            entry("windows", "riscv", Some("x"), "sha256:b"),
        ];
        let err = choose_platform(&reference(), &entries).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("linux/s390x"), "{msg}");
        assert!(msg.contains("windows/riscv/x"), "{msg}");
        assert_eq!(err.kind(), ImageErrorKind::NotFound);
    }

    #[test]
    fn docker_and_oci_manifests_parse() {
        let docker = br#"{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json",
          "config":{"mediaType":"application/vnd.docker.container.image.v1+json","size":1,"digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000"},
          "layers":[{"mediaType":"application/vnd.docker.image.rootfs.diff.tar.gzip","size":2,"digest":"sha256:1111111111111111111111111111111111111111111111111111111111111111"}]}"#;
        let raw = parse_raw(&reference(), docker).unwrap();
        let m = to_manifest(&reference(), raw).unwrap();
        assert_eq!(m.layers.len(), 1);
        assert_eq!(m.layers[0].size, 2);
        let v1 = br#"{"schemaVersion":1,"name":"x"}"#;
        assert!(parse_raw(&reference(), v1).is_err());
        let traversal =
            br#"{"schemaVersion":2,"config":{"size":1,"digest":"sha256:../../etc"},"layers":[]}"#;
        let raw = parse_raw(&reference(), traversal).unwrap();
        assert!(to_manifest(&reference(), raw).is_err());
    }

    /// Property tests (proptest): whatever a registry serves as a manifest,
    /// index or config, parsing never panics, and what parses names its blobs
    /// only by well-formed digests (they become file names and URLs).
    /// `scripts/fuzz.sh` runs them with many more cases (`PROPTEST_CASES`).
    mod fuzz {
        use super::*;
        use proptest::prelude::*;
        use serde_json::{json, Value};

        fn config(quick: u32) -> ProptestConfig {
            let mut config = ProptestConfig::default();
            if std::env::var_os("PROPTEST_CASES").is_none() {
                config.cases = quick;
            }
            config.failure_persistence = None;
            config
        }

        fn reference() -> ImageReference {
            ImageReference::parse("127.0.0.1:5000/fn:v1", "").unwrap()
        }

        fn digest() -> impl Strategy<Value = String> {
            prop_oneof![
                3 => "sha256:[0-9a-f]{64}",
                1 => "sha256:[0-9a-fA-F./]{0,70}",
                1 => ".{0,20}",
                1 => Just("sha256:../../../etc/passwd".to_string()),
            ]
        }

        fn media_type() -> impl Strategy<Value = Value> {
            prop_oneof![
                Just(json!(OCI_IMAGE_MEDIA_TYPE)),
                Just(json!(IMAGE_MANIFEST_MEDIA_TYPE)),
                Just(json!("application/vnd.oci.image.index.v1+json")),
                Just(json!("application/vnd.in-toto+json")),
                ".{0,12}".prop_map(Value::from),
                Just(Value::Null),
                any::<i64>().prop_map(Value::from),
            ]
        }

        fn descriptor() -> impl Strategy<Value = Value> {
            (media_type(), digest(), prop_oneof![any::<u64>().prop_map(Value::from), any::<i64>().prop_map(Value::from), Just(json!("1"))])
                .prop_map(|(media_type, digest, size)| json!({"mediaType": media_type, "digest": digest, "size": size}))
        }

        fn platform() -> impl Strategy<Value = Value> {
            let (os, arch) = host_platform();
            prop_oneof![
                Just(json!({"os": os, "architecture": arch})),
                Just(json!({"os": os, "architecture": arch, "variant": "v8"})),
                ("[a-z]{0,6}", "[a-z0-9]{0,6}")
                    .prop_map(|(o, a)| json!({"os": o, "architecture": a})),
                Just(Value::Null),
                Just(json!("linux/amd64")),
            ]
        }

        fn index_entry() -> impl Strategy<Value = Value> {
            (media_type(), digest(), platform()).prop_map(
                |(media_type, digest, platform)| json!({"mediaType": media_type, "digest": digest, "platform": platform}),
            )
        }

        fn document() -> impl Strategy<Value = Value> {
            (
                prop_oneof![
                    Just(json!(2)),
                    any::<i64>().prop_map(Value::from),
                    Just(json!("2"))
                ],
                media_type(),
                proptest::option::of(descriptor()),
                proptest::option::of(prop::collection::vec(descriptor(), 0..4)),
                proptest::option::of(prop::collection::vec(index_entry(), 0..4)),
            )
                .prop_map(|(schema, media_type, config, layers, manifests)| {
                    let mut doc = json!({"schemaVersion": schema, "mediaType": media_type});
                    if let Some(c) = config {
                        doc["config"] = c;
                    }
                    if let Some(l) = layers {
                        doc["layers"] = Value::from(l);
                    }
                    if let Some(m) = manifests {
                        doc["manifests"] = Value::from(m);
                    }
                    doc
                })
        }

        /// What the puller does with a manifest's bytes, checked.
        fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
            let Ok(raw) = parse_raw(&reference(), bytes) else {
                return Ok(());
            };
            match raw.manifests {
                Some(ref entries) => {
                    if let Ok(chosen) = choose_platform(&reference(), entries) {
                        prop_assert!(
                            is_sha256_digest(&chosen),
                            "index entry {:?} followed",
                            chosen
                        );
                    }
                }
                None => {
                    if let Ok(manifest) = to_manifest(&reference(), raw) {
                        for blob in std::iter::once(&manifest.config).chain(&manifest.layers) {
                            prop_assert!(
                                is_sha256_digest(&blob.digest),
                                "blob {:?} accepted",
                                blob.digest
                            );
                        }
                    }
                }
            }
            Ok(())
        }

        proptest! {
            #![proptest_config(config(256))]

            #[test]
            fn manifests_and_indexes_name_blobs_only_by_well_formed_digests(doc in document()) {
                check(&serde_json::to_vec(&doc).unwrap())?;
            }

            #[test]
            fn arbitrary_bytes_are_parsed_or_refused(bytes in prop::collection::vec(any::<u8>(), 0..1024)) {
                check(&bytes)?;
            }

            #[test]
            fn arbitrary_configs_are_parsed_or_refused(bytes in prop::collection::vec(any::<u8>(), 0..1024), doc in document()) {
                let _ = serde_json::from_slice::<oci_spec::image::ImageConfiguration>(&bytes);
                let config = json!({"architecture": "amd64", "os": "linux", "config": doc.clone(), "rootfs": {"type": "layers", "diff_ids": doc["layers"].clone()}});
                let _ = serde_json::from_slice::<oci_spec::image::ImageConfiguration>(&serde_json::to_vec(&config).unwrap());
            }
        }
    }
}
