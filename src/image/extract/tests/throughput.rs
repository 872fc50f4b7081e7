//! Extraction throughput on ~50 MB layers: many small files, and a few big
//! ones, and of the copy a copy-mode rootfs makes of the flattened tree.
//! Prints MB/s (`cargo test --lib throughput -- --nocapture`); checks only
//! correctness, never a time. A unit test because the rootfs copy is private
//! to the crate.
use std::time::Instant;

use super::{extract_layer, WhiteoutMode};
use crate::support::Layer;

const MB: f64 = 1024.0 * 1024.0;

fn small_files_layer() -> (Vec<u8>, usize) {
    // 12,800 files of 4 KiB in 128 directories: 50 MiB of content.
    let mut layer = Layer::verbatim();
    let data = vec![b's'; 4096];
    let mut n = 0;
    for d in 0..128 {
        layer = layer.dir(&format!("usr/share/d{d}/"), 0o755);
        for f in 0..100 {
            layer = layer.file(&format!("usr/share/d{d}/file{f}.txt"), 0o644, &data);
            n += 1;
        }
    }
    (layer.dir("usr/", 0o755).dir("usr/share/", 0o755).tar(), n)
}

fn big_files_layer() -> (Vec<u8>, usize) {
    // 5 files of 10 MiB.
    let mut layer = Layer::verbatim().dir("opt/", 0o755);
    let data: Vec<u8> = (0..10 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    for f in 0..5 {
        layer = layer.file(&format!("opt/blob{f}"), 0o755, &data);
    }
    (layer.tar(), 5)
}

/// CPU seconds (user + system) this thread has used: unlike wall time, not
/// inflated by other processes competing for the cores.
fn thread_cpu_secs() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a whole rusage into the valid pointer given.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, usage.as_mut_ptr()) };
    assert_eq!(rc, 0);
    // SAFETY: initialised by the successful call above.
    let u = unsafe { usage.assume_init() };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn measure(name: &str, tar: &[u8], files: usize) {
    for mode in [WhiteoutMode::Overlay, WhiteoutMode::Flatten] {
        let tmp = tempfile::tempdir().unwrap();
        let start = Instant::now();
        let cpu_start = thread_cpu_secs();
        let stats = extract_layer(tar, tmp.path(), mode).unwrap();
        let secs = start.elapsed().as_secs_f64();
        let cpu = thread_cpu_secs() - cpu_start;
        assert_eq!(
            stats.entries as usize,
            files + if files > 5 { 130 } else { 1 }
        );
        println!(
            "extract {name} ({mode:?}): {:.1} MB of content, {} entries in {:.3} s = {:.0} MB/s, \
             {:.0} entries/s; CPU {:.3} s = {:.0} MB per CPU-second",
            stats.bytes as f64 / MB,
            stats.entries,
            secs,
            stats.bytes as f64 / MB / secs,
            stats.entries as f64 / secs,
            cpu,
            stats.bytes as f64 / MB / cpu
        );
        if mode == WhiteoutMode::Flatten {
            // The copy-mode rootfs of a run: a copy of the flattened tree.
            let start = Instant::now();
            let runs = tempfile::tempdir().unwrap();
            let copy = crate::rootfs::copy_tree(tmp.path(), &runs.path().join("copy")).unwrap();
            let secs = start.elapsed().as_secs_f64();
            assert_eq!(copy.bytes, stats.bytes);
            println!(
                "copy-mode rootfs of {name}: {} entries in {secs:.3} s = {:.0} MB/s",
                copy.entries,
                copy.bytes as f64 / MB / secs
            );
        }
    }
}

#[test]
fn throughput_of_small_and_big_files() {
    let (small, n) = small_files_layer();
    measure("12800 x 4 KiB files", &small, n);
    let (big, n) = big_files_layer();
    measure("5 x 10 MiB files", &big, n);
}
