//! Pulling manifests and blobs from a registry with oci-client (owned by the image work).
