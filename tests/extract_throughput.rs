//! Extraction throughput on ~50 MB layers: many small files, and a few big
//! ones. Prints MB/s (run with `--nocapture`); checks only correctness, never
//! a time.
mod extract_support;

use std::time::Instant;

use extract_support::Layer;
use xfn::image::extract::{extract_layer, WhiteoutMode};

const MB: f64 = 1024.0 * 1024.0;

fn small_files_layer() -> (Vec<u8>, usize) {
    // 12,800 files of 4 KiB in 128 directories: 50 MiB of content.
    let mut layer = Layer::new();
    let data = vec![b's'; 4096];
    let mut n = 0;
    for d in 0..128 {
        layer = layer.dir(&format!("usr/share/d{d}/"), 0o755);
        for f in 0..100 {
            layer = layer.file(&format!("usr/share/d{d}/file{f}.txt"), 0o644, &data);
            n += 1;
        }
    }
    (layer.dir("usr/", 0o755).dir("usr/share/", 0o755).build(), n)
}

fn big_files_layer() -> (Vec<u8>, usize) {
    // 5 files of 10 MiB.
    let mut layer = Layer::new().dir("opt/", 0o755);
    let data: Vec<u8> = (0..10 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    for f in 0..5 {
        layer = layer.file(&format!("opt/blob{f}"), 0o755, &data);
    }
    (layer.build(), 5)
}

fn measure(name: &str, tar: &[u8], files: usize) {
    for mode in [WhiteoutMode::Overlay, WhiteoutMode::Flatten] {
        let tmp = tempfile::tempdir().unwrap();
        let start = Instant::now();
        let stats = extract_layer(tar, tmp.path(), mode).unwrap();
        let secs = start.elapsed().as_secs_f64();
        assert_eq!(
            stats.entries as usize,
            files + if files > 5 { 130 } else { 1 }
        );
        println!(
            "extract {name} ({mode:?}): {:.1} MB of content, {} entries in {:.3} s = {:.0} MB/s, {:.0} entries/s",
            stats.bytes as f64 / MB,
            stats.entries,
            secs,
            stats.bytes as f64 / MB / secs,
            stats.entries as f64 / secs
        );
    }
}

#[test]
fn throughput_of_small_and_big_files() {
    let (small, n) = small_files_layer();
    measure("12800 x 4 KiB files", &small, n);
    let (big, n) = big_files_layer();
    measure("5 x 10 MiB files", &big, n);
}
