//! `xfn wrap` end to end: a function image and a base image built here and
//! pushed to a real `docker-registry` on 127.0.0.1, the function saved as a
//! `docker save` tarball by skopeo, wrapped by the real binary, pushed, and
//! pulled back by skopeo (a client no one here wrote) to check the config,
//! the layers and `package.yaml`.
//!
//! Needs: docker-registry, busybox-static, skopeo.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use xfn_testkit::*;

fn skopeo(args: &[&str]) {
    let out = Command::new("skopeo")
        .args(args)
        .output()
        .expect("run skopeo");
    assert!(
        out.status.success(),
        "skopeo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `reference`, copied by skopeo from the registry into
/// `dir`/function.tar as `docker save` writes it.
fn saved(dir: &Path, reference: &str) -> PathBuf {
    let tar = dir.join("function.tar");
    skopeo(&[
        "copy",
        "--src-tls-verify=false",
        &format!("docker://{reference}"),
        &format!("docker-archive:{}", tar.display()),
    ]);
    tar
}

/// `target`, pulled back by skopeo into the OCI layout `dir`/pulled (tag
/// `wrapped`).
fn pulled_back(dir: &Path, target: &str) -> PathBuf {
    let pulled = dir.join("pulled");
    skopeo(&[
        "copy",
        "--src-tls-verify=false",
        &format!("docker://{target}"),
        &format!("oci:{}:wrapped", pulled.display()),
    ]);
    pulled
}

fn blob(layout: &Path, digest: &str) -> Vec<u8> {
    std::fs::read(
        layout
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:")),
    )
    .unwrap()
}

/// The files of a gzipped layer tar, by path.
fn files_of(gzipped: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(gzipped));
    archive
        .entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let path = e.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            (path, data)
        })
        .collect()
}

/// Checks a wrapped image in an OCI layout dir against its inputs.
fn check_wrapped(layout: &Path, base: &PushedImage, function_tar: &[u8]) {
    let index: Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let manifest: Value = serde_json::from_slice(&blob(
        layout,
        index["manifests"][0]["digest"].as_str().unwrap(),
    ))
    .unwrap();
    let layers = manifest["layers"].as_array().unwrap();
    let base_layers = &base.image.layers;
    assert_eq!(layers.len(), base_layers.len() + 2, "{manifest}");
    for (layer, base_layer) in layers.iter().zip(base_layers) {
        assert_eq!(layer["digest"], base_layer.digest.as_str());
    }

    let package_layer = &layers[base_layers.len()];
    assert_eq!(package_layer["annotations"]["io.crossplane.xpkg"], "base");
    let files = files_of(&blob(layout, package_layer["digest"].as_str().unwrap()));
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].0, "package.yaml");
    let package: yaml_serde::Value = yaml_serde::from_slice(&files[0].1).unwrap();
    assert_eq!(package["apiVersion"], "meta.pkg.crossplane.io/v1");
    assert_eq!(package["kind"], "Function");
    assert_eq!(package["metadata"]["name"], "my-function");
    // Crossplane uses a Function in an Operation only with `operation`.
    assert_eq!(package["spec"]["capabilities"][0], "composition");
    assert_eq!(package["spec"]["capabilities"][1], "operation");
    assert_eq!(
        package["metadata"]["annotations"]["meta.crossplane.io/maintainer"],
        "Team <team@example.com>"
    );

    let function_layer = &layers[base_layers.len() + 1];
    let files = files_of(&blob(layout, function_layer["digest"].as_str().unwrap()));
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].0, "function.tar");
    assert!(
        files[0].1 == function_tar,
        "function.tar differs from the input"
    );

    let config: Value = serde_json::from_slice(&blob(
        layout,
        manifest["config"]["digest"].as_str().unwrap(),
    ))
    .unwrap();
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["xfn", "adapt", "--image-tarball", "/function.tar"])
    );
    assert!(config["config"].get("Cmd").is_none(), "{config}");
    assert_eq!(config["config"]["Env"][0], "PATH=/usr/local/bin:/bin");
    assert_eq!(
        config["rootfs"]["diff_ids"].as_array().unwrap().len(),
        layers.len()
    );
}

