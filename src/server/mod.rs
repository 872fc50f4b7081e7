//! gRPC servers: the alpha runner service on a Unix socket (owned by the
//! server work), later the adaptor.
