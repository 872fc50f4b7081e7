//! `xfn wrap`: builds an adaptor image without Docker. The base image (one
//! holding xfn and crun) plus two layers: `package.yaml` (Crossplane package
//! metadata, in the layer annotated `io.crossplane.xpkg: base`, where
//! Crossplane's package manager looks) and `/function.tar` (the function
//! image as `docker save` wrote it); the config's entrypoint runs
//! `xfn adapt --image-tarball /function.tar`. The result is an OCI image
//! manifest, pushed to a registry or written as an OCI layout in a tar.
use std::io::Write;
use std::path::{Path, PathBuf};

use flate2::write::GzEncoder;
use serde_json::{json, Value};

use crate::image::pull::{sha256_digest, ConnectOptions, PullError, Puller};
use crate::image::reference::{ImageReference, ReferenceError};
use crate::image::RegistryAuth;

/// Where the function tarball goes in the image.
pub const FUNCTION_PATH: &str = "/function.tar";
/// The layer annotation Crossplane's package manager looks for.
pub const XPKG_ANNOTATION: &str = "io.crossplane.xpkg";

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// Errors of wrapping.
#[derive(Debug, thiserror::Error)]
pub enum WrapError {
    /// A reference does not parse.
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    /// Getting the base image failed.
    #[error("base image: {0}")]
    Pull(#[from] PullError),
    /// The base image's manifest or config is not what an image holds.
    #[error("base image {image}: {reason}")]
    BadBase {
        /// The base reference.
        image: String,
        /// What is wrong.
        reason: String,
    },
    /// Local I/O.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Pushing failed.
    #[error("cannot push {image}: {reason}")]
    Push {
        /// The target reference.
        image: String,
        /// The registry's answer.
        reason: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> WrapError + '_ {
    move |source| WrapError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What to build.
#[derive(Debug, Clone)]
pub struct WrapSpec {
    /// The function image tarball (`docker save` output).
    pub function: PathBuf,
    /// The base image reference.
    pub base: String,
    /// The reference the result is pushed as / named in the layout.
    pub tag: String,
    /// `metadata.name` of the package.
    pub name: String,
    /// `metadata.annotations` of the package.
    pub annotations: Vec<(String, String)>,
    /// Registry credentials (base and target).
    pub auth: RegistryAuth,
    /// Registry connection settings.
    pub connect: ConnectOptions,
    /// Registry for references that name none.
    pub default_registry: String,
}

/// Where the result goes.
#[derive(Debug, Clone)]
pub enum WrapOutput {
    /// Pushed as `WrapSpec::tag`.
    Push,
    /// An OCI image layout in a tar file.
    LayoutTarball(PathBuf),
}

/// A blob of the result: bytes in memory or a downloaded file.
enum Blob {
    Memory(Vec<u8>),
    File(PathBuf),
}

impl Blob {
    fn bytes(&self) -> Result<Vec<u8>, WrapError> {
        match self {
            Blob::Memory(bytes) => Ok(bytes.clone()),
            Blob::File(path) => std::fs::read(path).map_err(io_err(path)),
        }
    }
}

/// A gzipped layer and its uncompressed digest.
struct Layer {
    gzipped: Vec<u8>,
    diff_id: String,
}

/// A deterministic gzipped tar of `files` (path, mode, bytes).
fn layer(files: &[(&str, u32, &[u8])]) -> Result<Layer, std::io::Error> {
    let mut tar = tar::Builder::new(Vec::new());
    for (path, mode, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(*mode);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, path.trim_start_matches('/'), *data)?;
    }
    let plain = tar.into_inner()?;
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&plain)?;
    Ok(Layer {
        gzipped: gz.finish()?,
        diff_id: sha256_digest(&plain),
    })
}

/// The `package.yaml` of a Function package.
pub fn package_yaml(name: &str, annotations: &[(String, String)]) -> String {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let package = json!({
        "apiVersion": "meta.pkg.crossplane.io/v1beta1",
        "kind": "Function",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {},
    });
    // A JSON value always serialises as YAML.
    yaml_serde::to_string(&package).unwrap_or_default()
}

/// The OCI media type of a base layer (Docker names mapped to OCI ones, so
/// the result is one consistent OCI manifest that may carry annotations).
fn oci_layer_type(media_type: &str) -> String {
    match media_type {
        "application/vnd.docker.image.rootfs.diff.tar.gzip" => OCI_LAYER_GZIP.to_string(),
        "application/vnd.docker.image.rootfs.diff.tar" => {
            "application/vnd.oci.image.layer.v1.tar".to_string()
        }
        other => other.to_string(),
    }
}

/// Builds the image and pushes it or writes it; returns the manifest digest.
pub async fn wrap(spec: &WrapSpec, output: &WrapOutput) -> Result<String, WrapError> {
    let base = ImageReference::parse(&spec.base, &spec.default_registry)?;
    let bad = |reason: String| WrapError::BadBase {
        image: spec.base.clone(),
        reason,
    };
    let puller = Puller::new(&base, &spec.auth, &spec.connect)?;
    let resolved = puller.resolve(&base).await?;
    let config_bytes = puller
        .fetch_config(&base, &resolved.manifest.config)
        .await?;
    let work = tempfile::tempdir().map_err(io_err(Path::new("temp dir")))?;
    let mut blobs: Vec<(String, Blob)> = Vec::new();
    let mut layers: Vec<Value> = Vec::new();
    for blob in &resolved.manifest.layers {
        let path = work.path().join(blob.digest.replace(':', "-"));
        puller
            .fetch_blob_to_file(&base, blob, &path, &|_| {}, &|| false, None)
            .await?;
        blobs.push((blob.digest.clone(), Blob::File(path)));
        layers.push(json!({
            "mediaType": oci_layer_type(&blob.media_type),
            "digest": blob.digest,
            "size": blob.size,
        }));
    }

    let function = std::fs::read(&spec.function).map_err(io_err(&spec.function))?;
    let package = package_yaml(&spec.name, &spec.annotations);
    let package_layer = layer(&[("/package.yaml", 0o644, package.as_bytes())])
        .map_err(io_err(Path::new("package layer")))?;
    let function_layer =
        layer(&[(FUNCTION_PATH, 0o644, &function)]).map_err(io_err(&spec.function))?;

    let mut config: Value = serde_json::from_slice(&config_bytes)
        .map_err(|e| bad(format!("config does not parse: {e}")))?;
    let container = config
        .as_object_mut()
        .ok_or_else(|| bad("config is not an object".into()))?
        .entry("config")
        .or_insert_with(|| json!({}));
    let container = container
        .as_object_mut()
        .ok_or_else(|| bad("config.config is not an object".into()))?;
    container.insert(
        "Entrypoint".into(),
        json!(["xfn", "adapt", "--image-tarball", FUNCTION_PATH]),
    );
    container.remove("Cmd");
    let diff_ids = config
        .pointer_mut("/rootfs/diff_ids")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| bad("config has no rootfs.diff_ids".into()))?;
    diff_ids.push(json!(package_layer.diff_id));
    diff_ids.push(json!(function_layer.diff_id));
    if let Some(history) = config.get_mut("history").and_then(Value::as_array_mut) {
        history.push(json!({"created_by": "xfn wrap: package.yaml"}));
        history.push(json!({"created_by": format!("xfn wrap: {FUNCTION_PATH}")}));
    }
    let config = serde_json::to_vec(&config).map_err(|e| bad(e.to_string()))?;
    let config_digest = sha256_digest(&config);

