//! Files `xfn test` writes where the user keeps them (the `--junit` report,
//! golden files under `--update`), opened before xfn enters its user
//! namespace and written through the kept descriptors; every one a
//! [`Beneath`] path, opened without following a symlink (`super::beneath`).
//!
//! Why: as root, xfn maps a 65536-id range and is host uid 100000 inside
//! its namespace; it may then no longer create or open for writing a file
//! in a root-owned directory (a CI job as root in a container). Opened
//! first, as the user who ran xfn, each file is written as it would be
//! without a namespace, and the namespace gains a way out to these files
//! only — not a writer that writes any path it is sent.
//!
//! Invariant: a golden file is truncated only when it is written (a test
//! that did not render leaves an existing one as it was); the report is
//! made afresh at the start (a new file renamed over its name). A path not
//! known before the run (templated from another test's outputs) is opened
//! when written, as without this; where that is refused, the error says
//! that xfn runs as another host uid there and what to do.
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::beneath::{Beneath, BeneathError};

/// Errors of writing a file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WriteError {
    /// Opening or writing failed.
    #[error("cannot write {}", path.display())]
    Io { path: PathBuf, source: BeneathError },
    /// Refused inside the namespace, where xfn is another host uid.
    #[error("cannot write {}: {error} ({hint})", path.display())]
    Refused {
        path: PathBuf,
        error: BeneathError,
        hint: String,
    },
}

/// How a file is opened ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Open {
    /// Made where missing, its contents kept until written (golden files).
    InPlace,
    /// Made afresh, empty (the report).
    Fresh,
}

/// Files opened ahead, by the path they are written under.
#[derive(Debug, Default)]
pub(crate) struct Opened {
    files: BTreeMap<PathBuf, Result<Mutex<File>, String>>,
    /// Said when a write inside the namespace is refused: which host uid
    /// xfn is there (`None` where xfn keeps its own uid).
    hint: Option<String>,
}

impl Opened {
    /// Writes here (not opened ahead) from inside a namespace where xfn is
    /// host uid `uid`, when it is another uid than the user's.
    pub(crate) fn as_host_uid(uid: u32) -> Opened {
        Opened {
            files: BTreeMap::new(),
            hint: Some(format!(
                "xfn runs as host uid {uid} inside its user namespace, which may not write \
                 there: give a path known before the run, not templated from another test's \
                 outputs, or a directory that uid may write"
            )),
        }
    }

    /// Opens `path` (and makes its directory) to be written later; an
    /// error is kept and returned when it is written.
    pub(crate) fn open(&mut self, path: &Beneath, how: Open) {
        let key = path.path();
        if self.files.contains_key(&key) {
            return;
        }
        let opened = match how {
            Open::InPlace => path.open_to_write(),
            Open::Fresh => path.create_fresh(),
        };
        let opened = opened
            .map(Mutex::new)
            .map_err(|e| crate::chain::Chain(&e).to_string());
        self.files.insert(key, opened);
    }

    /// The error of opening `path` ahead, if it was opened and failed.
    pub(crate) fn open_error(&self, path: &Path) -> Option<&str> {
        self.files.get(path)?.as_ref().err().map(String::as_str)
    }

    /// Replaces the contents of `path` with `text`: through the file opened
    /// ahead, or opened now (its directory made) when it was not.
    pub(crate) fn write(&self, path: &Beneath, text: &str) -> Result<(), WriteError> {
        let key = path.path();
        let io = |source: BeneathError| WriteError::Io {
            path: key.clone(),
            source,
        };
        let replace = |file: &File| {
            file.set_len(0)
                .and_then(|()| file.write_all_at(text.as_bytes(), 0))
                .map_err(|e| io(e.into()))
        };
        match self.files.get(&key) {
            Some(Ok(file)) => replace(&file.lock().unwrap_or_else(|e| e.into_inner())),
            Some(Err(e)) => Err(io(std::io::Error::other(e.clone()).into())),
            None => match path.open_to_write() {
                Ok(file) => replace(&file),
                Err(error) => Err(match &self.hint {
                    Some(hint) if error.is_permission_denied() => WriteError::Refused {
                        path: key.clone(),
                        error,
                        hint: hint.clone(),
                    },
                    _ => io(error),
                }),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn golden(dir: &Path, name: &str) -> Beneath {
        Beneath::new(dir, Path::new(""), Path::new(name)).unwrap()
    }

    #[test]
    fn a_file_opened_ahead_keeps_its_contents_until_written_then_holds_only_the_new_text() {
        let dir = tempfile::tempdir().unwrap();
        let path = golden(dir.path(), "sub/golden.yaml");
        let mut opened = Opened::default();
        opened.open(&path, Open::InPlace);
        std::fs::write(path.path(), "a much longer old text\n").unwrap();
        opened.open(&path, Open::InPlace);
        assert_eq!(
            std::fs::read_to_string(path.path()).unwrap(),
            "a much longer old text\n"
        );
        opened.write(&path, "new\n").unwrap();
        assert_eq!(std::fs::read_to_string(path.path()).unwrap(), "new\n");
        opened.write(&path, "newer\n").unwrap();
        assert_eq!(std::fs::read_to_string(path.path()).unwrap(), "newer\n");
    }

    #[test]
    fn a_path_not_opened_ahead_is_written_when_asked_its_directory_made() {
        let dir = tempfile::tempdir().unwrap();
        let path = golden(dir.path(), "a/b/golden.yaml");
        Opened::as_host_uid(100_000).write(&path, "x\n").unwrap();
        assert_eq!(std::fs::read_to_string(path.path()).unwrap(), "x\n");
    }

    #[test]
    fn a_file_that_could_not_be_opened_ahead_says_why_when_written() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("file"), "").unwrap();
        let path = golden(dir.path(), "file/golden.yaml");
        let mut opened = Opened::default();
        opened.open(&path, Open::InPlace);
        let why = opened
            .open_error(&path.path())
            .unwrap_or_default()
            .to_string();
        assert!(
            why.ends_with("file is a regular file, not a directory"),
            "{why}"
        );
        let e = opened.write(&path, "x").unwrap_err();
        let message = crate::chain::Chain(&e).to_string();
        assert_eq!(
            message,
            format!("cannot write {}: {why}", path.path().display())
        );
    }

    #[test]
    fn a_refused_write_in_the_namespace_names_the_host_uid_and_what_to_do() {
        let e = WriteError::Refused {
            path: "golden/x.yaml".into(),
            error: std::io::Error::from(std::io::ErrorKind::PermissionDenied).into(),
            hint: Opened::as_host_uid(100_000).hint.unwrap_or_default(),
        };
        let message = crate::chain::Chain(&e).to_string();
        assert!(
            message.starts_with("cannot write golden/x.yaml: permission denied (xfn runs as host uid 100000 inside its user namespace"),
            "{message}"
        );
    }
}
