//! Registries that are not on loopback: HTTPS by default (trusting a custom
//! CA bundle), plain HTTP only when named with `--insecure-registry`.
//! Needs a non-loopback IPv4 address on the host and `openssl`.

use xfn::image::{ImageErrorKind, ImageStore, PullPolicy, RegistryAuth, StoreOptions};
use xfn_testkit::*;

fn image() -> ImageBuilder {
    ImageBuilder::new().layer(Layer::new().file("/x", 0o644, "x"))
}

#[tokio::test]
async fn https_with_a_custom_ca_bundle() {
    let origin = Registry::start();
    let pushed = image().push(&origin, "fn:v1");
    let tls = origin.frontend(non_loopback_ip(), true);
    let reference = tls.reference("fn:v1");

    // Without the CA the certificate is not trusted.
    let dir = tempfile::tempdir().unwrap();
    let err = ImageStore::open(dir.path(), StoreOptions::default())
        .unwrap()
        .ensure(
            &reference,
            PullPolicy::IfNotPresent,
            &RegistryAuth::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ImageErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("https://"), "{err}");

    let store = ImageStore::open(
        dir.path(),
        StoreOptions {
            ca_bundle: Some(tls.ca_bundle().unwrap().to_path_buf()),
            ..Default::default()
        },
    )
    .unwrap();
    let pulled = store
        .ensure(
            &reference,
            PullPolicy::IfNotPresent,
            &RegistryAuth::default(),
        )
        .await
        .unwrap();
    assert_eq!(pulled.digest, pushed.digest);

    // The CLI takes the bundle from CA_BUNDLE_PATH too.
    let cache = tempfile::tempdir().unwrap();
    let out = xfn_command()
        .env("CA_BUNDLE_PATH", tls.ca_bundle().unwrap())
        .args(["pull", "--cache-dir"])
        .arg(cache.path())
        .arg(&reference)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn plain_http_only_for_insecure_registries() {
    let origin = Registry::start();
    let pushed = image().push(&origin, "fn:v1");
    let plain = origin.frontend(non_loopback_ip(), false);
    let reference = plain.reference("fn:v1");
    let pull = |extra: &[String]| {
        let cache = tempfile::tempdir().unwrap();
        xfn_command()
            .arg("pull")
            .args(extra)
            .arg("--cache-dir")
            .arg(cache.path())
            .arg(&reference)
            .output()
            .unwrap()
    };
    let out = pull(&[]);
    assert!(
        !out.status.success(),
        "HTTPS to a plain HTTP registry must fail"
    );
    let out = pull(&["--insecure-registry".to_string(), plain.host()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&pushed.digest));
}
