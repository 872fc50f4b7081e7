//! Hostile layers pulled from a real registry by `xfn pull` run as an
//! unprivileged user: each is refused while it streams, with an error
//! naming the bound it broke, while the xfn process's peak memory stays
//! small and the bytes it writes stay under the cap. Each case prints one
//! line of the table in docs/cache.md's bounds table (`--nocapture`).
//!
//! Two scales, one code: `cargo test` runs every case against a small cap
//! (8 MiB) and bound (10,000 entries), which keeps each property (refused
//! at the bound, nothing kept, memory and bytes written bounded) at a
//! fraction of the time a debug build needs to unpack 64 MiB;
//! `scripts/hostile.sh` (`XFN_HOSTILE_FULL=1`) runs them at docs/cache.md's
//! sizes (a 64 MiB cap, 100,000 entries, bombs of gigabytes).

use std::path::Path;

use tar::EntryType;
use xfn_testkit::child::{measure, Measured};
use xfn_testkit::hostile::{
    blob, end, header, padding, pax_record, sparse_extension, sparse_header, Part,
};
use xfn_testkit::*;

/// The sizes the cases run at.
struct Scale {
    /// The `--max-image-size` the cases run under, in bytes…
    cap: u64,
    /// …and as the flag says it.
    cap_flag: &'static str,
    /// The `--max-layer-entries` of the entry-count cases.
    entries: u64,
}

/// Small for `cargo test`, docs/cache.md's sizes with `XFN_HOSTILE_FULL=1`.
fn scale() -> Scale {
    if std::env::var_os("XFN_HOSTILE_FULL").is_some() {
        Scale {
            cap: 64 << 20,
            cap_flag: "64Mi",
            entries: 100_000,
        }
    } else {
        Scale {
            cap: 8 << 20,
            cap_flag: "8Mi",
            entries: 10_000,
        }
    }
}
/// Peak memory a refused pull may reach: xfn's own footprint (runtime,
/// TLS roots, buffers of the layers extracted at once) with room to spare,
/// and orders of magnitude below what the hostile inputs would cost.
const PEAK_MAX: u64 = 96 << 20;
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// Pulls an image of `layers` with `xfn pull` as uid 65532, measured.
fn pull(layers: Vec<Layer>, extra: &[&str]) -> (Measured, tempfile::TempDir, u64) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests make a cache dir owned by uid {NONROOT} and need root to"
    );
    let registry = Registry::start();
    let mut image = ImageBuilder::new();
    for layer in layers {
        image = image.layer(layer);
    }
    let pushed = image.push(&registry, "hostile:v1");
    let compressed = pushed.image.layers_size();
    let base = world_traversable_tempdir();
    let cache = base.path().join("cache");
    dir_owned_by(&cache, NONROOT);
    let measured = measure(
        unprivileged(NONROOT, Path::new(env!("CARGO_BIN_EXE_xfn")))
            .args(["pull", "--max-image-size", scale().cap_flag, "--cache-dir"])
            .arg(&cache)
            .args(extra)
            .arg(&pushed.reference),
        Path::new(env!("CARGO_BIN_EXE_xfn")),
    );
    (measured, base, compressed)
}

fn one_layer(parts: &[Part], compression: Compression) -> Vec<Layer> {
    vec![Layer::from_blob(blob(parts, compression, false))]
}

/// Asserts the pull failed naming `cause`, within memory and disk bounds,
/// and prints the case's table row.
fn refused(case: &str, (m, base, compressed): (Measured, tempfile::TempDir, u64), cause: &str) {
    m.assert_refused(case, cause, PEAK_MAX);
    bounded(case, &m, compressed);
    // Nothing of a refused layer is kept.
    let layers = base.path().join("cache/layers");
    assert_eq!(std::fs::read_dir(&layers).unwrap().count(), 0, "{case}");
    let last = m.stderr.trim().lines().last().unwrap_or("").to_string();
    println!("| {case} | refused: {last} | {} |", m.cost());
}

