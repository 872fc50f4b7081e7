//! Registry credentials (owned by the image work).

/// Credentials for one pull: what the runner API's `ImagePullAuth` carries,
/// or what the docker config gives the CLI. All empty means anonymous.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
