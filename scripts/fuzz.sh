#!/usr/bin/env bash
# The property tests (proptest, stable Rust) with many more cases than
# `cargo test` runs: the layer extractor on arbitrary, mutated and random
# tars in both whiteout modes (tests/extract_fuzz.rs), image references
# (tests/image_fuzz.rs), manifests, indexes and configs
# (src/image/pull/manifest.rs). A failure prints the smallest input that
# shows it.
#
#   scripts/fuzz.sh                    # 20,000 cases per property
#   PROPTEST_CASES=200000 scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PROPTEST_CASES=${PROPTEST_CASES:-20000}
echo "fuzz: $PROPTEST_CASES cases per property"
start=$SECONDS
cargo test --test extract -- extract_fuzz::
cargo test --test image -- image_fuzz::
cargo test --lib image::pull::manifest::tests::fuzz
echo "fuzz: all properties held for $PROPTEST_CASES cases each ($((SECONDS - start)) s)"