/// Peak memory small, bytes written at most the cap plus the compressed
/// blob (downloaded to disk as it is extracted).
fn bounded(case: &str, m: &Measured, compressed: u64) {
    let cap = scale().cap;
    assert!(
        m.peak_rss < PEAK_MAX,
        "{case}: peak memory {} MiB",
        m.peak_rss >> 20
    );
    assert!(
        m.written <= cap + compressed + 4 * MIB,
        "{case}: wrote {} MiB (cap {} MiB, blob {} MiB)",
        m.written >> 20,
        cap >> 20,
        compressed >> 20
    );
}

/// A file `name` of `len` bytes of `byte`, padded.
fn file_of(name: &str, byte: u8, len: u64) -> Vec<Part> {
    vec![
        Part::Bytes(header(EntryType::Regular, name, len)),
        Part::Run { byte, len },
        padding(len),
    ]
}

/// An extension header of `kind` whose body is `len` bytes of `a`, then an
/// empty file it would apply to.
fn huge_extension(kind: EntryType, len: u64) -> Vec<Part> {
    let mut parts = vec![
        Part::Bytes(header(kind, "././@LongLink", len)),
        Part::Run { byte: b'a', len },
        padding(len),
    ];
    parts.push(Part::Bytes(header(EntryType::Regular, "f", 0)));
    parts.push(end());
    parts
}

/// A PAX header holding one record `key` with a value of `len` bytes.
fn huge_pax(kind: EntryType, key: &str, len: u64) -> Vec<Part> {
    let (mut record, total) = pax_record(key, b'a', len);
    let mut parts = vec![Part::Bytes(header(kind, "pax", total))];
    parts.append(&mut record);
    parts.push(padding(total));
    parts.push(Part::Bytes(header(EntryType::Regular, "f", 0)));
    parts.push(end());
    parts
}

/// The error of a pull past the cap.
fn size_cause() -> String {
    format!("the image unpacks to more than {} bytes", scale().cap)
}

#[test]
fn a_gzip_bomb_stops_at_the_image_size_cap() {
    let mut parts = file_of("bomb", 0, 8 * GIB);
    parts.push(end());
    refused(
        "gzip bomb, one 8 GiB file of zeros",
        pull(one_layer(&parts, Compression::Gzip), &[]),
        &size_cause(),
    );
}

#[test]
fn a_zstd_bomb_stops_at_the_image_size_cap() {
    let mut parts = file_of("bomb", 0, 8 * GIB);
    parts.push(end());
    refused(
        "zstd bomb, one 8 GiB file of zeros",
        pull(one_layer(&parts, Compression::Zstd), &[]),
        &size_cause(),
    );
}

#[test]
fn a_bomb_of_many_files_stops_at_the_image_size_cap() {
    let mut parts = Vec::new();
    let each = scale().cap / 4;
    for i in 0..256 {
        parts.extend(file_of(&format!("f{i}"), 0, each));
    }
    parts.push(end());
    refused(
        &format!("gzip bomb, 256 files of {} MiB", each >> 20),
        pull(one_layer(&parts, Compression::Gzip), &[]),
        &size_cause(),
    );
}

#[test]
fn a_bomb_after_the_end_of_the_archive_stops_at_the_cap() {
    let mut parts = file_of("hello", b'h', 5);
    parts.push(end());
    parts.push(Part::Run {
        byte: 0,
        len: 8 * GIB,
    });
    refused(
        "8 GiB of zeros after the end-of-archive marker",
        pull(one_layer(&parts, Compression::Gzip), &[]),
        &size_cause(),
    );
}

#[test]
fn layers_each_under_the_cap_are_bounded_together() {
    let each = scale().cap * 5 / 8;
    let layers = (0..3)
        .map(|i| {
            let mut parts = file_of(&format!("part{i}"), 0, each);
            parts.push(end());
            Layer::from_blob(blob(&parts, Compression::Gzip, true))
        })
        .collect();
    refused(
        &format!(
            "3 layers of {} MiB each ({} MiB together)",
            each >> 20,
            (3 * each) >> 20
        ),
        pull(layers, &[]),
        &size_cause(),
    );
}

#[test]
fn an_incompressible_layer_past_the_cap_is_refused() {
    let len = scale().cap * 3 / 2;
    let layer = Layer::new().compression(Compression::None).file(
        "/random",
        0o644,
        pseudo_random_bytes(7, len as usize),
    );
    refused(
        &format!("plain tar of {} MiB of random bytes", len >> 20),
        pull(vec![layer], &[]),
        &size_cause(),
    );
}

