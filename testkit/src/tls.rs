//! Throw-away CAs and certificates made with the `openssl` command (Debian
//! package `openssl`): a server certificate for a test registry
//! ([`TlsFiles`]), and mutual-TLS certificates for Functions
//! ([`mtls_certs`]).
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// PEM files of a test CA and a server certificate signed by it.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The CA certificate: what a client trusts (`--ca-bundle-path`).
    pub ca: PathBuf,
    /// The server certificate (SAN `IP:<ip>`).
    pub cert: PathBuf,
    /// The server key.
    pub key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run openssl (install the Debian package `openssl`)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl TlsFiles {
    /// Generates a CA and a certificate for `ip` in `dir`.
    pub fn generate(dir: &Path, ip: IpAddr) -> TlsFiles {
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca_args = vec!["req", "-x509"];
        ca_args.extend(ec);
        ca_args.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=xfn test CA",
        ]);
        openssl(dir, &ca_args);
        let mut csr_args = vec!["req"];
        csr_args.extend(ec);
        csr_args.extend([
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=xfn test registry",
        ]);
        openssl(dir, &csr_args);
        std::fs::write(
            dir.join("server.ext"),
            format!(
                "subjectAltName=IP:{ip}\nbasicConstraints=CA:FALSE\n\
                 keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
            ),
        )
        .expect("write server.ext");
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.pem",
                "-days",
                "2",
                "-extfile",
                "server.ext",
            ],
        );
        TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
        }
    }
}

/// A CA and a certificate it signs for `name` (`<name>.crt`, `<name>.key`).
fn make_ca(dir: &Path, ca: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{ca}.key"),
            "-out",
            &format!("{ca}.crt"),
            "-subj",
            &format!("/CN={ca}"),
            "-days",
            "2",
        ],
    );
}

fn sign(dir: &Path, ca: &str, name: &str, extensions: &str) {
    std::fs::write(dir.join(format!("{name}.ext")), extensions).unwrap();
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={name}"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.crt"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &format!("{name}.crt"),
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
        ],
    );
}

/// Certificates for mutual TLS, as Crossplane deploys a Function: server
/// certs in `dir/server` (`tls.crt`, `tls.key`, `ca.crt`) for
/// `localhost`/127.0.0.1, and in `dir` the CA (`ca.crt`), a client
/// certificate it signed (`client.crt`, `client.key`) and one another CA
/// signed (`stranger.*`). Returns `dir/server`.
pub fn mtls_certs(dir: &Path) -> PathBuf {
    make_ca(dir, "ca");
    make_ca(dir, "other-ca");
    sign(
        dir,
        "ca",
        "server",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    );
    sign(dir, "ca", "client", "extendedKeyUsage=clientAuth\n");
    sign(dir, "other-ca", "stranger", "extendedKeyUsage=clientAuth\n");
    let server = dir.join("server");
    std::fs::create_dir_all(&server).unwrap();
    std::fs::copy(dir.join("server.crt"), server.join("tls.crt")).unwrap();
    std::fs::copy(dir.join("server.key"), server.join("tls.key")).unwrap();
    std::fs::copy(dir.join("ca.crt"), server.join("ca.crt")).unwrap();
    server
}
