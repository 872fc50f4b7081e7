//! Deterministic layer tarballs built in Rust: files, dirs, symlinks,
//! hardlinks, FIFOs, whiteouts and opaque markers, compressed with gzip,
//! zstd or not at all. Every header has mtime 0 (unless set) and the owner
//! you set, so the same builder calls always give the same digest.
//! [`Layer::verbatim`] writes every entry byte by byte instead, its names
//! as given, so the extractor tests can build the hostile entries (`../x`,
//! absolute links) the `tar` crate's builder refuses; [`Layer::entry`]
//! adds one of any type.
use std::io::Write;

use sha2::{Digest, Sha256};

pub use crate::format::Compression;

/// Commands busybox provides that [`Layer::busybox`] links into `/bin`.
pub const BUSYBOX_APPLETS: &[&str] = &[
    "sh",
    "ash",
    "cat",
    "echo",
    "sed",
    "sleep",
    "ls",
    "env",
    "true",
    "false",
    "printf",
    "head",
    "tail",
    "wc",
    "grep",
    "id",
    "mkdir",
    "rm",
    "touch",
    "tr",
    "cut",
    "yes",
    "dd",
    "sort",
    "uname",
    "pwd",
    "test",
    "[",
    "stat",
    "readlink",
    "kill",
    "date",
    "expr",
    "awk",
    "tee",
    "seq",
    "hostname",
    "whoami",
    "cp",
    "mv",
    "ln",
    "chmod",
    "find",
    "xargs",
    "base64",
    "sha256sum",
    "nproc",
    "ps",
    "mount",
    "dirname",
    "basename",
    "wget",
    "nc",
    "ip",
    "timeout",
    "od",
    "hexdump",
];

#[derive(Debug, Clone)]
enum Kind {
    Dir,
    File(Vec<u8>),
    Symlink(String),
    Hardlink(String),
    Fifo,
    /// Bytes put into the tar as they are: headers and data a test forges
    /// (whole 512-byte blocks).
    Raw(Vec<u8>),
}

#[derive(Debug, Clone)]
struct Entry {
    path: String,
    mode: u32,
    uid: u64,
    gid: u64,
    mtime: u64,
    kind: Kind,
}

/// One image layer under construction. Entries are written in the order
/// they are added (a tar's order matters: parents first, link targets before
/// hardlinks, whiteouts before the files they precede).
#[derive(Debug, Clone)]
pub struct Layer {
    entries: Vec<Entry>,
    uid: u64,
    gid: u64,
    mtime: u64,
    /// Names kept as given and every entry forged (see [`Layer::verbatim`]).
    verbatim: bool,
    compression: Compression,
    media_type: Option<String>,
    /// A blob made elsewhere (a bomb streamed into its compressor): used
    /// as it is instead of the entries.
    prebuilt: Option<LayerBlob>,
}

impl Default for Layer {
    fn default() -> Self {
        Layer::new()
    }
}

/// Strips the leading `/`: tar paths are relative to the rootfs.
fn rel(path: &str) -> String {
    path.trim_start_matches('/').to_string()
}

impl Layer {
    /// An empty gzip layer; entries added next are owned by 0:0.
    pub fn new() -> Layer {
        Layer {
            entries: Vec::new(),
            uid: 0,
            gid: 0,
            mtime: 0,
            verbatim: false,
            compression: Compression::Gzip,
            media_type: None,
            prebuilt: None,
        }
    }

    /// A layer whose entries are written byte by byte as ustar headers,
    /// names and link targets exactly as given (absolute, `..`, empty:
    /// nothing is checked or normalised), mtime 1_600_000_000 unless set.
    /// For the extractor's tests; [`Layer::tar`] is the layer.
    pub fn verbatim() -> Layer {
        Layer {
            verbatim: true,
            mtime: 1_600_000_000,
            ..Layer::new()
        }
    }

    /// Entries added after this have modification time `mtime` (seconds).
    pub fn mtime(mut self, mtime: u64) -> Layer {
        self.mtime = mtime;
        self
    }

