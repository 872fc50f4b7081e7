//! Builds and pushes the benchmark image for `benches/pull.sh`: three
//! layers of incompressible pseudo-random data, ~50 MB in all, gzip.
//! Ignored in normal runs; the script runs it with
//! `XFN_BENCH_REGISTRY=127.0.0.1:PORT cargo test --test image -- image_bench:: --ignored`.

use xfn_testkit::*;

/// Layer sizes (uncompressed; random data compresses to about the same).
const LAYER_BYTES: [usize; 3] = [25 << 20, 15 << 20, 10 << 20];

#[test]
#[ignore = "benchmark set-up: run by benches/pull.sh"]
fn push_bench_image() {
    let addr = std::env::var("XFN_BENCH_REGISTRY")
        .expect("set XFN_BENCH_REGISTRY=127.0.0.1:PORT (benches/pull.sh does)")
        .parse()
        .expect("XFN_BENCH_REGISTRY must be 127.0.0.1:PORT");
    let registry = Registry::connect(addr);
    let mut image = ImageBuilder::new().entrypoint(["/bin/true"]);
    for (i, size) in LAYER_BYTES.iter().enumerate() {
        // A few files per layer, like a real image, not one huge blob.
        let mut layer = Layer::new().dir(&format!("/data{i}"), 0o755);
        let per_file = size / 8;
        for f in 0..8 {
            let seed = (i * 100 + f) as u64;
            layer = layer.file(
                &format!("/data{i}/file{f}"),
                0o644,
                pseudo_random_bytes(seed, per_file),
            );
        }
        image = image.layer(layer);
    }
    let pushed = image.push(&registry, "bench:v1");
    println!(
        "pushed {} {} ({} bytes of layers)",
        pushed.reference,
        pushed.digest,
        pushed.image.layers_size()
    );
}
