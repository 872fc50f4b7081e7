//! What kind of failure an image error is: one classification shared by the
//! registry client, the store and the callers mapping errors to gRPC codes.
//! A leaf module, so the client and the store can both name it without
//! depending on each other.

/// What kind of failure an [`ImageError`](super::ImageError) is, for
/// mapping to gRPC codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageErrorKind {
    /// A malformed reference or argument (`InvalidArgument`).
    InvalidArgument,
    /// The image, tag or platform does not exist (`NotFound`).
    NotFound,
    /// The registry refused the credentials (`PermissionDenied`).
    Unauthorized,
    /// The registry cannot be reached or failed (`Unavailable`).
    Unavailable,
    /// Policy `Never` and the image is not cached (`FailedPrecondition`).
    NotPresent,
    /// Content does not match its digest or is malformed (`DataLoss`).
    Corrupt,
    /// More than `MAX_LAYERS` (the store's) layers
    /// (`ResourceExhausted`/`InvalidArgument`).
    TooManyLayers,
    /// A layer could not be extracted for a local reason (`Internal`);
    /// layers that are no readable tar, or whose entries are refused, are
    /// the image's fault (`InvalidArgument`).
    Extract,
    /// The image breaks a bound: unpacked size, entries, header sizes,
    /// manifest or blob sizes (`ResourceExhausted`).
    TooLarge,
    /// The pull took longer than `--pull-timeout` or the call it serves
    /// has time for (`DeadlineExceeded`).
    Timeout,
    /// The cache's file system is full or over its quota: no bound of the
    /// image's, a shortage of the daemon's (`ResourceExhausted`).
    NoSpace,
    /// Local I/O failed (`Internal`).
    Io,
}
