//! Pulling from a registry that demands basic auth (htpasswd).

use base64::Engine;
use xfn::image::{ImageErrorKind, ImageStore, PullPolicy, RegistryAuth, StoreOptions};
use xfn_testkit::*;

fn image() -> ImageBuilder {
    ImageBuilder::new().layer(Layer::new().file("/secret", 0o644, "s"))
}

#[tokio::test]
async fn right_credentials_pull_in_every_form() {
    let registry = Registry::start_with_auth("alice", "s3cret");
    let pushed = image().push(&registry, "private/fn:v1");
    let basic = RegistryAuth {
        username: "alice".into(),
        password: "s3cret".into(),
        ..Default::default()
    };
    let auth_field = RegistryAuth {
        auth: base64::engine::general_purpose::STANDARD.encode("alice:s3cret"),
        ..Default::default()
    };
    for auth in [basic, auth_field] {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path(), StoreOptions::default()).unwrap();
        let pulled = store
            .ensure(&pushed.reference, PullPolicy::Always, &auth)
            .await
            .unwrap();
        assert_eq!(pulled.digest, pushed.digest);
    }
}

#[tokio::test]
async fn wrong_or_missing_credentials_are_a_clear_auth_error() {
    let registry = Registry::start_with_auth("alice", "s3cret");
    let pushed = image().push(&registry, "private/fn:v1");
    let wrong = RegistryAuth {
        username: "alice".into(),
        password: "guess".into(),
        ..Default::default()
    };
    let bearer = RegistryAuth {
        registry_token: "not-a-token".into(),
        ..Default::default()
    };
    for auth in [wrong, RegistryAuth::default(), bearer] {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path(), StoreOptions::default()).unwrap();
        let err = store
            .ensure(&pushed.reference, PullPolicy::IfNotPresent, &auth)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ImageErrorKind::Unauthorized, "{auth:?}: {err}");
        let msg = err.to_string();
        assert!(msg.contains("credentials"), "{msg}");
        assert!(msg.contains(&registry.host()), "{msg}");
        assert!(store.list().unwrap().images.is_empty());
    }
}
