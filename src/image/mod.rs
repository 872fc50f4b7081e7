//! Images: references, registry auth, pulling, the content-addressed store
//! and OCI layer extraction.
//!
//! The one entry point the engine uses is [`ImageStore::ensure`]: it
//! resolves a reference under a pull policy and returns a [`PulledImage`]
//! whose layers are extracted, verified directories on disk. The store's
//! layout and invariants are documented in [`store`].
//!
//! Who depends on whom (no circles): [`reference`], [`auth`], [`kind`],
//! [`descriptor`] and [`extract`] depend on nothing here; [`pull`] (the
//! registry client) on the first four; [`store`] (the disk) on
//! [`descriptor`], [`extract`] and [`error`], never on [`pull`]; [`fetch`]
//! joins the two.
pub mod auth;
pub mod descriptor;
pub mod error;
pub mod extract;
pub mod fetch;
pub mod kind;
pub mod policy;
pub mod pull;
pub mod reference;
pub mod store;

pub use auth::RegistryAuth;
pub use error::ImageError;
pub use fetch::{ImageStore, PullProgress, PullReport, StoreOptions};
pub use kind::ImageErrorKind;
pub use policy::{PullPolicy, UnknownPullPolicy};
pub use reference::ImageReference;
pub use store::{CachedImage, GcReport, ImagePin, PulledImage};
