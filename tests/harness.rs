//! Self-tests of the test kit (testkit/): the registry comes up, accepts
//! pushes (with and without auth) and serves them back intact.
use xfn_testkit::http;
use xfn_testkit::*;

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

/// With `autotests = false` a test file no binary declares would never be
/// built or run, and nothing would say so: every file of tests/ must be a
/// module of exactly one binary of Cargo.toml, or such a binary itself.
#[test]
fn every_test_file_belongs_to_exactly_one_test_binary() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(repo.join("Cargo.toml")).unwrap();
    let roots: Vec<String> = manifest
        .lines()
        .filter_map(|line| line.strip_prefix("path = \"tests/"))
        .filter_map(|rest| rest.strip_suffix('"'))
        // A test binary's root is a file of tests/ itself; deeper paths
        // are other targets' (the fn_server example in tests/fixtures/).
        .filter(|path| !path.contains('/'))
        .map(str::to_string)
        .collect();
    assert!(roots.len() >= 5, "test binaries in Cargo.toml: {roots:?}");
    let mut declared: Vec<String> = roots.clone();
    for root in &roots {
        let text = std::fs::read_to_string(repo.join("tests").join(root)).unwrap();
        declared.extend(
            text.lines()
                .filter_map(|line| line.strip_prefix("#[path = \""))
                .filter_map(|rest| rest.strip_suffix("\"]"))
                .filter(|path| !path.contains('/'))
                .map(str::to_string),
        );
    }
    let mut files: Vec<String> = std::fs::read_dir(repo.join("tests"))
        .unwrap()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".rs"))
        .collect();
    files.sort();
    for file in &files {
        let times = declared.iter().filter(|d| *d == file).count();
        assert_eq!(times, 1, "tests/{file} is declared {times} times (Cargo.toml [[test]] paths and their #[path] modules)");
    }
    for name in &declared {
        assert!(files.contains(name), "{name} is declared but not in tests/");
    }
}

/// The test kit is one crate, testkit/: Rust source in a folder of tests/
/// would be a second kit compiled into each binary by path (as
/// tests/support and tests/server_common were). The one exception is a
/// fixture Cargo.toml builds as a target of its own.
#[test]
fn no_test_support_lives_in_a_folder_of_tests() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(repo.join("Cargo.toml")).unwrap();
    let mut stray = Vec::new();
    let mut dirs = vec![repo.join("tests")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let relative = path
                .strip_prefix(repo)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let nested = path.parent() != Some(repo.join("tests").as_path());
            let source = relative.ends_with(".rs") || relative.ends_with(".c");
            if nested && source && !manifest.contains(&format!("path = \"{relative}\"")) {
                stray.push(relative);
            }
        }
    }
    assert!(stray.is_empty(), "test support outside testkit/: {stray:?}");
}
