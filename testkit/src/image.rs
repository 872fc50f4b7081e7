//! Images built and pushed by tests: config + manifest (OCI or Docker
//! schema 2) over [`Layer`]s, and indexes (manifest lists) of several
//! platforms. Deterministic: the same calls give the same digests.
//!
//! ```ignore
//! let image = ImageBuilder::new()
//!     .layer(Layer::busybox())
//!     .layer(Layer::new().file("/fn.sh", 0o755, "#!/bin/sh\ncat\n"))
//!     .entrypoint(["/fn.sh"])
//!     .push(&registry, "fn:v1");
//! // image.reference == "127.0.0.1:PORT/fn:v1", image.digest == "sha256:…"
//! ```
use serde_json::{json, Value};

use super::format::Format;
use super::http;
use super::layer::{sha256_digest, Layer, LayerBlob};
use super::registry::Registry;

/// The host's architecture in OCI terms (`amd64`, `arm64`, …).
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// An architecture that is not the host's, for multi-platform tests.
pub fn foreign_arch() -> &'static str {
    if host_arch() == "arm64" {
        "amd64"
    } else {
        "arm64"
    }
}

/// A single-platform image under construction.
#[derive(Debug, Clone)]
pub struct ImageBuilder {
    format: Format,
    layers: Vec<Layer>,
    os: String,
    architecture: String,
    entrypoint: Option<Vec<String>>,
    cmd: Option<Vec<String>>,
    env: Vec<String>,
    working_dir: Option<String>,
    user: Option<String>,
    labels: Vec<(String, String)>,
}

impl Default for ImageBuilder {
    fn default() -> Self {
        ImageBuilder::new()
    }
}

impl ImageBuilder {
    /// An OCI image for linux on the host's architecture, with no layers.
    pub fn new() -> ImageBuilder {
        ImageBuilder {
            format: Format::Oci,
            layers: Vec::new(),
            os: "linux".to_string(),
            architecture: host_arch().to_string(),
            entrypoint: None,
            cmd: None,
            env: vec!["PATH=/usr/local/bin:/usr/bin:/bin".to_string()],
            working_dir: None,
            user: None,
            labels: Vec::new(),
        }
    }

    /// OCI (default) or Docker schema 2 manifest and media types.
    pub fn format(mut self, format: Format) -> Self {
        self.format = format;
        self
    }

    /// Adds a layer on top of the ones before.
    pub fn layer(mut self, layer: Layer) -> Self {
        self.layers.push(layer);
        self
    }

    /// The config's `os` and `architecture`.
    pub fn platform(mut self, os: &str, architecture: &str) -> Self {
        self.os = os.to_string();
        self.architecture = architecture.to_string();
        self
    }

    /// The config's `Entrypoint`.
    pub fn entrypoint<S: Into<String>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.entrypoint = Some(args.into_iter().map(Into::into).collect());
        self
    }

    /// The config's `Cmd`.
    pub fn cmd<S: Into<String>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.cmd = Some(args.into_iter().map(Into::into).collect());
        self
    }

    /// Replaces the config's `Env` (default: just a `PATH`): for an image
    /// whose `PATH` is its own, or that has none.
    pub fn env<S: Into<String>>(mut self, vars: impl IntoIterator<Item = S>) -> Self {
        self.env = vars.into_iter().map(Into::into).collect();
        self
    }

    /// Adds `var` (`NAME=value`) to the config's `Env`, after the ones
    /// before (the default `PATH` kept).
    pub fn with_env(mut self, var: impl Into<String>) -> Self {
        self.env.push(var.into());
        self
    }

    /// The config's `WorkingDir`.
    pub fn working_dir(mut self, dir: &str) -> Self {
        self.working_dir = Some(dir.to_string());
        self
    }

    /// The config's `User` (`uid`, `uid:gid` or a name).
    pub fn user(mut self, user: &str) -> Self {
        self.user = Some(user.to_string());
        self
    }

    /// Adds a config label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.push((key.to_string(), value.to_string()));
        self
    }

    /// Builds every blob and the manifest, without pushing.
    pub fn build(&self) -> BuiltImage {
        let layers: Vec<LayerBlob> = self.layers.iter().map(|l| l.blob(self.format)).collect();
        let mut container = serde_json::Map::new();
        if let Some(e) = &self.entrypoint {
            container.insert("Entrypoint".into(), json!(e));
        }
        if let Some(c) = &self.cmd {
            container.insert("Cmd".into(), json!(c));
        }
        container.insert("Env".into(), json!(self.env));
        if let Some(w) = &self.working_dir {
            container.insert("WorkingDir".into(), json!(w));
        }
        if let Some(u) = &self.user {
            container.insert("User".into(), json!(u));
        }
        if !self.labels.is_empty() {
            let labels: serde_json::Map<String, Value> = self
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect();
            container.insert("Labels".into(), Value::Object(labels));
        }
        let config = json!({
            "created": "1970-01-01T00:00:00Z",
            "architecture": self.architecture,
            "os": self.os,
            "config": Value::Object(container),
            "rootfs": {
                "type": "layers",
                "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>(),
            },
        });
        let config = serde_json::to_vec(&config).expect("config json");
        let config_digest = sha256_digest(&config);
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": self.format.manifest_type(),
            "config": {
                "mediaType": self.format.config_type(),
                "digest": config_digest,
                "size": config.len(),
            },
            "layers": layers.iter().map(|l| {
                let mut descriptor = json!({
                    "mediaType": l.media_type,
                    "digest": l.digest,
                    "size": l.data.len(),
                });
                if !l.annotations.is_empty() {
                    descriptor["annotations"] = l.annotations.iter()
                        .map(|(k, v)| (k.clone(), json!(v)))
                        .collect::<serde_json::Map<String, Value>>()
                        .into();
                }
                descriptor
            }).collect::<Vec<_>>(),
        });
        let manifest = serde_json::to_vec(&manifest).expect("manifest json");
        BuiltImage {
            format: self.format,
            os: self.os.clone(),
            architecture: self.architecture.clone(),
            digest: sha256_digest(&manifest),
            manifest,
            config_digest,
            config,
            layers,
        }
    }

    /// Builds and pushes the image as `name` (`repo:tag`) and returns it.
    pub fn push(&self, registry: &Registry, name: &str) -> PushedImage {
        let built = self.build();
        let (repo, tag) = split_name(name);
        built.push_blobs(registry, repo);
        put_manifest(
            registry,
            repo,
            tag,
            built.format.manifest_type(),
            &built.manifest,
        );
        PushedImage {
            reference: registry.reference(name),
            digest: built.digest.clone(),
            image: built,
        }
    }
}

