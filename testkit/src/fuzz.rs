//! Settings shared by the property tests (proptest).
use proptest::test_runner::Config;

/// A property's cases: `PROPTEST_CASES` when set (the long run of
/// `scripts/fuzz.sh`), else `quick` (what `cargo test` runs). Failures
/// are reported with the smallest input that shows them, not persisted.
pub fn config(quick: u32) -> Config {
    let mut config = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = quick;
    }
    config.failure_persistence = None;
    config
}
