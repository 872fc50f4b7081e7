//! A real Distribution registry (`/usr/bin/docker-registry`, Debian package
//! `docker-registry`) on 127.0.0.1, one per test, with its own config and
//! storage in a temp dir. Killed when dropped.
use std::fs;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::http;

/// The registry binary the harness runs.
pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// User name and password of [`Registry::start_with_auth`].
#[derive(Debug, Clone)]
pub struct Credentials {
    /// The user name.
    pub username: String,
    /// The password.
    pub password: String,
}

/// A running `docker-registry serve` bound to a random free port on 127.0.0.1.
pub struct Registry {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    credentials: Option<Credentials>,
}

impl Registry {
    /// Starts an anonymous registry and waits until `/v2/` answers.
    ///
    /// Panics with a clear message when the registry binary is missing or
    /// does not come up: a test that needs it must not pass silently.
    pub fn start() -> Registry {
        Self::start_inner(None)
    }

    /// Starts a registry that demands HTTP basic auth (htpasswd, bcrypt) for
    /// every request, with one user `username:password`.
    pub fn start_with_auth(username: &str, password: &str) -> Registry {
        Self::start_inner(Some(Credentials {
            username: username.to_string(),
            password: password.to_string(),
        }))
    }

    fn start_inner(credentials: Option<Credentials>) -> Registry {
        assert!(
            Path::new(REGISTRY_BIN).exists(),
            "{REGISTRY_BIN} is missing: install the Debian package `docker-registry`"
        );
        // A port can be taken between probing and binding; retry a few times.
        let mut last_log = String::new();
        for _ in 0..5 {
            let dir = tempfile::Builder::new()
                .prefix("xfn-registry-")
                .tempdir()
                .expect("registry temp dir");
            let addr = free_loopback_addr();
            let config = write_config(dir.path(), addr, credentials.as_ref());
            let log = fs::File::create(dir.path().join("registry.log")).expect("registry log");
            let child = Command::new(REGISTRY_BIN)
                .arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("registry log"))
                .stderr(log)
                .spawn()
                .expect("spawn docker-registry");
            let mut registry = Registry {
                child,
                addr,
                dir,
                credentials: credentials.clone(),
            };
            if registry.wait_ready(Duration::from_secs(20)) {
                return registry;
            }
            last_log = registry.log();
        }
        panic!("docker-registry did not come up; its log:\n{last_log}");
    }

    fn wait_ready(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(100)).is_ok() {
                // 200 when anonymous, 401 with auth: either way it serves the API.
                if let Ok(resp) = http::request(self.addr, "GET", "/v2/", &[], &[]) {
                    if resp.status == 200 || resp.status == 401 {
                        return true;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        false
    }

    /// `127.0.0.1:PORT`: the registry part of image references.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// The socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `127.0.0.1:PORT/NAME` for a repository name like `fn:v1`.
    pub fn reference(&self, name: &str) -> String {
        format!("{}/{}", self.host(), name)
    }

    /// The credentials of an auth registry.
    pub fn credentials(&self) -> Option<&Credentials> {
        self.credentials.as_ref()
    }

    /// The registry's storage root (Distribution's filesystem driver layout).
    pub fn storage_dir(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    /// The file in the registry storage that holds a blob's bytes: overwrite
    /// it (same length) to make the registry serve a corrupt blob.
    pub fn blob_data_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
        self.storage_dir()
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Everything the registry logged so far (including its access log).
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// How many `GET` requests for a blob the registry served (from its
    /// access log): the observable count of downloads of that blob.
    pub fn blob_get_count(&self, digest: &str) -> usize {
        let needle = format!("/blobs/{digest}");
        self.log()
            .lines()
            .filter(|line| line.contains("\"GET ") && line.contains(&needle))
            .count()
    }

    /// The `Authorization` header value for pushes to an auth registry.
    pub fn auth_header(&self) -> Option<String> {
        self.credentials
            .as_ref()
            .map(|c| http::basic_auth(&c.username, &c.password))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_loopback_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr")
}

fn write_config(dir: &Path, addr: SocketAddr, credentials: Option<&Credentials>) -> PathBuf {
    let storage = dir.join("storage");
    fs::create_dir_all(&storage).expect("registry storage dir");
    let mut config = format!(
        "version: 0.1\n\
         log:\n  level: info\n  accesslog:\n    disabled: false\n\
         storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n\
         http:\n  addr: {addr}\n",
        storage = storage.display(),
    );
    if let Some(c) = credentials {
        // Distribution only accepts bcrypt entries in htpasswd files.
        let hash = bcrypt::hash(&c.password, 4).expect("bcrypt");
        let htpasswd = dir.join("htpasswd");
        fs::write(&htpasswd, format!("{}:{}\n", c.username, hash)).expect("write htpasswd");
        config.push_str(&format!(
            "auth:\n  htpasswd:\n    realm: xfn-test\n    path: {}\n",
            htpasswd.display()
        ));
    }
    let path = dir.join("config.yml");
    fs::write(&path, config).expect("write registry config");
    path
}