    /// Appends one forged entry of `kind` (any type, devices included):
    /// `path` and `link` go into the header as they are, `data` is its body.
    pub fn entry(
        self,
        kind: tar::EntryType,
        path: &str,
        link: &str,
        mode: u32,
        data: &[u8],
    ) -> Layer {
        let (owner, mtime) = ((self.uid, self.gid), self.mtime);
        self.raw(raw_entry(kind, path, link, mode, owner, mtime, data))
    }

    /// A path as this layer writes it: as given when verbatim, else
    /// relative to the rootfs.
    fn name(&self, path: &str) -> String {
        if self.verbatim {
            path.to_string()
        } else {
            rel(path)
        }
    }

    /// A layer whose blob is `blob` as it is (see [`crate::hostile`]).
    pub fn from_blob(blob: LayerBlob) -> Layer {
        Layer {
            prebuilt: Some(blob),
            ..Layer::new()
        }
    }

    /// Raw tar bytes, appended unchecked where this entry falls (whole
    /// blocks: a forged header and its padded data).
    pub fn raw(mut self, bytes: impl Into<Vec<u8>>) -> Layer {
        let bytes = bytes.into();
        assert_eq!(
            bytes.len() % 512,
            0,
            "raw tar bytes come in 512-byte blocks"
        );
        self.entries.push(Entry {
            path: String::new(),
            mode: 0,
            uid: 0,
            gid: 0,
            mtime: 0,
            kind: Kind::Raw(bytes),
        });
        self
    }

    /// A base layer from the host's `/bin/busybox` (Debian `busybox-static`)
    /// with `/bin/<applet>` symlinks for [`BUSYBOX_APPLETS`], `/etc/passwd`
    /// and `/etc/group` (root, nobody, and uid 65532 `nonroot`), and empty
    /// `/tmp` (1777), `/proc`, `/sys`, `/dev`, `/root`, `/work`.
    pub fn busybox() -> Layer {
        let busybox = std::fs::read("/bin/busybox")
            .expect("/bin/busybox is missing: install the Debian package `busybox-static`");
        let mut layer = Layer::new()
            .dir("/bin", 0o755)
            .file("/bin/busybox", 0o755, busybox);
        for applet in BUSYBOX_APPLETS {
            layer = layer.symlink(&format!("/bin/{applet}"), "busybox");
        }
        layer
            .dir("/etc", 0o755)
            .file(
                "/etc/passwd",
                0o644,
                "root:x:0:0:root:/root:/bin/sh\n\
                 nonroot:x:65532:65532:nonroot:/home/nonroot:/bin/sh\n\
                 nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
            )
            .file(
                "/etc/group",
                0o644,
                "root:x:0:\nnonroot:x:65532:\nnogroup:x:65534:\n",
            )
            .dir("/tmp", 0o1777)
            .dir("/proc", 0o555)
            .dir("/sys", 0o555)
            .dir("/dev", 0o755)
            .dir("/root", 0o700)
            .dir("/work", 0o755)
    }

