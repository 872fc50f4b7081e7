//! The image store against a real `docker-registry` on loopback: pull
//! policies, caching, concurrency, corruption, platforms, compressions and
//! the errors a user sees.

use std::path::Path;
use std::sync::atomic::Ordering;

use xfn::image::{
    ImageError, ImageErrorKind, ImageStore, PullPolicy, PullReport, PulledImage, RegistryAuth,
    StoreOptions,
};
use xfn_testkit::*;

fn open_store(dir: &Path) -> ImageStore {
    ImageStore::open(dir, StoreOptions::default()).unwrap()
}

fn anonymous() -> RegistryAuth {
    RegistryAuth::default()
}

/// The pulls of these tests: with no credentials, no progress bar.
trait Pull {
    async fn pull(&self, reference: &str, policy: PullPolicy) -> Result<PulledImage, ImageError>;
    async fn pull_reporting(
        &self,
        reference: &str,
        policy: PullPolicy,
    ) -> Result<(PulledImage, PullReport), ImageError>;
}

impl Pull for ImageStore {
    async fn pull(&self, reference: &str, policy: PullPolicy) -> Result<PulledImage, ImageError> {
        self.ensure(reference, policy, &anonymous()).await
    }
    async fn pull_reporting(
        &self,
        reference: &str,
        policy: PullPolicy,
    ) -> Result<(PulledImage, PullReport), ImageError> {
        self.ensure_with(reference, policy, &anonymous(), None)
            .await
    }
}

/// `reference` pulled into `store` under `policy`, which succeeds.
async fn pull_ok(store: &ImageStore, reference: &str, policy: PullPolicy) -> PulledImage {
    store
        .pull(reference, policy)
        .await
        .unwrap_or_else(|err| panic!("{reference}: {err}"))
}

/// A `Never` pull of `reference` fails: the image is not (whole) in the
/// cache.
async fn assert_not_cached(store: &ImageStore, reference: &str) {
    let err = store.pull(reference, PullPolicy::Never).await.unwrap_err();
    assert_eq!(err.kind(), ImageErrorKind::NotPresent, "{err}");
}

/// `small_image("one")` pushed as `fn:v1` to a fresh registry, and an empty
/// store in a fresh dir: where most tests here start.
fn one_image_and_a_store() -> (Registry, PushedImage, tempfile::TempDir, ImageStore) {
    let registry = Registry::start();
    let pushed = small_image("one").push(&registry, "fn:v1");
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    (registry, pushed, dir, store)
}

/// A small two-layer function image: busybox-free, so it is quick to push.
fn small_image(marker: &str) -> ImageBuilder {
    ImageBuilder::new()
        .layer(
            Layer::new()
                .dir("/etc", 0o755)
                .file("/etc/base", 0o644, "base\n"),
        )
        .layer(Layer::new().file("/fn.sh", 0o755, format!("#!/bin/sh\necho {marker}\n")))
        .entrypoint(["/fn.sh"])
        .cmd(["--flag"])
        .env(["A=1", "PATH=/bin"])
        .working_dir("/work")
        .user("65532:65532")
}

/// Names of the entries in a store subdirectory.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn manifest_gets(registry: &Registry) -> usize {
    registry
        .log()
        .lines()
        .filter(|l| l.contains("\"GET ") && l.contains("/manifests/"))
        .count()
}

