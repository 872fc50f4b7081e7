//! A throw-away CA and a server certificate for a test registry, made with
//! the `openssl` command (Debian package `openssl`).
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
