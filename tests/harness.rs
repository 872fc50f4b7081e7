//! Self-tests of the shared test harness (tests/support): the registry comes
//! up, accepts pushes (with and without auth) and serves them back intact.
mod support;

use support::http;
use support::*;

#[test]
fn pushes_and_serves_an_image() {
    let registry = Registry::start();
    let pushed = ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(Layer::new().file("/fn.sh", 0o755, "#!/bin/sh\ncat\n"))
        .entrypoint(["/fn.sh"])
        .push(&registry, "fn:v1");
    let resp = http::request(
        registry.addr(),
        "GET",
        "/v2/fn/manifests/v1",
        &[("Accept", "application/vnd.oci.image.manifest.v1+json")],
        &[],
    )
    .unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(sha256_digest(&resp.body), pushed.digest);
    let layer = &pushed.image.layers[1];
    let resp = http::request(
        registry.addr(),
        "GET",
        &format!("/v2/fn/blobs/{}", layer.digest),
        &[],
        &[],
    )
    .unwrap();
    assert_eq!(resp.body, layer.data);
    assert_eq!(registry.blob_get_count(&layer.digest), 1);
    assert!(registry.blob_data_path(&layer.digest).is_file());
}

#[test]
fn builds_are_deterministic() {
    let build = || {
        ImageBuilder::new()
            .layer(
                Layer::new()
                    .dir("/a", 0o755)
                    .file("/a/b", 0o644, "x")
                    .fifo("/p", 0o600),
            )
            .layer(
                Layer::new()
                    .compression(Compression::Zstd)
                    .whiteout("/a/b")
                    .opaque("/a")
                    .hardlink("/h", "/p"),
            )
            .build()
    };
    assert_eq!(build().digest, build().digest);
}

#[test]
fn auth_registry_rejects_anonymous_and_accepts_pushes_with_credentials() {
    let registry = Registry::start_with_auth("alice", "s3cret");
    let resp = http::request(registry.addr(), "GET", "/v2/", &[], &[]).unwrap();
    assert_eq!(resp.status, 401);
    let pushed = ImageBuilder::new()
        .layer(Layer::new().file("/x", 0o644, "x"))
        .push(&registry, "private/fn:v1");
    let auth = http::basic_auth("alice", "s3cret");
    let resp = http::request(
        registry.addr(),
        "GET",
        "/v2/private/fn/manifests/v1",
        &[
            ("Accept", "application/vnd.oci.image.manifest.v1+json"),
            ("Authorization", &auth),
        ],
        &[],
    )
    .unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(sha256_digest(&resp.body), pushed.digest);
}
