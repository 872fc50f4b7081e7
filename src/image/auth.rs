//! Registry credentials: what the runner API's `ImagePullAuth` carries, or
//! what the CLI finds in the docker config, turned into what oci-client sends.
//!
//! | given                       | sent                                                   |
//! |-----------------------------|--------------------------------------------------------|
//! | nothing                     | anonymous (a registry's bearer challenge is still met)  |
//! | `username` + `password`     | HTTP basic, or basic to the token service               |
//! | `auth` (base64 `user:pass`) | the same as username + password                         |
//! | `registry_token`            | `Authorization: Bearer <token>` as-is                   |
//! | `identity_token`            | basic `<token>:<identity token>` to the token service   |
//!
//! The identity token (an OAuth2 refresh token from `docker login`) is sent
//! as the password of the token-service request, under the user name
//! `<token>` unless one is given: the convention Azure, Google and Docker Hub
//! token services accept.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use base64::Engine;

use super::reference::{host_of, is_docker_hub};

/// The user name sent with an identity token when none is given.
const IDENTITY_TOKEN_USER: &str = "<token>";

/// Credentials for one pull. All empty means anonymous.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RegistryAuth {
    /// Basic auth user name.
    pub username: String,
    /// Basic auth password.
    pub password: String,
    /// Base64 `user:pass`, as in a docker config.
    pub auth: String,
    /// An OAuth refresh token.
    pub identity_token: String,
    /// A bearer token sent as-is.
    pub registry_token: String,
}

impl std::fmt::Debug for RegistryAuth {
    /// Never prints secrets: only which fields are set.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAuth")
            .field("username", &self.username)
            .field(
                "password",
                &(!self.password.is_empty()).then_some("<redacted>"),
            )
            .field("auth", &(!self.auth.is_empty()).then_some("<redacted>"))
            .field(
                "identity_token",
                &(!self.identity_token.is_empty()).then_some("<redacted>"),
            )
            .field(
                "registry_token",
                &(!self.registry_token.is_empty()).then_some("<redacted>"),
            )
            .finish()
    }
}

/// Errors reading or decoding credentials.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The `auth` field is not base64 of `user:password`.
    #[error("registry auth field is not base64 of user:password")]
    BadAuthField,
    /// The docker config cannot be read.
    #[error("cannot read docker config {path}")]
    ReadConfig {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The docker config is not valid JSON of the expected shape.
    #[error("cannot parse docker config {path}")]
    ParseConfig {
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
}

impl RegistryAuth {
    /// Whether no credential is set.
    pub fn is_anonymous(&self) -> bool {
        self.username.is_empty()
            && self.password.is_empty()
            && self.auth.is_empty()
            && self.identity_token.is_empty()
            && self.registry_token.is_empty()
    }

    /// What oci-client sends; see the module doc for the precedence.
    pub fn to_oci(&self) -> Result<oci_client::secrets::RegistryAuth, AuthError> {
        use oci_client::secrets::RegistryAuth as Oci;
        if !self.registry_token.is_empty() {
            return Ok(Oci::Bearer(self.registry_token.clone()));
        }
        if !self.identity_token.is_empty() {
            let user = if self.username.is_empty() {
                IDENTITY_TOKEN_USER.to_string()
            } else {
                self.username.clone()
            };
            return Ok(Oci::Basic(user, self.identity_token.clone()));
        }
        if !self.username.is_empty() || !self.password.is_empty() {
            return Ok(Oci::Basic(self.username.clone(), self.password.clone()));
        }
        if !self.auth.is_empty() {
            let (user, pass) = decode_auth_field(&self.auth)?;
            return Ok(Oci::Basic(user, pass));
        }
        Ok(Oci::Anonymous)
    }

    /// Credentials for `registry` from the docker config
    /// (`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`);
    /// anonymous when there is no config or no entry. Credential helpers
    /// (`credsStore`) are not run.
    pub fn from_docker_config(registry: &str) -> Result<RegistryAuth, AuthError> {
        match docker_config_path() {
            Some(path) if path.exists() => Self::from_docker_config_file(&path, registry),
            _ => Ok(RegistryAuth::default()),
        }
    }

    /// Credentials for `registry` from the docker config file at `path`.
    pub fn from_docker_config_file(path: &Path, registry: &str) -> Result<RegistryAuth, AuthError> {
        let data = std::fs::read(path).map_err(|source| AuthError::ReadConfig {
            path: path.to_path_buf(),
            source,
        })?;
        let config: DockerConfig =
            serde_json::from_slice(&data).map_err(|source| AuthError::ParseConfig {
                path: path.to_path_buf(),
                source,
            })?;
        let want = normalise_config_key(registry);
        let entry = config
            .auths
            .iter()
            .find(|(key, _)| normalise_config_key(key) == want)
            .map(|(_, entry)| entry);
        Ok(entry
            .map(|e| RegistryAuth {
                username: e.username.clone(),
                password: e.password.clone(),
                auth: e.auth.clone(),
                identity_token: e.identitytoken.clone(),
                registry_token: e.registrytoken.clone(),
            })
            .unwrap_or_default())
    }
}

/// Where the docker CLI keeps its config.
pub(crate) fn docker_config_path() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG") {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".docker").join("config.json"))
}