    for (new_layer, annotations) in [
        (&package_layer, Some(json!({XPKG_ANNOTATION: "base"}))),
        (&function_layer, None),
    ] {
        let digest = sha256_digest(&new_layer.gzipped);
        let mut descriptor = json!({
            "mediaType": OCI_LAYER_GZIP,
            "digest": digest,
            "size": new_layer.gzipped.len(),
        });
        if let Some(annotations) = annotations {
            descriptor["annotations"] = annotations;
        }
        layers.push(descriptor);
        blobs.push((digest, Blob::Memory(new_layer.gzipped.clone())));
    }
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": config.len()},
        "layers": layers,
    }))
    .map_err(|e| bad(e.to_string()))?;
    blobs.push((config_digest, Blob::Memory(config)));
    let manifest_digest = sha256_digest(&manifest);

    match output {
        WrapOutput::Push => push(spec, &blobs, manifest).await?,
        WrapOutput::LayoutTarball(path) => {
            write_layout_tar(path, &spec.tag, &blobs, &manifest, &manifest_digest)?
        }
    }
    Ok(manifest_digest)
}

async fn push(
    spec: &WrapSpec,
    blobs: &[(String, Blob)],
    manifest: Vec<u8>,
) -> Result<(), WrapError> {
    let target = ImageReference::parse(&spec.tag, &spec.default_registry)?;
    let err = |e: oci_client::errors::OciDistributionError| WrapError::Push {
        image: spec.tag.clone(),
        reason: e.to_string(),
    };
    // The pull's client: same insecure registries, CAs and timeouts.
    let client = spec.connect.oci_client(&target)?;
    let reference = target.to_oci();
    let auth = spec.auth.to_oci().map_err(|e| WrapError::Push {
        image: spec.tag.clone(),
        reason: e.to_string(),
    })?;
    client
        .auth(&reference, &auth, oci_client::RegistryOperation::Push)
        .await
        .map_err(err)?;
    for (digest, blob) in blobs {
        client
            .push_blob(&reference, blob.bytes()?, digest)
            .await
            .map_err(err)?;
    }
    client
        .push_manifest_raw(
            &reference,
            manifest,
            tonic::codegen::http::HeaderValue::from_static(OCI_MANIFEST),
        )
        .await
        .map_err(err)?;
    Ok(())
}

