//! `xfn wrap`: builds an adaptor image without Docker. The base image (one
//! holding xfn and crun) plus two layers: `package.yaml` (Crossplane package
//! metadata, in the layer annotated `io.crossplane.xpkg: base`, where
//! Crossplane's package manager looks) and `/function.tar` (the function
//! image as `docker save` wrote it); the config's entrypoint runs
//! `xfn adapt --image-tarball /function.tar`. The result is an OCI image
//! manifest, pushed to a registry or written as an OCI layout in a tar.
//!
//! Nothing is pushed before everything is checked: the function tarball is
//! one `xfn adapt --image-tarball` loads (a `docker save` archive of one
//! image, or an OCI layout in a tar, its config and layers all there), the
//! base holds `xfn` and `crun` on its `PATH`, and the package metadata (a
//! user's `crossplane.yaml`, or the one made from the flags) is a Function
//! package's. Without these checks any file became `/function.tar` and any
//! image the base, overwriting a good tag with an image that cannot start.
//!
//! The package declares the capabilities Crossplane checks before it uses
//! a Function (`composition`, `operation`): an adaptor serves any call, so
//! both by default.
use std::io::Write;
use std::path::{Path, PathBuf};

use flate2::write::GzEncoder;
use serde_json::{json, Value};

use crate::image::pull::{sha256_digest, ConnectOptions, PullError, Puller};
use crate::image::reference::{ImageReference, ReferenceError};
use crate::image::RegistryAuth;

