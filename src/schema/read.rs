//! Reading `xfn validate`'s inputs: YAML or JSON streams from files,
//! directories (recursively, `.yaml`/`.yml`/`.json` in name order) or
//! stdin, each file capped (`--max-input-bytes`, [`DEFAULT_MAX_INPUT_BYTES`])
//! and its nesting and aliases bounded by [`crate::nesting`] before a parser
//! sees it: parsed YAML takes about 40 times its size in memory (measured:
//! 60 MiB took 2.2 GiB). Every object keeps where it came from (file and
//! document number), for errors.
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

/// The default largest file read: the API server takes no object over
/// 3 MiB, a rendered composition is a few hundred KiB, and a file of many
/// CRDs a few MiB.
pub(crate) const DEFAULT_MAX_INPUT_BYTES: &str = "8Mi";

/// Why an input could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    /// A file or directory could not be read.
    #[error("cannot read {path}")]
    Io {
        /// What.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file is larger than the bound.
    #[error("{path} is larger than {limit} bytes (--max-input-bytes)")]
    TooLarge {
        /// What.
        path: PathBuf,
        /// The bound.
        limit: u64,
    },
    /// Nested too deep or aliased too far.
    #[error("{path}")]
    OutOfBounds {
        /// What.
        path: PathBuf,
        /// Why.
        #[source]
        source: crate::nesting::NestingError,
    },
    /// Not YAML or JSON.
    #[error("{path}: document {document} is not valid YAML")]
    Yaml {
        /// What.
        path: PathBuf,
        /// 1-based document number.
        document: usize,
        /// Why.
        #[source]
        source: yaml_serde::Error,
    },
    /// A document that is not an object.
    #[error("{path}: document {document} is not a Kubernetes object: {found}")]
    NotAnObject {
        /// What.
        path: PathBuf,
        /// 1-based document number.
        document: usize,
        /// What it is.
        found: String,
    },
}

/// An object and where it came from.
#[derive(Debug, Clone)]
pub(crate) struct Document {
    /// `FILE, document N`.
    pub(crate) place: String,
    /// The object.
    pub(crate) object: Value,
}

/// Reads every object in `path` (`-` is stdin), refusing a file of more
/// than `max_bytes`.
pub(crate) fn read_documents(path: &Path, max_bytes: u64) -> Result<Vec<Document>, ReadError> {
    let mut documents = Vec::new();
    if path == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::stdin()
            .take(max_bytes.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|source| ReadError::Io {
                path: path.into(),
                source,
            })?;
        parse(path, &bytes, max_bytes, &mut documents)?;
        return Ok(documents);
    }
    let mut files = Vec::new();
    collect(path, &mut files, 0)?;
    for file in files {
        let handle = std::fs::File::open(&file).map_err(|source| ReadError::Io {
            path: file.clone(),
            source,
        })?;
        let mut bytes = Vec::new();
        handle
            .take(max_bytes.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|source| ReadError::Io {
                path: file.clone(),
                source,
            })?;
        parse(&file, &bytes, max_bytes, &mut documents)?;
    }
    Ok(documents)
}

/// Directories deeper than this are not descended into (a loop of links).
const MAX_DIR_DEPTH: usize = 16;

fn collect(path: &Path, files: &mut Vec<PathBuf>, depth: usize) -> Result<(), ReadError> {
    let io = |source| ReadError::Io {
        path: path.into(),
        source,
    };
    if !path.is_dir() {
        files.push(path.to_path_buf());
        return Ok(());
    }
    if depth > MAX_DIR_DEPTH {
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(io)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for entry in entries {
        if entry.is_dir() {
            collect(&entry, files, depth + 1)?;
        } else if matches!(
            entry.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        ) {
            files.push(entry);
        }
    }
    Ok(())
}

fn parse(
    path: &Path,
    bytes: &[u8],
    max_bytes: u64,
    out: &mut Vec<Document>,
) -> Result<(), ReadError> {
    if bytes.len() as u64 > max_bytes {
        return Err(ReadError::TooLarge {
            path: path.into(),
            limit: max_bytes,
        });
    }
    crate::nesting::check(bytes).map_err(|source| ReadError::OutOfBounds {
        path: path.into(),
        source,
    })?;
    let text = String::from_utf8_lossy(bytes);
    for (i, document) in yaml_serde::Deserializer::from_str(&text).enumerate() {
        let number = i + 1;
        let value = Value::deserialize(document).map_err(|source| ReadError::Yaml {
            path: path.into(),
            document: number,
            source,
        })?;
        match value {
            Value::Null => continue,
            Value::Object(_) => out.push(Document {
                place: format!("{}, document {number}", path.display()),
                object: value,
            }),
            other => {
                return Err(ReadError::NotAnObject {
                    path: path.into(),
                    document: number,
                    found: super::structural_kind(&other).into(),
                })
            }
        }
    }
    Ok(())
}