#[tokio::test]
async fn if_not_present_pulls_once_then_serves_the_cache() {
    let (registry, pushed, dir, store) = one_image_and_a_store();

    let (image, report) = store
        .pull_reporting(&pushed.reference, PullPolicy::IfNotPresent)
        .await
        .unwrap();
    assert_eq!(image.digest, pushed.digest);
    assert_eq!(image.reference, pushed.reference);
    assert!(report.resolved_remotely);
    assert_eq!(report.layers, 2);
    assert_eq!(report.layers_downloaded, 2);
    assert_eq!(report.bytes_downloaded, pushed.image.layers_size());
    assert_eq!(image.layers.len(), 2);
    for (dir, blob) in image.layers.iter().zip(&pushed.image.layers) {
        assert!(dir.is_dir());
        assert!(dir.starts_with(store.root().join("layers")));
        assert!(dir.ends_with(blob.digest.trim_start_matches("sha256:")));
    }
    let config = image.config.config().as_ref().unwrap();
    assert_eq!(
        config.entrypoint().as_deref(),
        Some(&["/fn.sh".to_string()][..])
    );
    assert_eq!(config.cmd().as_deref(), Some(&["--flag".to_string()][..]));
    assert_eq!(config.working_dir().as_deref(), Some("/work"));
    assert_eq!(config.user().as_deref(), Some("65532:65532"));

    let gets_before = manifest_gets(&registry);
    let (again, report) = store
        .pull_reporting(&pushed.reference, PullPolicy::IfNotPresent)
        .await
        .unwrap();
    assert_eq!(again.digest, pushed.digest);
    assert_eq!(again.layers, image.layers);
    assert!(!report.resolved_remotely);
    assert_eq!(report.layers_downloaded, 0);
    assert_eq!(
        manifest_gets(&registry),
        gets_before,
        "the registry was asked again"
    );
    for blob in &pushed.image.layers {
        assert_eq!(registry.blob_get_count(&blob.digest), 1);
    }

    // A store opened later (another process) sees the same cache.
    let reopened = open_store(dir.path());
    let cached = reopened
        .pull(&pushed.reference, PullPolicy::Never)
        .await
        .unwrap();
    assert_eq!(cached.digest, pushed.digest);
    let listed = reopened.list().unwrap().images;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].reference, pushed.reference);
    assert_eq!(listed[0].digest, pushed.digest);
    assert!(listed[0].complete);
    assert!(entries(&dir.path().join("tmp")).is_empty());
}

#[tokio::test]
async fn always_re_resolves_the_tag_and_reuses_cached_layers() {
    let registry = Registry::start();
    let v1 = small_image("one").push(&registry, "fn:v1");
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    store.pull(&v1.reference, PullPolicy::Always).await.unwrap();

    // The tag moves to an image with the same base layer and a new top.
    let v2 = small_image("two").push(&registry, "fn:v1");
    assert_ne!(v1.digest, v2.digest);
    let base = &v2.image.layers[0].digest;
    assert_eq!(base, &v1.image.layers[0].digest);

    let stale = store
        .pull(&v1.reference, PullPolicy::IfNotPresent)
        .await
        .unwrap();
    assert_eq!(stale.digest, v1.digest, "IfNotPresent must not re-resolve");
    let never = store.pull(&v1.reference, PullPolicy::Never).await.unwrap();
    assert_eq!(never.digest, v1.digest);

    let resolved_before = store.stats().manifests_resolved.load(Ordering::Relaxed);
    let (fresh, report) = store
        .pull_reporting(&v1.reference, PullPolicy::Always)
        .await
        .unwrap();
    assert_eq!(fresh.digest, v2.digest);
    assert!(report.resolved_remotely);
    assert_eq!(report.layers_downloaded, 1, "only the new top layer");
    assert_eq!(
        store.stats().manifests_resolved.load(Ordering::Relaxed),
        resolved_before + 1
    );
    assert_eq!(
        registry.blob_get_count(base),
        1,
        "the base layer was fetched again"
    );
    assert_eq!(fresh.layers[0], stale.layers[0]);

    // Now the cache follows the tag.
    let after = store.pull(&v1.reference, PullPolicy::Never).await.unwrap();
    assert_eq!(after.digest, v2.digest);
}

