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
pub fn host_platform() -> (&'static str, &'static str) {
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
        let entries = vec![
            entry("linux", "s390x", None, "sha256:a"),
            entry(os, arch, None, "sha256:b"),
        ];
        assert_eq!(choose_platform(&reference(), &entries).unwrap(), "sha256:b");
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
}