#[test]
fn a_pax_size_record_cannot_smuggle_a_bomb() {
    let record = b"19 size=8589934592\n".to_vec();
    assert_eq!(record.len(), 19);
    let mut parts = vec![Part::Bytes(header(EntryType::XHeader, "pax", 19))];
    parts.push(Part::Bytes(record));
    parts.push(padding(19));
    parts.push(Part::Bytes(header(EntryType::Regular, "bomb", 0)));
    parts.push(Part::Run {
        byte: 0,
        len: 8 * GIB,
    });
    parts.push(end());
    refused(
        "PAX size=8 GiB over a header saying 0",
        pull(one_layer(&parts, Compression::Gzip), &[]),
        &size_cause(),
    );
}

#[test]
fn a_base_256_size_field_cannot_smuggle_a_bomb() {
    let mut parts = vec![Part::Bytes(header(EntryType::Regular, "bomb", 1 << 60))];
    parts.push(Part::Run {
        byte: 0,
        len: 8 * GIB,
    });
    refused(
        "base-256 size field of 2^60 bytes",
        pull(one_layer(&parts, Compression::Gzip), &[]),
        &size_cause(),
    );
}

#[test]
fn a_directory_with_a_body_is_bounded_too() {
    let mut parts = vec![Part::Bytes(header(EntryType::Directory, "dir/", 8 * GIB))];
    parts.push(Part::Run {
        byte: 0,
        len: 8 * GIB,
    });
    parts.push(end());
    refused(
        "directory entry announcing an 8 GiB body",
        pull(one_layer(&parts, Compression::Gzip), &[]),
        &size_cause(),
    );
}

#[test]
fn a_sparse_bomb_is_refused_by_its_apparent_size() {
    let tib = 4 * GIB;
    let parts = vec![
        Part::Bytes(sparse_header("sparse", &[(tib - 512, 512)], tib, false)),
        Part::Run {
            byte: b's',
            len: 512,
        },
        end(),
    ];
    refused(
        "GNU sparse file of 4 GiB (512 bytes of data)",
        pull(one_layer(&parts, Compression::Gzip), &[]),
        "a sparse file of 4294967296 bytes",
    );
}

#[test]
fn a_sparse_file_under_the_cap_keeps_its_holes() {
    let real = scale().cap * 15 / 16;
    let parts = vec![
        Part::Bytes(sparse_header(
            "sparse",
            &[(0, 512), (real - 512, 512)],
            real,
            false,
        )),
        Part::Run {
            byte: b's',
            len: 1024,
        },
        end(),
    ];
    let (m, base, compressed) = pull(
        vec![Layer::from_blob(blob(&parts, Compression::Gzip, true))],
        &[],
    );
    assert!(m.status.success(), "{}", m.stderr);
    bounded("sparse", &m, compressed);
    assert!(
        m.written < real / 2,
        "holes were written: {} bytes",
        m.written
    );
    let layers = base.path().join("cache/layers");
    let dir = std::fs::read_dir(&layers)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(dir.join("sparse")).unwrap();
    assert_eq!(meta.len(), real);
    assert!(
        meta.blocks() * 512 < MIB,
        "{} blocks allocated",
        meta.blocks()
    );
    let data = std::fs::read(dir.join("sparse")).unwrap();
    assert!(data[..512].iter().all(|&b| b == b's'));
    assert!(data[real as usize - 512..].iter().all(|&b| b == b's'));
    assert!(data[512..real as usize - 512].iter().all(|&b| b == 0));
    println!(
        "| GNU sparse file of {} MiB (1 KiB of data), under the cap | accepted, holes kept ({} KiB allocated) | {} |",
        real >> 20,
        meta.blocks() / 2,
        m.cost()
    );
}

#[test]
fn a_sparse_map_bomb_is_refused_at_the_header_bound() {
    let mut parts = vec![Part::Bytes(sparse_header("sparse", &[(0, 0)], 0, true))];
    // 16 times the header bound (1 MiB) for cargo test; 512 MiB in full.
    let count: u64 = if scale().cap > 8 << 20 {
        1 << 20
    } else {
        1 << 15
    };
    parts.push(Part::Repeat {
        unit: sparse_extension(&[(0, 0); 21], true),
        count,
    });
    parts.push(Part::Bytes(sparse_extension(&[], false)));
    parts.push(end());
    refused(
        &format!(
            "GNU sparse map of {} MiB of extension blocks",
            (count * 512) >> 20
        ),
        pull(one_layer(&parts, Compression::Gzip), &[]),
        "a GNU sparse map header",
    );
}