/// Every blob of an image plus its manifest, ready to push.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    /// OCI or Docker.
    pub format: Format,
    /// Config `os`.
    pub os: String,
    /// Config `architecture`.
    pub architecture: String,
    /// The manifest bytes.
    pub manifest: Vec<u8>,
    /// `sha256:` of the manifest.
    pub digest: String,
    /// The config bytes.
    pub config: Vec<u8>,
    /// `sha256:` of the config.
    pub config_digest: String,
    /// The layer blobs, bottom first.
    pub layers: Vec<LayerBlob>,
}

impl BuiltImage {
    fn push_blobs(&self, registry: &Registry, repo: &str) {
        for layer in &self.layers {
            push_blob(registry, repo, &layer.digest, &layer.data);
        }
        push_blob(registry, repo, &self.config_digest, &self.config);
    }

    /// Total bytes of the layer blobs as stored (compressed).
    pub fn layers_size(&self) -> u64 {
        self.layers.iter().map(|l| l.data.len() as u64).sum()
    }
}

/// An image in a registry.
#[derive(Debug, Clone)]
pub struct PushedImage {
    /// `127.0.0.1:PORT/repo:tag`.
    pub reference: String,
    /// The manifest digest.
    pub digest: String,
    /// What was pushed.
    pub image: BuiltImage,
}

/// An image index (manifest list) under construction.
#[derive(Debug, Clone, Default)]
pub struct IndexBuilder {
    format: Format,
    images: Vec<ImageBuilder>,
}

impl IndexBuilder {
    /// An empty OCI index.
    pub fn new() -> IndexBuilder {
        IndexBuilder::default()
    }

    /// OCI index (default) or Docker manifest list. The images keep their
    /// own format.
    pub fn format(mut self, format: Format) -> Self {
        self.format = format;
        self
    }

    /// Adds an image; its config's os/architecture is its index platform.
    pub fn image(mut self, image: ImageBuilder) -> Self {
        self.images.push(image);
        self
    }

    /// Pushes every image by digest, then the index as `name`.
    pub fn push(&self, registry: &Registry, name: &str) -> PushedIndex {
        let (repo, tag) = split_name(name);
        let mut images = Vec::new();
        let mut entries = Vec::new();
        for builder in &self.images {
            let built = builder.build();
            built.push_blobs(registry, repo);
            put_manifest(
                registry,
                repo,
                &built.digest,
                built.format.manifest_type(),
                &built.manifest,
            );
            entries.push(json!({
                "mediaType": built.format.manifest_type(),
                "digest": built.digest,
                "size": built.manifest.len(),
                "platform": {"os": built.os, "architecture": built.architecture},
            }));
            images.push(PushedImage {
                reference: format!("{}@{}", registry.reference(repo), built.digest),
                digest: built.digest.clone(),
                image: built,
            });
        }
        let index = json!({
            "schemaVersion": 2,
            "mediaType": self.format.index_type(),
            "manifests": entries,
        });
        let index = serde_json::to_vec(&index).expect("index json");
        put_manifest(registry, repo, tag, self.format.index_type(), &index);
        PushedIndex {
            reference: registry.reference(name),
            digest: sha256_digest(&index),
            images,
        }
    }
}