#[tokio::test]
async fn never_with_an_absent_image_fails_naming_it_without_contacting_the_registry() {
    let (registry, pushed, _dir, store) = one_image_and_a_store();
    let gets_before = manifest_gets(&registry);
    let err = store
        .pull(&pushed.reference, PullPolicy::Never)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ImageErrorKind::NotPresent);
    let msg = err.to_string();
    assert!(msg.contains(&pushed.reference), "{msg}");
    assert!(msg.contains("Never"), "{msg}");
    assert_eq!(manifest_gets(&registry), gets_before);
}

#[tokio::test]
async fn a_digest_reference_is_served_from_the_cache_after_a_tag_pull() {
    let (registry, pushed, _dir, store) = one_image_and_a_store();
    pull_ok(&store, &pushed.reference, PullPolicy::IfNotPresent).await;
    let by_digest = format!("{}@{}", registry.reference("fn"), pushed.digest);
    let image = store.pull(&by_digest, PullPolicy::Never).await.unwrap();
    assert_eq!(image.digest, pushed.digest);

    // A digest that is not what the registry serves is refused.
    let wrong = format!("{}@sha256:{}", registry.reference("fn"), "0".repeat(64));
    let err = store.pull(&wrong, PullPolicy::Always).await.unwrap_err();
    assert_eq!(err.kind(), ImageErrorKind::NotFound, "{err}");
}

#[tokio::test]
async fn concurrent_ensures_of_one_image_download_it_once() {
    let registry = Registry::start();
    let pushed = ImageBuilder::new()
        .layer(Layer::new().file("/a", 0o644, pseudo_random_bytes(1, 2 << 20)))
        .layer(Layer::new().file("/b", 0o644, pseudo_random_bytes(2, 2 << 20)))
        .layer(Layer::new().file("/c", 0o644, "c"))
        .push(&registry, "fn:v1");
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    // A second store on the same dir stands in for a second process: it
    // shares no in-process lock, only the file locks.
    let other = open_store(dir.path());
    let (a, b, c) = tokio::join!(
        store.pull(&pushed.reference, PullPolicy::IfNotPresent),
        store.pull(&pushed.reference, PullPolicy::IfNotPresent),
        other.pull(&pushed.reference, PullPolicy::IfNotPresent),
    );
    let (a, b, c) = (a.unwrap(), b.unwrap(), c.unwrap());
    assert_eq!(a.digest, pushed.digest);
    assert_eq!(a.layers, b.layers);
    assert_eq!(a.layers, c.layers);
    for blob in &pushed.image.layers {
        assert_eq!(
            registry.blob_get_count(&blob.digest),
            1,
            "layer {} downloaded more than once",
            blob.digest
        );
    }
    let downloaded = store.stats().blobs_downloaded.load(Ordering::Relaxed)
        + other.stats().blobs_downloaded.load(Ordering::Relaxed);
    assert_eq!(downloaded, 3);
}

#[tokio::test]
async fn a_corrupt_blob_is_an_error_and_nothing_is_cached() {
    let registry = Registry::start();
    let pushed = small_image("one").push(&registry, "fn:v1");
    let victim = &pushed.image.layers[1];
    let data = registry.blob_data_path(&victim.digest);
    let mut bytes = std::fs::read(&data).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    bytes[0] ^= 0xff;
    std::fs::write(&data, &bytes).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    let err = store
        .pull(&pushed.reference, PullPolicy::IfNotPresent)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ImageErrorKind::Corrupt, "{err}");
    let msg = err.to_string();
    assert!(msg.contains("digest mismatch"), "{msg}");
    assert!(msg.contains(&victim.digest), "{msg}");
    let hex = victim.digest.trim_start_matches("sha256:");
    assert!(!dir.path().join("blobs/sha256").join(hex).exists());
    assert!(!dir.path().join("layers").join(hex).exists());
    assert!(entries(&dir.path().join("refs")).is_empty());
    assert!(entries(&dir.path().join("manifests")).is_empty());
    assert!(entries(&dir.path().join("tmp")).is_empty());
    assert_not_cached(&store, &pushed.reference).await;
}