/// Where the function tarball goes in the image.
pub(crate) const FUNCTION_PATH: &str = "/function.tar";
/// The layer annotation Crossplane's package manager looks for.
pub(crate) const XPKG_ANNOTATION: &str = "io.crossplane.xpkg";

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// Errors of wrapping.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WrapError {
    /// A reference does not parse.
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    /// Getting the base image failed.
    #[error("cannot get the base image")]
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
    #[error("{path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The function tarball is not an image `xfn adapt` loads.
    #[error("--function {path}: {reason}")]
    BadFunction {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The package metadata is not a Function package's.
    #[error("package metadata {source_name}: {reason}")]
    BadPackage {
        /// The file, or the flags.
        source_name: String,
        /// What is wrong.
        reason: String,
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
pub(crate) struct WrapSpec {
    /// The function image tarball (`docker save` output).
    pub(crate) function: PathBuf,
    /// The base image reference.
    pub(crate) base: String,
    /// The reference the result is pushed as / named in the layout.
    pub(crate) tag: String,
    /// `metadata.name` of the package (over the metadata file's; default:
    /// the last path segment of `tag`'s repository).
    pub(crate) name: Option<String>,
    /// `metadata.annotations` of the package (added to the file's).
    pub(crate) annotations: Vec<(String, String)>,
    /// `spec.capabilities` (over the file's; default: the file's, else
    /// [`CAPABILITIES`]).
    pub(crate) capabilities: Vec<String>,
    /// A user's package metadata (`crossplane.yaml`) to start from.
    pub(crate) package_metadata: Option<PathBuf>,
    /// Registry credentials (base and target).
    pub(crate) auth: RegistryAuth,
    /// Registry connection settings.
    pub(crate) connect: ConnectOptions,
    /// Registry for references that name none.
    pub(crate) default_registry: String,
}

/// Where the result goes.
#[derive(Debug, Clone)]
pub(crate) enum WrapOutput {
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

/// What a Function package may declare it serves (Crossplane uses a
/// Function for Operations only with `operation`); an adaptor serves any
/// call, so it declares both unless told otherwise.
pub(crate) const CAPABILITIES: &[&str] = &["composition", "operation"];

/// The `package.yaml` of a Function package: `base` (a user's
/// `crossplane.yaml`, checked to be a `meta.pkg.crossplane.io` Function) or
/// a new `meta.pkg.crossplane.io/v1` one, with `name`, `annotations` and
/// `capabilities` set over it.
pub(crate) fn package_yaml(
    base: Option<(&str, Value)>,
    name: &str,
    annotations: &[(String, String)],
    capabilities: &[String],
) -> Result<String, WrapError> {
    let (source_name, mut package) = match base {
        Some((source, value)) => (source.to_string(), value),
        None => (
            "from the flags".to_string(),
            json!({"apiVersion": "meta.pkg.crossplane.io/v1", "kind": "Function"}),
        ),
    };
    let bad = |reason: String| WrapError::BadPackage {
        source_name: source_name.clone(),
        reason,
    };
    let api_version = package["apiVersion"].as_str().unwrap_or_default();
    if !api_version.starts_with("meta.pkg.crossplane.io/") || package["kind"] != "Function" {
        return Err(bad(format!(
            "expected a meta.pkg.crossplane.io Function, found {api_version:?} {}",
            package["kind"]
        )));
    }
    let object = |value: &Value, key: &str| -> Result<serde_json::Map<String, Value>, WrapError> {
        match value.get(key) {
            None | Some(Value::Null) => Ok(serde_json::Map::new()),
            Some(Value::Object(map)) => Ok(map.clone()),
            Some(other) => Err(bad(format!("{key} is not an object: {other}"))),
        }
    };
    let mut metadata = object(&package, "metadata")?;
    metadata.insert("name".into(), json!(name));
    let mut all_annotations = object(&package["metadata"], "annotations")?;
    for (key, value) in annotations {
        all_annotations.insert(key.clone(), json!(value));
    }
    if !all_annotations.is_empty() {
        metadata.insert("annotations".into(), Value::Object(all_annotations));
    }
    let mut spec = object(&package, "spec")?;
    if !capabilities.is_empty() || !spec.contains_key("capabilities") {
        let capabilities: Vec<&str> = if capabilities.is_empty() {
            CAPABILITIES.to_vec()
        } else {
            capabilities.iter().map(String::as_str).collect()
        };
        spec.insert("capabilities".into(), json!(capabilities));
    }
    package["metadata"] = Value::Object(metadata);
    package["spec"] = Value::Object(spec);
    yaml_serde::to_string(&package).map_err(|e| bad(e.to_string()))
}

/// Reads a user's package metadata file (YAML holding one object), its
/// nesting and aliases bounded before it is parsed ([`crate::nesting`]).
fn read_package_metadata(path: &Path) -> Result<Value, WrapError> {
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    let bad = |reason: String| WrapError::BadPackage {
        source_name: path.display().to_string(),
        reason,
    };
    crate::nesting::check(text.as_bytes()).map_err(|e| bad(e.to_string()))?;
    yaml_serde::from_str(&text).map_err(|e| bad(format!("not YAML: {e}")))
}

/// The largest `manifest.json` / `index.json` read from a function tarball.
const MAX_INDEX_BYTES: u64 = 4 << 20;

/// Checks that `path` is an image `xfn adapt --image-tarball` loads: a
/// `docker save` archive of exactly one image or an OCI layout in a tar
/// (gzipped or not), with every file its index names. Reads the tar once,
/// without unpacking it.
pub(crate) fn check_function_tarball(path: &Path) -> Result<(), WrapError> {
    let bad = |reason: String| WrapError::BadFunction {
        path: path.to_path_buf(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(io_err(path))?;
    let reader = crate::image::store::decompressor(std::io::BufReader::new(file), "")
        .map_err(io_err(path))?;
    let mut archive = tar::Archive::new(reader);
    let mut names = std::collections::HashSet::new();
    let (mut docker, mut oci) = (None, None);
    let entries = archive
        .entries()
        .map_err(|e| bad(format!("not an image tarball (not a tar: {e})")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(format!("not an image tarball (not a tar: {e})")))?;
        let name = entry
            .path()
            .map_err(|e| bad(e.to_string()))?
            .to_string_lossy()
            .trim_start_matches("./")
            .to_string();
        if name == "manifest.json" || name == "index.json" {
            let mut text = Vec::new();
            std::io::Read::read_to_end(
                &mut std::io::Read::take(&mut entry, MAX_INDEX_BYTES),
                &mut text,
            )
            .map_err(|e| bad(e.to_string()))?;
            let value: Value = serde_json::from_slice(&text)
                .map_err(|e| bad(format!("{name} does not parse: {e}")))?;
            if name == "manifest.json" {
                docker = Some(value);
            } else {
                oci = Some(value);
            }
        }
        names.insert(name);
    }
    let needed: Vec<String> = if let Some(manifest) = docker {
        let images = manifest.as_array().cloned().unwrap_or_default();
        let [image] = images.as_slice() else {
            return Err(bad(format!(
                "manifest.json lists {} images; xfn adapt needs exactly one",
                images.len()
            )));
        };
        let mut needed = vec![image["Config"].as_str().unwrap_or_default().to_string()];
        let layers = image["Layers"].as_array().cloned().unwrap_or_default();
        needed.extend(
            layers
                .iter()
                .map(|l| l.as_str().unwrap_or_default().to_string()),
        );
        needed
    } else if let Some(index) = oci {
        let manifests = index["manifests"].as_array().cloned().unwrap_or_default();
        if manifests.is_empty() {
            return Err(bad("index.json lists no image".into()));
        }
        manifests
            .iter()
            .map(|m| {
                let digest = m["digest"].as_str().unwrap_or_default();
                format!("blobs/{}", digest.replacen(':', "/", 1))
            })
            .collect()
    } else {
        return Err(bad(
            "not an image tarball: neither manifest.json (docker save) nor index.json (an OCI \
             layout)"
                .into(),
        ));
    };
    match needed.iter().find(|n| n.is_empty() || !names.contains(*n)) {
        Some(missing) => Err(bad(format!(
            "the archive lacks {missing:?}, which its index names"
        ))),
        None => Ok(()),
    }
}

/// What `xfn adapt` needs in the base: the entrypoint (`xfn`) and the
/// runtime it runs functions with (`crun`), both found on the `PATH`.
const BASE_PROGRAMS: &[&str] = &["xfn", "crun"];

/// The `PATH` a container of `config` resolves its entrypoint with.
fn config_path(config: &Value) -> Vec<String> {
    let env = config["config"]["Env"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let path = env
        .iter()
        .filter_map(Value::as_str)
        .find_map(|e| e.strip_prefix("PATH="))
        .unwrap_or("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| d.trim_end_matches('/').to_string())
        .collect()
}

/// Checks that the base's layers hold [`BASE_PROGRAMS`] on its `PATH`.
fn check_base(config: &Value, layers: &[(PathBuf, String)]) -> Result<(), String> {
    let path = config_path(config);
    let mut missing: Vec<&str> = BASE_PROGRAMS.to_vec();
    for (file, media_type) in layers {
        let reader = std::fs::File::open(file)
            .map(std::io::BufReader::new)
            .and_then(|r| crate::image::store::decompressor(r, media_type))
            .map_err(|e| format!("layer {}: {e}", file.display()))?;
        let mut archive = tar::Archive::new(reader);
        let entries = archive
            .entries()
            .map_err(|e| format!("a layer is not a tar: {e}"))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("a layer is not a tar: {e}"))?;
            if entry.header().entry_type().is_dir() {
                continue;
            }
            let name = entry.path().map_err(|e| e.to_string())?;
            let name = format!("/{}", name.to_string_lossy().trim_start_matches("./"));
            missing.retain(|program| !path.iter().any(|dir| name == format!("{dir}/{program}")));
        }
        if missing.is_empty() {
            return Ok(());
        }
    }
    Err(format!(
        "holds no {} on its PATH ({}): the base must be an xfn image (with xfn and crun)",
        missing.join(" and no "),
        path.join(":")
    ))
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
pub(crate) async fn wrap(spec: &WrapSpec, output: &WrapOutput) -> Result<String, WrapError> {
    // What comes from files is checked before any download or push.
    let target = ImageReference::parse(&spec.tag, &spec.default_registry)?;
    let function_path = spec.function.clone();
    tokio::task::spawn_blocking(move || check_function_tarball(&function_path))
        .await
        .map_err(|e| WrapError::BadFunction {
            path: spec.function.clone(),
            reason: e.to_string(),
        })??;
    let metadata = match &spec.package_metadata {
        Some(path) => Some((path.display().to_string(), read_package_metadata(path)?)),
        None => None,
    };
    let name = spec
        .name
        .clone()
        .or_else(|| {
            metadata
                .as_ref()
                .and_then(|(_, m)| m["metadata"]["name"].as_str().map(str::to_string))
        })
        .unwrap_or_else(|| {
            target
                .repository
                .rsplit('/')
                .next()
                .unwrap_or(&target.repository)
                .to_string()
        });
    let package = package_yaml(
        metadata.as_ref().map(|(s, v)| (s.as_str(), v.clone())),
        &name,
        &spec.annotations,
        &spec.capabilities,
    )?;

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
    let mut layer_files = Vec::new();
    for blob in &resolved.manifest.layers {
        let path = work.path().join(blob.digest.replace(':', "-"));
        puller
            .fetch_blob_to_file(&base, blob, &path, &|_| {}, &|| false, None)
            .await?;
        layer_files.push((path.clone(), blob.media_type.clone()));
        blobs.push((blob.digest.clone(), Blob::File(path)));
        layers.push(json!({
            "mediaType": oci_layer_type(&blob.media_type),
            "digest": blob.digest,
            "size": blob.size,
        }));
    }

    let mut config: Value = serde_json::from_slice(&config_bytes)
        .map_err(|e| bad(format!("config does not parse: {e}")))?;
    let checked = config.clone();
    tokio::task::spawn_blocking(move || check_base(&checked, &layer_files))
        .await
        .map_err(|e| bad(e.to_string()))?
        .map_err(bad)?;

    let function = std::fs::read(&spec.function).map_err(io_err(&spec.function))?;
    let package_layer = layer(&[("/package.yaml", 0o644, package.as_bytes())])
        .map_err(io_err(Path::new("package layer")))?;
    let function_layer =
        layer(&[(FUNCTION_PATH, 0o644, &function)]).map_err(io_err(&spec.function))?;

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
    fn package_yaml_is_a_function_package_with_both_capabilities() {
        let yaml = package_yaml(None, "fn-x", &[("a/b".into(), "c".into())], &[]).unwrap();
        let value: yaml_serde::Value = yaml_serde::from_str(&yaml).unwrap();
        assert_eq!(value["apiVersion"], "meta.pkg.crossplane.io/v1");
        assert_eq!(value["kind"], "Function");
        assert_eq!(value["metadata"]["name"], "fn-x");
        assert_eq!(value["metadata"]["annotations"]["a/b"], "c");
        assert_eq!(value["spec"]["capabilities"][0], "composition");
        assert_eq!(value["spec"]["capabilities"][1], "operation");
    }

    #[test]
    fn a_users_package_metadata_is_kept_and_checked() {
        let file = json!({"apiVersion": "meta.pkg.crossplane.io/v1", "kind": "Function",
            "metadata": {"name": "theirs", "annotations": {"x": "1"}},
            "spec": {"capabilities": ["operation"], "crossplane": {"version": ">=v2.0"}}});
        let yaml = package_yaml(Some(("crossplane.yaml", file.clone())), "mine", &[], &[]).unwrap();
        let value: Value = yaml_serde::from_str(&yaml).unwrap();
        assert_eq!(
            value["metadata"],
            json!({"name": "mine", "annotations": {"x": "1"}})
        );
        assert_eq!(value["spec"]["capabilities"], json!(["operation"]));
        assert_eq!(value["spec"]["crossplane"]["version"], ">=v2.0");
        let flags = package_yaml(Some(("f", file)), "m", &[], &["composition".into()]).unwrap();
        assert!(
            flags.contains("- composition") && !flags.contains("- operation"),
            "{flags}"
        );
        let provider = json!({"apiVersion": "meta.pkg.crossplane.io/v1", "kind": "Provider"});
        let err = package_yaml(Some(("p.yaml", provider)), "m", &[], &[]).unwrap_err();
        assert!(
            err.to_string()
                .contains("expected a meta.pkg.crossplane.io Function"),
            "{err}"
        );
    }

    #[test]
    fn a_function_tarball_must_be_one_whole_image() {
        let dir = tempfile::tempdir().unwrap();
        let tar_of = |name: &str, files: &[(&str, &[u8])]| {
            let path = dir.path().join(name);
            let mut tar = tar::Builder::new(std::fs::File::create(&path).unwrap());
            for (file, data) in files {
                let mut header = tar::Header::new_gnu();
                header.set_size(data.len() as u64);
                header.set_mode(0o644);
                tar.append_data(&mut header, file, *data).unwrap();
            }
            tar.finish().unwrap();
            path
        };
        let manifest = br#"[{"Config": "c.json", "Layers": ["l/layer.tar"]}]"#;
        let good = tar_of(
            "good.tar",
            &[
                ("manifest.json", manifest),
                ("c.json", b"{}"),
                ("l/layer.tar", b""),
            ],
        );
        check_function_tarball(&good).unwrap();
        let partial = tar_of(
            "partial.tar",
            &[("manifest.json", manifest), ("c.json", b"{}")],
        );
        let err = check_function_tarball(&partial).unwrap_err().to_string();
        assert!(err.contains("lacks \"l/layer.tar\""), "{err}");
        let other = tar_of("other.tar", &[("README", b"hello")]);
        let err = check_function_tarball(&other).unwrap_err().to_string();
        assert!(err.contains("not an image tarball"), "{err}");
        let not_tar = dir.path().join("fn.sh");
        std::fs::write(&not_tar, "#!/bin/sh\necho hi\n").unwrap();
        assert!(check_function_tarball(&not_tar).is_err());
    }

    #[test]
    fn a_base_must_hold_xfn_and_crun_on_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let layer_file = |name: &str, files: &[(&str, u32, &[u8])]| {
            let path = dir.path().join(name);
            std::fs::write(&path, layer(files).unwrap().gzipped).unwrap();
            (path, OCI_LAYER_GZIP.to_string())
        };
        let config = json!({"config": {"Env": ["PATH=/usr/local/bin:/bin"]}});
        let xfn = layer_file("a", &[("/usr/local/bin/xfn", 0o755, b"")]);
        let crun = layer_file("b", &[("/bin/crun", 0o755, b"")]);
        check_base(&config, &[xfn.clone(), crun]).unwrap();
        let err = check_base(&config, &[xfn]).unwrap_err();
        assert!(
            err.contains("holds no crun on its PATH (/usr/local/bin:/bin)"),
            "{err}"
        );
        let elsewhere = layer_file("c", &[("/opt/xfn", 0o755, b""), ("/opt/crun", 0o755, b"")]);
        let err = check_base(&config, &[elsewhere]).unwrap_err();
        assert!(err.contains("no xfn and no crun"), "{err}");
    }

    #[test]
    fn layers_are_deterministic() {
        let a = layer(&[("/x", 0o644, b"data")]).unwrap();
        let b = layer(&[("/x", 0o644, b"data")]).unwrap();
        assert_eq!(a.diff_id, b.diff_id);
        assert_eq!(a.gzipped, b.gzipped);
    }
}
