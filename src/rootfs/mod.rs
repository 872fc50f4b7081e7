//! Per-run root filesystems: an overlay of the cached layer dirs, or a copy of
//! the flattened rootfs where overlay is not allowed (owned by the rootfs work).
