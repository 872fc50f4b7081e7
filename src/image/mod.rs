//! Images: references, registry auth, pulling, the content-addressed store
//! and OCI layer extraction.
//!
//! The one entry point the engine uses is [`store::ImageStore::ensure`]: it
//! resolves a reference under a pull policy and returns a [`store::PulledImage`]
//! whose layers are extracted, verified directories on disk. The store's
//! layout and invariants are documented in [`store`].
pub mod auth;
pub mod extract;
pub mod pull;
pub mod reference;
pub mod store;

pub use auth::RegistryAuth;
pub use reference::ImageReference;
pub use store::{
    CachedImage, ImageError, ImageErrorKind, ImageStore, PullPolicy, PullProgress, PullReport,
    PulledImage, StoreOptions,
};
