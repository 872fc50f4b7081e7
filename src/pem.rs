//! PEM files xfn is given: `xfn adapt --tls-dir` (`tls.crt`, `tls.key`,
//! `ca.crt`), `xfn host --ca` (`tls.crt`, `tls.key`), a registry CA bundle
//! (`--ca-bundle-path`). Read and parsed in one place, so every command
//! says the same about the same bad file; `grpc::sni::mutual_tls` builds
//! the servers' configuration from what this returns.
//!
//! # Invariants
//! - **An error names the file and what it should hold**: one that cannot
//!   be read keeps its `io::Error` as the source; one that can but holds
//!   nothing of the kind (or a malformed PEM section) says so.
//! - **A certificate file holds at least one certificate**: an empty list
//!   is an error here, never an empty chain or root store later.
//! - **At most [`MAX_PEM_BYTES`] are read**: a path to a device or a
//!   runaway file costs xfn no more.
use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Errors of reading a PEM file.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    /// The file could not be read.
    #[error("cannot read the PEM {what} in {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What it should hold.
        what: &'static str,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// The file is longer than any PEM file of certificates or a key.
    #[error("{path} is no PEM {what}: it is longer than {max} bytes")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// What it should hold.
        what: &'static str,
        /// [`MAX_PEM_BYTES`].
        max: u64,
    },
    /// The file holds no PEM `what` (none, or a malformed one).
    #[error("{path} holds no PEM {what}")]
    NoPem {
        /// The file.
        path: PathBuf,
        /// What it should hold.
        what: &'static str,
    },
}

/// The most bytes of a PEM file read: a CA bundle of every public root
/// is ~200 KiB; a path to a device or a runaway file (`--ca /dev/zero`)
/// costs xfn no more than this.
const MAX_PEM_BYTES: u64 = 4 << 20;

/// The file `path`, which should hold a `what` (at most [`MAX_PEM_BYTES`]).
fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, PemError> {
    use std::io::Read;
    let mut pem = Vec::new();
    let read = std::fs::File::open(path)
        .and_then(|file| file.take(MAX_PEM_BYTES + 1).read_to_end(&mut pem));
    let path = path.to_path_buf();
    match read {
        Ok(n) if n as u64 > MAX_PEM_BYTES => Err(PemError::TooLarge {
            path,
            what,
            max: MAX_PEM_BYTES,
        }),
        Ok(_) => Ok(pem),
        Err(source) => Err(PemError::Read { path, what, source }),
    }
}

/// Every certificate of the PEM file `path`, in order; none is an error.
pub(crate) fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let what = "certificate";
    let pem = read(path, what)?;
    match CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>() {
        Ok(certs) if !certs.is_empty() => Ok(certs),
        _ => Err(PemError::NoPem {
            path: path.to_path_buf(),
            what,
        }),
    }
}

/// The first private key of the PEM file `path` (PKCS#1, SEC1 or PKCS#8).
pub(crate) fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, PemError> {
    let what = "private key";
    let pem = read(path, what)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|_| PemError::NoPem {
        path: path.to_path_buf(),
        what,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_keeps_its_cause_and_an_empty_one_says_what_it_lacks() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        match certificates(&dir.path().join("tls.crt")) {
            Err(err @ PemError::Read { .. }) => {
                let text = crate::chain::Chain(&err).to_string();
                assert!(
                    text.starts_with("cannot read the PEM certificate in "),
                    "{text}"
                );
                assert!(text.ends_with("tls.crt: No such file or directory (os error 2)"));
            }
            other => panic!("a missing file must be a read error: {other:?}"),
        }
        std::fs::write(dir.path().join("tls.key"), "no key here\n")
            .unwrap_or_else(|e| panic!("{e}"));
        match private_key(&dir.path().join("tls.key")) {
            Err(err @ PemError::NoPem { .. }) => {
                let text = err.to_string();
                assert!(text.ends_with("tls.key holds no PEM private key"), "{text}");
            }
            other => panic!("a file with no key must say so: {other:?}"),
        }
        std::fs::write(dir.path().join("ca.crt"), "").unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            certificates(&dir.path().join("ca.crt")),
            Err(PemError::NoPem {
                what: "certificate",
                ..
            })
        ));
    }

    #[test]
    fn a_file_that_never_ends_is_refused_after_the_largest_pem_file() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("tls.crt"))
            .unwrap_or_else(|e| panic!("{e}"));
        match certificates(&dir.path().join("tls.crt")) {
            Err(err @ PemError::TooLarge { .. }) => {
                let text = err.to_string();
                assert!(
                    text.ends_with(
                        "tls.crt is no PEM certificate: it is longer than 4194304 bytes"
                    ),
                    "{text}"
                );
            }
            other => panic!("/dev/zero must be refused as too large: {other:?}"),
        }
    }

    #[test]
    fn every_certificate_of_a_file_and_its_key_are_read() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let mut pem = String::new();
        let mut key = None;
        for _ in 0..2 {
            let pair = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
            let params = rcgen::CertificateParams::new(vec!["fn.example".to_string()])
                .unwrap_or_else(|e| panic!("{e}"));
            let cert = params.self_signed(&pair).unwrap_or_else(|e| panic!("{e}"));
            pem.push_str(&cert.pem());
            key = Some(pair.serialize_pem());
        }
        std::fs::write(dir.path().join("tls.crt"), pem).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.path().join("tls.key"), key.unwrap_or_default())
            .unwrap_or_else(|e| panic!("{e}"));
        let certs = certificates(&dir.path().join("tls.crt")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(certs.len(), 2);
        assert!(private_key(&dir.path().join("tls.key")).is_ok());
    }
}
