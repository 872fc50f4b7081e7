//! Test binary `extract`: Layer extraction: the OCI layer spec in both whiteout modes, GNU tar's flavours, hostile layers, and property tests.
//!
//! One binary per area (tests/README.md says which file goes where): one
//! link, and its tests run side by side.

#[path = "extract_fuzz.rs"]
mod extract_fuzz;
#[path = "extract_gnu_tar.rs"]
mod extract_gnu_tar;
#[path = "extract_hostile.rs"]
mod extract_hostile;
#[path = "extract_layers.rs"]
mod extract_layers;