#[tokio::test]
async fn an_index_resolves_to_the_host_platform() {
    for format in [Format::Oci, Format::Docker] {
        let registry = Registry::start();
        let index = IndexBuilder::new()
            .format(format)
            .image(
                small_image("foreign")
                    .format(format)
                    .platform("linux", foreign_arch()),
            )
            .image(small_image("host").format(format))
            .push(&registry, "multi:v1");
        let host_image = &index.images[1];
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path());
        let image = store
            .pull(&index.reference, PullPolicy::IfNotPresent)
            .await
            .unwrap();
        assert_eq!(image.digest, host_image.digest, "{format:?}");
        let foreign_top = &index.images[0].image.layers[1].digest;
        assert_eq!(registry.blob_get_count(foreign_top), 0);

        // Pinned by the index digest, it resolves the same way.
        let by_digest = format!("{}@{}", registry.reference("multi"), index.digest);
        let pinned = store.pull(&by_digest, PullPolicy::Always).await.unwrap();
        assert_eq!(pinned.digest, host_image.digest);
    }
}

#[tokio::test]
async fn an_index_without_the_host_platform_lists_what_it_offers() {
    let registry = Registry::start();
    let index = IndexBuilder::new()
        .image(small_image("a").platform("linux", foreign_arch()))
        .image(small_image("b").platform("windows", host_arch()))
        .push(&registry, "multi:v1");
    let dir = tempfile::tempdir().unwrap();
    let err = open_store(dir.path())
        .pull(&index.reference, PullPolicy::IfNotPresent)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ImageErrorKind::NotFound);
    let msg = err.to_string();
    assert!(msg.contains(&format!("linux/{}", foreign_arch())), "{msg}");
    assert!(msg.contains(&format!("windows/{}", host_arch())), "{msg}");
    assert!(msg.contains(&format!("linux/{}", host_arch())), "{msg}");
}

#[tokio::test]
async fn gzip_zstd_and_plain_layers_pull_and_extract() {
    let registry = Registry::start();
    for format in [Format::Oci, Format::Docker] {
        let pushed = ImageBuilder::new()
            .format(format)
            .layer(Layer::new().file("/gz", 0o644, "gzip"))
            .layer(
                Layer::new()
                    .compression(Compression::Zstd)
                    .file("/zst", 0o644, "zstd"),
            )
            .layer(
                Layer::new()
                    .compression(Compression::None)
                    .file("/plain", 0o644, "plain"),
            )
            // A gzip blob under a plain-tar media type: found by its magic.
            .layer(
                Layer::new()
                    .media_type("application/vnd.docker.image.rootfs.diff.tar")
                    .file("/sniffed", 0o644, "sniffed"),
            )
            .push(&registry, &format!("comp:{format:?}").to_lowercase());
        let dir = tempfile::tempdir().unwrap();
        let image = open_store(dir.path())
            .pull(&pushed.reference, PullPolicy::IfNotPresent)
            .await
            .unwrap();
        let read =
            |i: usize, name: &str| std::fs::read_to_string(image.layers[i].join(name)).unwrap();
        assert_eq!(read(0, "gz"), "gzip");
        assert_eq!(read(1, "zst"), "zstd");
        assert_eq!(read(2, "plain"), "plain");
        assert_eq!(read(3, "sniffed"), "sniffed");
    }
}

