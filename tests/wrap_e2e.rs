//! `xfn wrap` end to end: a function image and a base image built here and
//! pushed to a real `docker-registry` on 127.0.0.1, the function saved as a
//! `docker save` tarball by skopeo, wrapped by the real binary, pushed, and
//! pulled back by skopeo (a client no one here wrote) to check the config,
//! the layers and `package.yaml`.
//!
//! Needs: docker-registry, busybox-static, skopeo.
mod support;

use std::io::Read;
use std::path::Path;
use std::process::Command;

use serde_json::Value;
use support::*;

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
    assert_eq!(package["apiVersion"], "meta.pkg.crossplane.io/v1beta1");
    assert_eq!(package["kind"], "Function");
    assert_eq!(package["metadata"]["name"], "my-function");
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
        .layer(Layer::new().file("/usr/local/bin/xfn", 0o755, "#!/bin/sh\n"))
        .env(["PATH=/usr/local/bin:/bin"])
        .cmd(["/bin/sh"])
        .push(&registry, "adaptor-base:v1");
    let function_tar = dir.path().join("function.tar");
    skopeo(&[
        "copy",
        "--src-tls-verify=false",
        &format!("docker://{}", function.reference),
        &format!("docker-archive:{}", function_tar.display()),
    ]);
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
    let pulled = dir.path().join("pulled");
    skopeo(&[
        "copy",
        "--src-tls-verify=false",
        &format!("docker://{target}"),
        &format!("oci:{}:wrapped", pulled.display()),
    ]);
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