/// Splits base64 `user:password`.
fn decode_auth_field(auth: &str) -> Result<(String, String), AuthError> {
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(auth.trim())
        .map_err(|_| AuthError::BadAuthField)?;
    let decoded = String::from_utf8(decoded).map_err(|_| AuthError::BadAuthField)?;
    let (user, pass) = decoded.split_once(':').ok_or(AuthError::BadAuthField)?;
    Ok((user.to_string(), pass.to_string()))
}

/// Docker config keys are `host[:port]`, sometimes a URL
/// (`https://index.docker.io/v1/`): compare by `host[:port]`, Hub aliases as one.
fn normalise_config_key(key: &str) -> String {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let key = key.split('/').next().unwrap_or(key).to_ascii_lowercase();
    if is_docker_hub(&key) || is_docker_hub(host_of(&key)) {
        "docker.io".to_string()
    } else {
        key
    }
}

#[derive(Debug, Default, serde::Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: HashMap<String, DockerAuthEntry>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct DockerAuthEntry {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    auth: String,
    #[serde(default)]
    identitytoken: String,
    #[serde(default)]
    registrytoken: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_client::secrets::RegistryAuth as Oci;

    #[test]
    fn anonymous_by_default() {
        assert!(RegistryAuth::default().is_anonymous());
        assert_eq!(RegistryAuth::default().to_oci().unwrap(), Oci::Anonymous);
    }

    #[test]
    fn basic_from_fields_or_auth() {
        let a = RegistryAuth {
            username: "u".into(),
            password: "p".into(),
            ..Default::default()
        };
        assert_eq!(a.to_oci().unwrap(), Oci::Basic("u".into(), "p".into()));
        let b = RegistryAuth {
            auth: base64::engine::general_purpose::STANDARD.encode("alice:pa:ss"),
            ..Default::default()
        };
        assert_eq!(
            b.to_oci().unwrap(),
            Oci::Basic("alice".into(), "pa:ss".into())
        );
        let bad = RegistryAuth {
            auth: "!!!".into(),
            ..Default::default()
        };
        assert!(matches!(bad.to_oci(), Err(AuthError::BadAuthField)));
    }

    #[test]
    fn tokens() {
        let bearer = RegistryAuth {
            registry_token: "t".into(),
            username: "ignored".into(),
            ..Default::default()
        };
        assert_eq!(bearer.to_oci().unwrap(), Oci::Bearer("t".into()));
        let identity = RegistryAuth {
            identity_token: "refresh".into(),
            ..Default::default()
        };
        assert_eq!(
            identity.to_oci().unwrap(),
            Oci::Basic("<token>".into(), "refresh".into())
        );
    }

    #[test]
    fn debug_redacts_secrets() {
        let a = RegistryAuth {
            username: "u".into(),
            password: "hunter2".into(),
            ..Default::default()
        };
        assert!(!format!("{a:?}").contains("hunter2"));
    }

    #[test]
    fn docker_config_lookup_by_host() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(
            &path,
            r#"{"auths":{
                "https://index.docker.io/v1/":{"auth":"aHViOnB3"},
                "127.0.0.1:5000":{"username":"alice","password":"pw"},
                "ghcr.io":{"identitytoken":"id"}
            },"credsStore":"desktop"}"#,
        )
        .unwrap();
        let hub = RegistryAuth::from_docker_config_file(&path, "docker.io").unwrap();
        assert_eq!(hub.to_oci().unwrap(), Oci::Basic("hub".into(), "pw".into()));
        let local = RegistryAuth::from_docker_config_file(&path, "127.0.0.1:5000").unwrap();
        assert_eq!(local.username, "alice");
        let ghcr = RegistryAuth::from_docker_config_file(&path, "ghcr.io").unwrap();
        assert_eq!(ghcr.identity_token, "id");
        let none = RegistryAuth::from_docker_config_file(&path, "quay.io").unwrap();
        assert!(none.is_anonymous());
    }
}