#[test]
fn a_300_mib_pax_path_is_refused_before_it_is_read() {
    refused(
        "PAX path of 300 MiB",
        pull(
            one_layer(
                &huge_pax(EntryType::XHeader, "path", 300 * MIB),
                Compression::Gzip,
            ),
            &[],
        ),
        "a PAX header of 314572",
    );
}

#[test]
fn a_huge_pax_xattr_is_refused_before_it_is_read() {
    refused(
        "PAX xattr user.big of 64 MiB",
        pull(
            one_layer(
                &huge_pax(EntryType::XHeader, "SCHILY.xattr.user.big", 64 * MIB),
                Compression::Gzip,
            ),
            &[],
        ),
        "a PAX header of 6710",
    );
}

#[test]
fn a_huge_global_pax_header_is_refused_before_it_is_read() {
    refused(
        "PAX global header of 300 MiB",
        pull(
            one_layer(
                &huge_pax(EntryType::XGlobalHeader, "comment", 300 * MIB),
                Compression::Gzip,
            ),
            &[],
        ),
        "a PAX global header of 314572",
    );
}

#[test]
fn a_300_mib_gnu_long_name_is_refused_before_it_is_read() {
    refused(
        "GNU long name of 300 MiB",
        pull(
            one_layer(
                &huge_extension(EntryType::GNULongName, 300 * MIB),
                Compression::Gzip,
            ),
            &[],
        ),
        "a GNU long name header of 314572800 bytes",
    );
}

#[test]
fn a_300_mib_gnu_long_link_is_refused_before_it_is_read() {
    refused(
        "GNU long link of 300 MiB",
        pull(
            one_layer(
                &huge_extension(EntryType::GNULongLink, 300 * MIB),
                Compression::Zstd,
            ),
            &[],
        ),
        "a GNU long link header of 314572800 bytes",
    );
}

#[test]
fn a_long_name_under_the_header_bound_is_quoted_cut() {
    // 512 KiB: within the header bound, far past PATH_MAX.
    refused(
        "GNU long name of 512 KiB",
        pull(
            one_layer(
                &huge_extension(EntryType::GNULongName, 512 << 10),
                Compression::Gzip,
            ),
            &[],
        ),
        "(524288 bytes)",
    );
}

#[test]
fn a_pax_path_under_the_header_bound_is_quoted_cut() {
    refused(
        "PAX path of 512 KiB",
        pull(
            one_layer(
                &huge_pax(EntryType::XHeader, "path", 512 << 10),
                Compression::Gzip,
            ),
            &[],
        ),
        "(524288 bytes)",
    );
}

#[test]
fn millions_of_empty_files_stop_at_the_entry_bound() {
    let max = scale().entries;
    let mut parts = vec![Part::Repeat {
        unit: header(EntryType::Regular, "empty", 0),
        count: 30 * max,
    }];
    parts.push(end());
    refused(
        &format!("{} empty files (--max-layer-entries {max})", 30 * max),
        pull(
            one_layer(&parts, Compression::Gzip),
            &["--max-layer-entries", &max.to_string()],
        ),
        &format!("the layer has more than {max} entries"),
    );
}

#[test]
fn millions_of_hardlinks_stop_at_the_entry_bound() {
    let mut link = header(EntryType::Link, "link", 0);
    link[157..163].copy_from_slice(b"target");
    let mut h = tar::Header::from_byte_slice(&link).clone();
    h.set_cksum();
    let max = scale().entries;
    let mut parts = file_of("target", b't', 1);
    parts.push(Part::Repeat {
        unit: h.as_bytes().to_vec(),
        count: 30 * max,
    });
    parts.push(end());
    refused(
        &format!("{} hardlinks (--max-layer-entries {max})", 30 * max),
        pull(
            one_layer(&parts, Compression::Zstd),
            &["--max-layer-entries", &max.to_string()],
        ),
        &format!("the layer has more than {max} entries"),
    );
}