#[tokio::test]
async fn the_flattened_rootfs_applies_every_layer_once() {
    let registry = Registry::start();
    let pushed = ImageBuilder::new()
        .layer(
            Layer::new()
                .dir("/etc", 0o755)
                .file("/etc/keep", 0o644, "keep")
                .file("/etc/gone", 0o644, "gone")
                .dir("/opaque", 0o755)
                .file("/opaque/old", 0o644, "old"),
        )
        .layer(
            Layer::new()
                .whiteout("/etc/gone")
                .opaque("/opaque")
                .file("/opaque/new", 0o644, "new")
                .file("/etc/keep", 0o644, "kept"),
        )
        .push(&registry, "flat:v1");
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    let image = pull_ok(&store, &pushed.reference, PullPolicy::IfNotPresent).await;
    let (a, b) = tokio::join!(
        store.flattened_rootfs(&image),
        store.flattened_rootfs(&image)
    );
    let rootfs = a.unwrap();
    assert_eq!(rootfs, b.unwrap());
    assert_eq!(
        rootfs,
        dir.path()
            .join("rootfs")
            .join(pushed.digest.trim_start_matches("sha256:"))
    );
    assert_eq!(
        std::fs::read_to_string(rootfs.join("etc/keep")).unwrap(),
        "kept"
    );
    assert!(!rootfs.join("etc/gone").exists());
    assert!(!rootfs.join("opaque/old").exists());
    assert_eq!(
        std::fs::read_to_string(rootfs.join("opaque/new")).unwrap(),
        "new"
    );
}

#[tokio::test]
async fn too_many_layers_are_refused() {
    let registry = Registry::start();
    let mut builder = ImageBuilder::new();
    for _ in 0..257 {
        builder = builder.layer(Layer::new().file("/x", 0o644, "x"));
    }
    let pushed = builder.push(&registry, "deep:v1");
    let dir = tempfile::tempdir().unwrap();
    let err = open_store(dir.path())
        .pull(&pushed.reference, PullPolicy::IfNotPresent)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ImageErrorKind::TooManyLayers);
    assert!(err.to_string().contains("257 layers"), "{err}");
    assert_eq!(registry.blob_get_count(&pushed.image.layers[0].digest), 0);
}

#[tokio::test]
async fn invalid_references_are_invalid_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    for bad in [
        "",
        "Fn/UPPER",
        "fn:",
        "fn@sha256:xyz",
        "a b",
        "127.0.0.1:5000/fn::v1",
    ] {
        let err = store.pull(bad, PullPolicy::IfNotPresent).await.unwrap_err();
        assert_eq!(
            err.kind(),
            ImageErrorKind::InvalidArgument,
            "{bad:?}: {err}"
        );
        assert!(err.to_string().contains("invalid image reference"), "{err}");
    }
}

#[tokio::test]
async fn absent_tags_are_not_found_and_dead_registries_unavailable() {
    let registry = Registry::start();
    small_image("one").push(&registry, "fn:v1");
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    for absent in ["fn:nope", "nosuchrepo:v1"] {
        let err = store
            .pull(&registry.reference(absent), PullPolicy::IfNotPresent)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ImageErrorKind::NotFound, "{absent}: {err}");
    }
    let host = registry.host();
    drop(registry);
    let err = store
        .pull(&format!("{host}/fn:v1"), PullPolicy::IfNotPresent)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ImageErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains(&host), "{err}");
}

#[tokio::test]
async fn the_default_registry_completes_short_names() {
    let registry = Registry::start();
    let pushed = small_image("one").push(&registry, "team/fn:v1");
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(
        dir.path(),
        StoreOptions {
            default_registry: registry.host(),
            ..Default::default()
        },
    )
    .unwrap();
    let image = store
        .pull("team/fn:v1", PullPolicy::IfNotPresent)
        .await
        .unwrap();
    assert_eq!(image.digest, pushed.digest);
    assert_eq!(store.list().unwrap().images[0].reference, pushed.reference);
}

/// Records what a pull reports, as a progress bar would see it.
#[derive(Default)]
struct Recorder {
    started: std::sync::Mutex<Vec<(usize, u64)>>,
    bytes: std::sync::atomic::AtomicU64,
}

