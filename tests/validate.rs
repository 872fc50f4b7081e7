//! Test binary `validate`: `xfn validate EXTENSIONS RESOURCES` end to end,
//! on CRDs, XRDs and rendered output in tests/validate/.
//!
//! One binary per area (tests/README.md says which file goes where).
#[path = "validate/corpus.rs"]
mod corpus;
#[path = "validate/peers.rs"]
mod peers;
#[path = "validate_cel_tables.rs"]
mod validate_cel_tables;
#[path = "validate_cli.rs"]
mod validate_cli;
#[path = "validate_hostile.rs"]
mod validate_hostile;
