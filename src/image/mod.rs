//! Images: references, registry auth, pulling, the content-addressed store
//! and OCI layer extraction.
//!
//! The one entry point the engine uses is [`ImageStore::ensure`]: it
//! resolves a reference under a pull policy and returns a [`PulledImage`]
//! whose layers are extracted, verified directories on disk. The store's
//! layout and invariants are documented in `store`.
//!
//! Who depends on whom (no circles): `reference`, `auth`, `kind`,
//! `descriptor` and [`extract`] depend on nothing here; `pull` (the
//! registry client) on the first four; `store` (the disk) on
//! `descriptor`, [`extract`] and `error`, never on `pull`; `image_store`
//! joins the two. Of these only [`extract`] is public (the extraction
//! tests drive it directly); the rest is reached through the re-exports
//! below.
pub(crate) mod auth;
pub(crate) mod descriptor;
pub(crate) mod error;
pub mod extract;
pub(crate) mod image_store;
pub(crate) mod kind;
pub(crate) mod policy;
pub(crate) mod pull;
pub(crate) mod reference;
pub(crate) mod store;

pub use auth::RegistryAuth;
pub use error::{ContentError, ImageError};
pub use image_store::{ImageStore, PullProgress, PullReport, StoreOptions};
pub use kind::ImageErrorKind;
pub use policy::{PullPolicy, UnknownPullPolicy};
pub use reference::ImageReference;
pub use store::{CacheListing, CachedImage, GcReport, ImagePin, PulledImage};