impl xfn::image::PullProgress for Recorder {
    fn started(&self, layers: usize, total_bytes: u64) {
        self.started.lock().unwrap().push((layers, total_bytes));
    }
    fn advanced(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

#[tokio::test]
async fn progress_covers_every_layer_byte_pulled_or_cached() {
    let registry = Registry::start();
    let pushed = small_image("one").push(&registry, "fn:v1");
    let total = pushed.image.layers_size();
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    for policy in [
        PullPolicy::IfNotPresent,
        PullPolicy::IfNotPresent,
        PullPolicy::Always,
    ] {
        let recorder = Recorder::default();
        store
            .ensure_with(&pushed.reference, policy, &anonymous(), Some(&recorder))
            .await
            .unwrap();
        assert_eq!(
            *recorder.started.lock().unwrap(),
            vec![(2, total)],
            "{policy:?}"
        );
        assert_eq!(recorder.bytes.load(Ordering::Relaxed), total, "{policy:?}");
    }
}

#[tokio::test]
async fn a_lost_layer_dir_is_re_extracted_from_the_kept_blob() {
    let (registry, pushed, _dir, store) = one_image_and_a_store();
    let image = pull_ok(&store, &pushed.reference, PullPolicy::IfNotPresent).await;
    std::fs::remove_dir_all(&image.layers[1]).unwrap();
    assert_not_cached(&store, &pushed.reference).await;
    let (again, report) = store
        .pull_reporting(&pushed.reference, PullPolicy::IfNotPresent)
        .await
        .unwrap();
    assert_eq!(report.layers_downloaded, 0);
    assert_eq!(
        std::fs::read_to_string(again.layers[1].join("fn.sh")).unwrap(),
        "#!/bin/sh\necho one\n"
    );
    for blob in &pushed.image.layers {
        assert_eq!(registry.blob_get_count(&blob.digest), 1);
    }
}

#[tokio::test]
async fn a_pinned_image_is_found_again_from_memory_and_read_from_disk_once_its_pins_are_gone() {
    let (_registry, pushed, dir, store) = one_image_and_a_store();
    let pulled = pull_ok(&store, &pushed.reference, PullPolicy::IfNotPresent).await;
    // Found whole on disk while `pulled` pins it: remembered.
    let found = pull_ok(&store, &pushed.reference, PullPolicy::Never).await;
    drop(pulled);

    // Torn on disk under a live pin: the verified copy in memory serves,
    // and the torn file is left for the first lookup that reads the disk.
    let manifest = dir
        .path()
        .join("manifests")
        .join(pushed.digest.trim_start_matches("sha256:"));
    let bytes = std::fs::read(&manifest).unwrap();
    std::fs::write(&manifest, &bytes[..bytes.len() / 2]).unwrap();
    let again = pull_ok(&store, &pushed.reference, PullPolicy::Never).await;
    assert_eq!(again.digest, pushed.digest);
    assert_eq!(again.layers, found.layers);
    assert_eq!(
        again
            .config
            .config()
            .as_ref()
            .unwrap()
            .entrypoint()
            .as_deref(),
        Some(&["/fn.sh".to_string()][..])
    );
    assert!(manifest.exists(), "the disk was read despite the live pin");

    // Once every pin is gone the lookup reads the disk: the torn manifest
    // is found, removed, and the image is not in the cache.
    drop(again);
    drop(found);
    assert_not_cached(&store, &pushed.reference).await;
    assert!(!manifest.exists());

    // Pulled again and remembered under a new pin, a lost layer dir is
    // still noticed (and re-extracted by the next pull).
    let pulled = pull_ok(&store, &pushed.reference, PullPolicy::IfNotPresent).await;
    let found = pull_ok(&store, &pushed.reference, PullPolicy::Never).await;
    std::fs::remove_dir_all(&found.layers[1]).unwrap();
    assert_not_cached(&store, &pushed.reference).await;
    let repaired = pull_ok(&store, &pushed.reference, PullPolicy::IfNotPresent).await;
    assert!(repaired.layers[1].join("fn.sh").is_file());
    drop((pulled, found));
}
