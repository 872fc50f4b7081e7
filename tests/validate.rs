//! Test binary `validate`: `xfn validate EXTENSIONS RESOURCES` end to end,
//! on CRDs, XRDs and rendered output in tests/validate/.
//!
//! One binary per area (tests/README.md says which file goes where).
#[path = "validate_cel_tables.rs"]
mod validate_cel_tables;
#[path = "validate_cli.rs"]
mod validate_cli;
#[path = "validate_corpus.rs"]
mod validate_corpus;
#[path = "validate_hostile.rs"]
mod validate_hostile;
#[path = "validate_peers.rs"]
mod validate_peers;