/// An index in a registry.
#[derive(Debug, Clone)]
pub struct PushedIndex {
    /// `127.0.0.1:PORT/repo:tag`.
    pub reference: String,
    /// The index digest.
    pub digest: String,
    /// The platform images, in the order added.
    pub images: Vec<PushedImage>,
}

/// `repo:tag` → (`repo`, `tag`); `latest` when no tag.
fn split_name(name: &str) -> (&str, &str) {
    match name.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => (repo, tag),
        _ => (name, "latest"),
    }
}

fn auth_headers(registry: &Registry) -> Vec<(&'static str, String)> {
    registry
        .auth_header()
        .map(|h| vec![("Authorization", h)])
        .unwrap_or_default()
}

/// Uploads a blob monolithically (POST then PUT), unless already there.
pub fn push_blob(registry: &Registry, repo: &str, digest: &str, data: &[u8]) {
    let auth = auth_headers(registry);
    let auth: Vec<(&str, &str)> = auth.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let head = http::request(
        registry.addr(),
        "HEAD",
        &format!("/v2/{repo}/blobs/{digest}"),
        &auth,
        &[],
    )
    .expect("HEAD blob");
    if head.status == 200 {
        return;
    }
    let start = http::request(
        registry.addr(),
        "POST",
        &format!("/v2/{repo}/blobs/uploads/"),
        &auth,
        &[],
    )
    .expect("start upload");
    assert_eq!(start.status, 202, "start upload: {start:?}");
    let location = http::location_path(start.header("location").expect("upload location"));
    let sep = if location.contains('?') { '&' } else { '?' };
    let mut headers = auth.clone();
    headers.push(("Content-Type", "application/octet-stream"));
    let put = http::request(
        registry.addr(),
        "PUT",
        &format!("{location}{sep}digest={digest}"),
        &headers,
        data,
    )
    .expect("upload blob");
    assert_eq!(
        put.status,
        201,
        "upload blob {digest}: {}",
        String::from_utf8_lossy(&put.body)
    );
}

/// PUTs a manifest or index under a tag or digest.
pub fn put_manifest(
    registry: &Registry,
    repo: &str,
    reference: &str,
    media_type: &str,
    body: &[u8],
) {
    let auth = auth_headers(registry);
    let mut headers: Vec<(&str, &str)> = auth.iter().map(|(n, v)| (*n, v.as_str())).collect();
    headers.push(("Content-Type", media_type));
    let put = http::request(
        registry.addr(),
        "PUT",
        &format!("/v2/{repo}/manifests/{reference}"),
        &headers,
        body,
    )
    .expect("put manifest");
    assert_eq!(
        put.status,
        201,
        "put manifest {repo}:{reference}: {}",
        String::from_utf8_lossy(&put.body)
    );
}
/// Pushes `name`, a function that echoes its input (busybox `cat`), to
/// `registry`; returns its reference.
pub fn echo_image(registry: &Registry, name: &str) -> String {
    ImageBuilder::new()
        .layer(Layer::busybox())
        .entrypoint(["/bin/cat"])
        .push(registry, name)
        .reference
}

/// Pushes `name`, busybox running `script` under `/bin/sh -c`, to
/// `registry`; returns its reference. A warm container's function is
/// started ahead of its call: a script whose processes a test looks for
/// reads its input first and spells the command line looked for only once
/// run (`n=36; sleep ${n}11` is looked for as `sleep 3611`).
pub fn script_image(registry: &Registry, name: &str, script: &str) -> String {
    ImageBuilder::new()
        .layer(Layer::busybox())
        .entrypoint(["/bin/sh", "-c", script])
        .push(registry, name)
        .reference
}

/// An image whose function reads its input, then sleeps for `seconds` (a
/// marker to find its process by) without a shell in between: the
/// container's init is then `sleep`. The marker is spelled only once run
/// (`sleep 36${n}`), and input comes only with a call: a warm container's
/// function, started ahead of its call, waits in `cat` and never matches.
pub fn sleeper_image(registry: &Registry, name: &str, seconds: u32) -> String {
    let (head, tail) = (seconds / 100, seconds % 100);
    ImageBuilder::new()
        .layer(Layer::busybox())
        .entrypoint([
            "/bin/sh",
            "-c",
            &format!("cat >/dev/null; n={tail:02}; exec sleep {head}$n"),
        ])
        .push(registry, name)
        .reference
}
