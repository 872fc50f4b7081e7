//! The gRPC services `xfn host` serves on its one port, v1 and v1beta1, each
//! call routed to the function its connection names: the SNI of a TLS
//! connection ([`crate::grpc::deadline::Arrived`]), or, on the plaintext
//! listener, the host of the request's `:authority` ([`Authority`], put
//! there by [`WithAuthority`]). Nothing in the request body routes.
//!
//! Both are served raw ([`crate::grpc::raw`]): a request is handed on as
//! its bytes and a function server's answer returned as its bytes, so a
//! call costs xfn its size on the wire, whatever the messages hold; v1 and
//! v1beta1 share that wire format, so neither is converted.
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tonic::{Request, Status};

use super::Host;
use crate::grpc::deadline::{deadline_of, server_name_of};
use crate::grpc::raw::RunFunction;

/// The host part of a plaintext request's `:authority`, lower case.
#[derive(Debug, Clone)]
pub(crate) struct Authority(pub(crate) Arc<str>);

/// Wraps a service so each request carries its [`Authority`].
#[derive(Debug, Clone)]
pub(crate) struct WithAuthority<S>(pub(crate) S);

impl<S: tonic::server::NamedService> tonic::server::NamedService for WithAuthority<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tower::Service<tonic::codegen::http::Request<B>> for WithAuthority<S>
where
    S: tower::Service<tonic::codegen::http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut request: tonic::codegen::http::Request<B>) -> Self::Future {
        // A TLS connection routes by its SNI: nothing to add (or allocate).
        if server_name_of(request.extensions()).is_some() {
            return self.0.call(request);
        }
        if let Some(authority) = request.uri().authority() {
            let host = authority.host().to_ascii_lowercase();
            request.extensions_mut().insert(Authority(host.into()));
        }
        self.0.call(request)
    }
}

/// The name a request's connection dialled: its SNI, else its authority.
fn route<T>(request: &Request<T>) -> Option<Arc<str>> {
    let extensions = request.extensions();
    if let Some(name) = server_name_of(extensions) {
        return Some(Arc::clone(name));
    }
    extensions
        .get::<Authority>()
        .map(|authority| Arc::clone(&authority.0))
}

/// The function service (v1 and v1beta1 alike, [`crate::grpc::raw`]) over
/// a [`Host`].
#[derive(Debug)]
pub(crate) struct HostService(pub(crate) Arc<Host>);

impl RunFunction for HostService {
    async fn run_function(&self, request: Request<Bytes>) -> Result<Bytes, Status> {
        let deadline = deadline_of(&request);
        let name = route(&request);
        self.0
            .call(name.as_deref(), request.into_inner(), deadline)
            .await
    }
}