#[test]
fn wrapped_images_push_and_write_with_their_package_metadata() {
    let registry = Registry::start();
    let dir = world_traversable_tempdir();
    let function = ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(Layer::new().file("/fn.sh", 0o755, "#!/bin/sh\ncat >/dev/null\necho {}\n"))
        .entrypoint(["/bin/sh", "/fn.sh"])
        .push(&registry, "wrap-fn:v1");
    let base = ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(
            Layer::new()
                .file("/usr/local/bin/xfn", 0o755, "#!/bin/sh\n")
                .file("/usr/local/bin/crun", 0o755, "#!/bin/sh\n"),
        )
        .env(["PATH=/usr/local/bin:/bin"])
        .cmd(["/bin/sh"])
        .push(&registry, "adaptor-base:v1");
    let function_tar = saved(dir.path(), &function.reference);
    let function_bytes = std::fs::read(&function_tar).unwrap();
    let target = format!("{}/wrapped:v1", registry.host());
    let wrap = |destination: &[&str]| {
        let out = xfn_command()
            .args(["wrap", "--function"])
            .arg(&function_tar)
            .args(["--base", &base.reference, "--tag", &target])
            .args(["--name", "my-function"])
            .args([
                "--annotation",
                "meta.crossplane.io/maintainer=Team <team@example.com>",
            ])
            .args(destination)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "xfn wrap: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };

    // Pushed, pulled back by skopeo.
    wrap(&["--push"]);
    let pulled = pulled_back(dir.path(), &target);
    check_wrapped(&pulled, &base, &function_bytes);

    // Written as an OCI layout tarball, read by skopeo.
    let archive = dir.path().join("wrapped.tar");
    wrap(&["--output", archive.to_str().unwrap()]);
    let unpacked = dir.path().join("from-archive");
    skopeo(&[
        "copy",
        &format!("oci-archive:{}", archive.display()),
        &format!("oci:{}:wrapped", unpacked.display()),
    ]);
    check_wrapped(&unpacked, &base, &function_bytes);
}

/// The manifest digest `tag` has in `registry` (skopeo inspect), if any.
fn digest_of(tag: &str) -> Option<String> {
    let out = Command::new("skopeo")
        .args(["inspect", "--tls-verify=false", &format!("docker://{tag}")])
        .output()
        .expect("run skopeo");
    out.status.success().then(|| {
        let info: Value = serde_json::from_slice(&out.stdout).unwrap();
        info["Digest"].as_str().unwrap().to_string()
    })
}

#[test]
fn a_wrong_function_or_base_fails_before_the_good_tag_is_overwritten() {
    let registry = Registry::start();
    let dir = world_traversable_tempdir();
    let function = ImageBuilder::new()
        .layer(Layer::busybox())
        .entrypoint(["/bin/sh", "-c", "cat"])
        .push(&registry, "wrap-fn:v1");
    let good_base = ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(
            Layer::new()
                .file("/usr/bin/xfn", 0o755, "#!/bin/sh\n")
                .file("/usr/bin/crun", 0o755, "#!/bin/sh\n"),
        )
        .push(&registry, "adaptor-base:v1");
    // busybox alone: no xfn, no crun.
    let function_as_base = function.reference.clone();
    let function_tar = saved(dir.path(), &function.reference);
    let script = dir.path().join("fn.sh");
    std::fs::write(&script, "#!/bin/sh\ncat\n").unwrap();
    let metadata = dir.path().join("crossplane.yaml");
    std::fs::write(
        &metadata,
        "apiVersion: meta.pkg.crossplane.io/v1\nkind: Function\nmetadata:\n  name: theirs\n  \
         annotations: {meta.crossplane.io/source: github.com/me/fn}\nspec:\n  \
         crossplane: {version: '>=v2.0.0'}\n",
    )
    .unwrap();
    let target = format!("{}/wrapped:v1", registry.host());
    let wrap = |function: &Path, base: &str, extra: &[&str]| {
        xfn_command()
            .args(["wrap", "--function"])
            .arg(function)
            .args(["--base", base, "--tag", &target, "--push"])
            .args(extra)
            .output()
            .unwrap()
    };

    // A good wrap, from the user's package metadata, composition only.
    let out = wrap(
        &function_tar,
        &good_base.reference,
        &[
            "--package-metadata",
            metadata.to_str().unwrap(),
            "--capability",
            "composition",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let good = digest_of(&target).expect("pushed");
    let pulled = pulled_back(dir.path(), &target);
    let index: Value =
        serde_json::from_slice(&std::fs::read(pulled.join("index.json")).unwrap()).unwrap();
    let manifest: Value = serde_json::from_slice(&blob(
        &pulled,
        index["manifests"][0]["digest"].as_str().unwrap(),
    ))
    .unwrap();
    let layers = manifest["layers"].as_array().unwrap();
    let package_layer = layers
        .iter()
        .find(|l| l["annotations"]["io.crossplane.xpkg"] == "base")
        .unwrap();
    let files = files_of(&blob(&pulled, package_layer["digest"].as_str().unwrap()));
    let package: Value = yaml_serde::from_slice(&files[0].1).unwrap();
    assert_eq!(package["metadata"]["name"], "theirs");
    assert_eq!(
        package["metadata"]["annotations"]["meta.crossplane.io/source"],
        "github.com/me/fn"
    );
    assert_eq!(package["spec"]["crossplane"]["version"], ">=v2.0.0");
    assert_eq!(
        package["spec"]["capabilities"],
        serde_json::json!(["composition"])
    );

    // Each wrong input fails naming it, and the tag keeps the good image.
    for (function, base, expected) in [
        (
            script.as_path(),
            good_base.reference.as_str(),
            "not an image tarball",
        ),
        (
            metadata.as_path(),
            good_base.reference.as_str(),
            "not an image tarball",
        ),
        (
            function_tar.as_path(),
            function_as_base.as_str(),
            "holds no xfn and no crun on its PATH",
        ),
    ] {
        let out = wrap(function, base, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(expected),
            "{function:?} {base}: {err}"
        );
        assert_eq!(digest_of(&target).as_deref(), Some(good.as_str()), "{err}");
    }
    // A package metadata file that is not a Function's.
    std::fs::write(
        &metadata,
        "apiVersion: meta.pkg.crossplane.io/v1\nkind: Provider\n",
    )
    .unwrap();
    let out = wrap(
        &function_tar,
        &good_base.reference,
        &["--package-metadata", metadata.to_str().unwrap()],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("expected a meta.pkg.crossplane.io Function"),
        "{err}"
    );
    assert_eq!(digest_of(&target).as_deref(), Some(good.as_str()));
}