    /// Appends the tree under `dir` as the rootfs (`dir/usr/bin/x` becomes
    /// `/usr/bin/x`): directories, files and symlinks with their modes, in
    /// name order (the same tree gives the same digest), owned as set by
    /// [`Layer::owner`]. Hardlinked files are stored as copies; devices and
    /// sockets are left out (a runtime makes its own `/dev`).
    pub fn from_dir(mut self, dir: &std::path::Path) -> Layer {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let mut pending = vec![dir.to_path_buf()];
        while let Some(current) = pending.pop() {
            let mut entries: Vec<_> = std::fs::read_dir(&current)
                .unwrap_or_else(|e| panic!("read {}: {e}", current.display()))
                .map(|e| e.expect("a directory entry").path())
                .collect();
            entries.sort();
            // Depth first, parents before children: subdirectories are
            // walked after this directory's own entries, in name order.
            let mut subdirs = Vec::new();
            for path in entries {
                let meta = std::fs::symlink_metadata(&path)
                    .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()));
                let name = format!("/{}", path.strip_prefix(dir).unwrap().display());
                let mode = meta.permissions().mode() & 0o7777;
                let kind = meta.file_type();
                self = if kind.is_dir() {
                    subdirs.push(path);
                    self.dir(&name, mode)
                } else if kind.is_symlink() {
                    let target = std::fs::read_link(&path).expect("read a symlink");
                    self.symlink(&name, &target.display().to_string())
                } else if kind.is_file() {
                    let data = std::fs::read(&path)
                        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
                    self.file(&name, mode, data)
                } else if kind.is_fifo() {
                    self.fifo(&name, mode)
                } else {
                    self
                };
            }
            pending.extend(subdirs.into_iter().rev());
        }
        self
    }

    /// Entries added after this are owned by `uid:gid`.
    pub fn owner(mut self, uid: u64, gid: u64) -> Layer {
        self.uid = uid;
        self.gid = gid;
        self
    }

    /// The blob's compression (gzip by default).
    pub fn compression(mut self, compression: Compression) -> Layer {
        self.compression = compression;
        self
    }

    /// Overrides the descriptor's media type (e.g. a plain-tar media type on
    /// a gzip blob, to test sniffing by magic bytes).
    pub fn media_type(mut self, media_type: &str) -> Layer {
        self.media_type = Some(media_type.to_string());
        self
    }

    fn push(mut self, path: &str, mode: u32, kind: Kind) -> Layer {
        self.entries.push(Entry {
            path: self.name(path),
            mode,
            uid: self.uid,
            gid: self.gid,
            mtime: self.mtime,
            kind,
        });
        self
    }

    /// A directory.
    pub fn dir(self, path: &str, mode: u32) -> Layer {
        self.push(path, mode, Kind::Dir)
    }

    /// A regular file.
    pub fn file(self, path: &str, mode: u32, content: impl AsRef<[u8]>) -> Layer {
        let data = content.as_ref().to_vec();
        self.push(path, mode, Kind::File(data))
    }

    /// A symlink `path -> target` (target stored as given).
    pub fn symlink(self, path: &str, target: &str) -> Layer {
        self.push(path, 0o777, Kind::Symlink(target.to_string()))
    }

    /// A hardlink `path` to the earlier entry `target` (absolute or relative
    /// to the root; stored relative, as tar does).
    pub fn hardlink(self, path: &str, target: &str) -> Layer {
        let target = self.name(target);
        self.push(path, 0o644, Kind::Hardlink(target))
    }

    /// A named pipe.
    pub fn fifo(self, path: &str, mode: u32) -> Layer {
        self.push(path, mode, Kind::Fifo)
    }

    /// A whiteout deleting `path` from the layers below (`.wh.NAME`).
    pub fn whiteout(self, path: &str) -> Layer {
        let path = self.name(path);
        let (parent, name) = match path.rsplit_once('/') {
            Some((parent, name)) => (format!("{parent}/"), name.to_string()),
            None => (String::new(), path.clone()),
        };
        self.push(
            &format!("{parent}.wh.{name}"),
            0o644,
            Kind::File(Vec::new()),
        )
    }

    /// An opaque marker: `dir` hides everything below it in lower layers
    /// (`DIR/.wh..wh..opq`).
    pub fn opaque(self, dir: &str) -> Layer {
        let dir = self.name(dir);
        self.push(
            &format!("{dir}/.wh..wh..opq"),
            0o644,
            Kind::File(Vec::new()),
        )
    }

    /// The uncompressed tar (its sha256 is the layer's diff id).
    pub fn tar(&self) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        builder.mode(tar::HeaderMode::Deterministic);
        for entry in &self.entries {
            if self.verbatim {
                if let Some(bytes) = self.forged(entry) {
                    builder.get_mut().extend_from_slice(&bytes);
                    continue;
                }
            }
            let mut header = tar::Header::new_gnu();
            header.set_mode(entry.mode);
            header.set_uid(entry.uid);
            header.set_gid(entry.gid);
            header.set_mtime(entry.mtime);
            header.set_size(0);
            let result = match &entry.kind {
                Kind::Dir => {
                    header.set_entry_type(tar::EntryType::Directory);
                    builder.append_data(&mut header, &entry.path, std::io::empty())
                }
                Kind::File(data) => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_size(data.len() as u64);
                    builder.append_data(&mut header, &entry.path, data.as_slice())
                }
                Kind::Symlink(target) => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    builder.append_link(&mut header, &entry.path, target)
                }
                Kind::Hardlink(target) => {
                    header.set_entry_type(tar::EntryType::Link);
                    builder.append_link(&mut header, &entry.path, target)
                }
                Kind::Fifo => {
                    header.set_entry_type(tar::EntryType::Fifo);
                    builder.append_data(&mut header, &entry.path, std::io::empty())
                }
                Kind::Raw(bytes) => {
                    builder.get_mut().extend_from_slice(bytes);
                    Ok(())
                }
            };
            result.expect("append tar entry");
        }
        builder.into_inner().expect("finish tar")
    }

    /// A verbatim layer's entry, byte by byte (`None` for raw bytes,
    /// which go in as they are anyway).
    fn forged(&self, entry: &Entry) -> Option<Vec<u8>> {
        use tar::EntryType as T;
        let (kind, link, data): (T, &str, &[u8]) = match &entry.kind {
            Kind::Dir => (T::Directory, "", b""),
            Kind::File(data) => (T::Regular, "", data),
            Kind::Symlink(target) => (T::Symlink, target, b""),
            Kind::Hardlink(target) => (T::Link, target, b""),
            Kind::Fifo => (T::Fifo, "", b""),
            Kind::Raw(_) => return None,
        };
        Some(raw_entry(
            kind,
            &entry.path,
            link,
            entry.mode,
            (entry.uid, entry.gid),
            entry.mtime,
            data,
        ))
    }

    /// The compressed blob, its media type for `format`, and the diff id.
    pub fn blob(&self, format: crate::format::Format) -> LayerBlob {
        if let Some(blob) = &self.prebuilt {
            return blob.clone();
        }
        let tar = self.tar();
        let diff_id = sha256_digest(&tar);
        let data = match self.compression {
            Compression::None => tar,
            Compression::Gzip => {
                let mut enc =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                enc.write_all(&tar).expect("gzip");
                enc.finish().expect("gzip")
            }
            Compression::Zstd => zstd::encode_all(tar.as_slice(), 1).expect("zstd"),
        };
        let media_type = self
            .media_type
            .clone()
            .unwrap_or_else(|| format.layer_type(self.compression).to_string());
        LayerBlob {
            digest: sha256_digest(&data),
            data,
            media_type,
            diff_id,
        }
    }
}

