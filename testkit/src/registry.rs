//! A real Distribution registry (`/usr/bin/docker-registry`, Debian package
//! `docker-registry`) on 127.0.0.1, one per test, with its own config and
//! storage in a temp dir. Killed when dropped. [`hostile`] is the other
//! kind: a registry that misbehaves on purpose.
pub mod hostile;

use std::fs;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
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

/// A running `docker-registry serve` bound to a random free port.
pub struct Registry {
    /// `None` for a registry someone else runs ([`Registry::connect`]).
    child: Option<Child>,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    storage: PathBuf,
    credentials: Option<Credentials>,
    tls: Option<super::tls::TlsFiles>,
}

/// How to start a registry; [`Registry::start`] and friends cover the
/// usual cases.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// Demand basic auth with these credentials (htpasswd).
    pub credentials: Option<Credentials>,
    /// Address to listen on (127.0.0.1 by default).
    pub ip: IpAddr,
    /// Serve HTTPS with a certificate for `ip` from a fresh test CA.
    pub tls: bool,
    /// Serve this storage dir (another registry's) instead of a new one.
    pub storage: Option<PathBuf>,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            credentials: None,
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            tls: false,
            storage: None,
        }
    }
}

impl Registry {
    /// Starts an anonymous plain-HTTP registry on 127.0.0.1 and waits until
    /// `/v2/` answers.
    ///
    /// Panics with a clear message when the registry binary is missing or
    /// does not come up: a test that needs it must not pass silently.
    pub fn start() -> Registry {
        Self::start_config(RegistryConfig::default())
    }

    /// Starts a registry that demands HTTP basic auth (htpasswd, bcrypt) for
    /// every request, with one user `username:password`.
    pub fn start_with_auth(username: &str, password: &str) -> Registry {
        Self::start_config(RegistryConfig {
            credentials: Some(Credentials {
                username: username.to_string(),
                password: password.to_string(),
            }),
            ..Default::default()
        })
    }

    /// A second registry serving this one's storage on `ip` (e.g. a
    /// non-loopback address, which clients reach over HTTPS), with TLS or
    /// not. Push to `self` (plain HTTP on loopback); pull from the frontend.
    pub fn frontend(&self, ip: IpAddr, tls: bool) -> Registry {
        Self::start_config(RegistryConfig {
            credentials: self.credentials.clone(),
            ip,
            tls,
            storage: Some(self.storage.clone()),
        })
    }

    /// Starts a registry as `config` says.
    pub fn start_config(config: RegistryConfig) -> Registry {
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
            let addr = free_addr(config.ip);
            let storage = config
                .storage
                .clone()
                .unwrap_or_else(|| dir.path().join("storage"));
            let tls = config
                .tls
                .then(|| super::tls::TlsFiles::generate(dir.path(), config.ip));
            let config_path = write_config(
                dir.path(),
                addr,
                &storage,
                config.credentials.as_ref(),
                tls.as_ref(),
            );
            let log = fs::File::create(dir.path().join("registry.log")).expect("registry log");
            let child = Command::new(REGISTRY_BIN)
                .arg("serve")
                .arg(&config_path)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("registry log"))
                .stderr(log)
                .spawn()
                .expect("spawn docker-registry");
            let mut registry = Registry {
                child: Some(child),
                addr,
                dir,
                storage,
                credentials: config.credentials.clone(),
                tls,
            };
            if registry.wait_ready(Duration::from_secs(20)) {
                return registry;
            }
            last_log = registry.log();
        }
        panic!("docker-registry did not come up; its log:\n{last_log}");
    }

    /// A handle on a registry already listening at `addr` (e.g. started by
    /// a benchmark script), to push to it; nothing is started or killed, and
    /// [`Registry::log`] and the storage paths are empty.
    pub fn connect(addr: SocketAddr) -> Registry {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut registry = Registry {
            child: None,
            addr,
            storage: dir.path().join("storage"),
            dir,
            credentials: None,
            tls: None,
        };
        assert!(
            registry.wait_ready(Duration::from_secs(10)),
            "no registry answers at {addr}"
        );
        registry
    }

    /// The PEM CA bundle that signs a TLS registry's certificate.
    pub fn ca_bundle(&self) -> Option<&Path> {
        self.tls.as_ref().map(|t| t.ca.as_path())
    }

    fn wait_ready(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(_)) = child.try_wait() {
                    return false;
                }
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(100)).is_ok() {
                // 200 when anonymous, 401 with auth: either way it serves
                // the API. A TLS server answers plain HTTP with a 400.
                if let Ok(resp) = http::request(self.addr, "GET", "/v2/", &[], &[]) {
                    let ok = if self.tls.is_some() {
                        resp.status == 400
                    } else {
                        resp.status == 200 || resp.status == 401
                    };
                    if ok {
                        return true;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        false
    }

    /// `IP:PORT`: the registry part of image references.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// The socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `IP:PORT/NAME` for a repository name like `fn:v1`.
    pub fn reference(&self, name: &str) -> String {
        format!("{}/{}", self.host(), name)
    }

    /// The credentials of an auth registry.
    pub fn credentials(&self) -> Option<&Credentials> {
        self.credentials.as_ref()
    }

    /// The registry's storage root (Distribution's filesystem driver layout).
    pub fn storage_dir(&self) -> PathBuf {
        self.storage.clone()
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
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_addr(ip: IpAddr) -> SocketAddr {
    let listener = TcpListener::bind((ip, 0)).expect("bind a free port");
    listener.local_addr().expect("local addr")
}

/// The host's first non-loopback IPv4 address (from `hostname -I`): a
/// registry there is not "loopback", so clients use HTTPS unless told
/// otherwise. Panics when the host has none.
pub fn non_loopback_ip() -> IpAddr {
    let out = Command::new("hostname")
        .arg("-I")
        .output()
        .expect("run `hostname -I`");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|a| a.parse::<IpAddr>().ok())
        .find(|ip| ip.is_ipv4() && !ip.is_loopback())
        .expect(
            "this test needs a non-loopback IPv4 address on the host (`hostname -I` shows none)",
        )
}

fn write_config(
    dir: &Path,
    addr: SocketAddr,
    storage: &Path,
    credentials: Option<&Credentials>,
    tls: Option<&super::tls::TlsFiles>,
) -> PathBuf {
    fs::create_dir_all(storage).expect("registry storage dir");
    let mut config = format!(
        "version: 0.1\n\
         log:\n  level: info\n  accesslog:\n    disabled: false\n\
         storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n\
         http:\n  addr: {addr}\n",
        storage = storage.display(),
    );
    if let Some(tls) = tls {
        config.push_str(&format!(
            "  tls:\n    certificate: {}\n    key: {}\n",
            tls.cert.display(),
            tls.key.display()
        ));
    }
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