fn write_layout_tar(
    path: &Path,
    tag: &str,
    blobs: &[(String, Blob)],
    manifest: &[u8],
    manifest_digest: &str,
) -> Result<(), WrapError> {
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": OCI_MANIFEST,
            "digest": manifest_digest,
            "size": manifest.len(),
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }],
    }))
    .map_err(|e| io_err(path)(std::io::Error::other(e)))?;
    let file = std::fs::File::create(path).map_err(io_err(path))?;
    let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
    let mut add = |name: &str, data: &[u8]| -> Result<(), WrapError> {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, name, data)
            .map_err(io_err(path))
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    add("index.json", &index)?;
    let hex = |digest: &str| digest.trim_start_matches("sha256:").to_string();
    add(&format!("blobs/sha256/{}", hex(manifest_digest)), manifest)?;
    for (digest, blob) in blobs {
        add(&format!("blobs/sha256/{}", hex(digest)), &blob.bytes()?)?;
    }
    tar.into_inner()
        .and_then(|mut w| w.flush())
        .map_err(io_err(path))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_yaml_is_a_function_package() {
        let yaml = package_yaml("fn-x", &[("a/b".into(), "c".into())]);
        let value: yaml_serde::Value = yaml_serde::from_str(&yaml).unwrap();
        assert_eq!(value["apiVersion"], "meta.pkg.crossplane.io/v1beta1");
        assert_eq!(value["kind"], "Function");
        assert_eq!(value["metadata"]["name"], "fn-x");
        assert_eq!(value["metadata"]["annotations"]["a/b"], "c");
    }

    #[test]
    fn layers_are_deterministic() {
        let a = layer(&[("/x", 0o644, b"data")]).unwrap();
        let b = layer(&[("/x", 0o644, b"data")]).unwrap();
        assert_eq!(a.diff_id, b.diff_id);
        assert_eq!(a.gzipped, b.gzipped);
    }
}