/// A layer as it goes into a registry.
#[derive(Debug, Clone)]
pub struct LayerBlob {
    /// The compressed bytes.
    pub data: Vec<u8>,
    /// `sha256:<hex>` of `data`.
    pub digest: String,
    /// The descriptor media type.
    pub media_type: String,
    /// `sha256:<hex>` of the uncompressed tar.
    pub diff_id: String,
}

/// One whole entry as tar bytes, unchecked: a ustar header of `kind` with
/// `name` and `link` copied in as they are (absolute, `..`, anything under
/// 100 bytes), `mode`, `owner`, `mtime`, then `data` padded to whole blocks.
pub fn raw_entry(
    kind: tar::EntryType,
    name: &str,
    link: &str,
    mode: u32,
    owner: (u64, u64),
    mtime: u64,
    data: &[u8],
) -> Vec<u8> {
    assert!(
        name.len() <= 100 && link.len() <= 100,
        "raw names fit the header"
    );
    let mut h = tar::Header::new_ustar();
    {
        let ustar = h.as_ustar_mut().expect("ustar header");
        ustar.name[..name.len()].copy_from_slice(name.as_bytes());
        ustar.linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(owner.0);
    h.set_gid(owner.1);
    h.set_mtime(mtime);
    h.set_size(data.len() as u64);
    h.set_cksum();
    let mut bytes = h.as_bytes().to_vec();
    bytes.extend_from_slice(data);
    bytes.resize(bytes.len().next_multiple_of(512), 0);
    bytes
}

/// `sha256:<hex>` of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// `len` deterministic pseudo-random (incompressible) bytes from `seed`
/// (xorshift64*), for benchmark-sized layers.
pub fn pseudo_random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}
