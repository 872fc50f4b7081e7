//! The services of one server, each call handed to the one its path names
//! (`/SERVICE/METHOD`), unknown ones answered `UNIMPLEMENTED`.
//!
//! Why not tonic's `Routes`: that is axum's router, which per call matches
//! a route tree, stores the matched path and the `{*rest}` parameter in the
//! request's extensions, boxes the body into axum's and back into tonic's,
//! clones a boxed service and boxes its future again: allocations and work
//! on every call, for the handful of services a front end serves
//! (benches/PROFILE.md, "Thread per core for the hop", "Second pass").
//! Here a call compares the service name against each (a few, so a scan)
//! and calls a clone of the one named: the only box is the future tonic's
//! generated server makes anyway (or ours, `super::raw`).
//!
//! Invariant: every service here is one of tonic's generated servers (or a
//! wrapper passing their future through, or `super::raw`'s), always ready, so
//! `poll_ready` is not asked of them per call.
use std::convert::Infallible;
use std::sync::Arc;

use tonic::body::Body;
use tonic::codegen::http::{Request, Response};
use tonic::codegen::BoxFuture;

/// A call's answer, as tonic's generated servers make it.
pub(crate) type Answer = BoxFuture<Response<Body>, Infallible>;

/// A service the router serves: one of tonic's generated servers (or a
/// wrapper passing their future through), by its name.
pub(crate) trait Served:
    tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future = Answer>
    + tonic::server::NamedService
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> Served for S where
    S: tower::Service<
            Request<Body>,
            Response = Response<Body>,
            Error = Infallible,
            Future = Answer,
        > + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// A service as the router holds it: called on a clone of itself.
trait Named: Send + Sync {
    fn answer(&self, request: Request<Body>) -> Answer;
}

impl<S: Served> Named for S {
    fn answer(&self, request: Request<Body>) -> Answer {
        self.clone().call(request)
    }
}

/// The services of one server, by name; a clone shares them.
#[derive(Clone, Default)]
pub(crate) struct Services(Arc<[(&'static str, Box<dyn Named>)]>);

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(name, _)| name))
            .finish()
    }
}

/// The services [`Services`] is made of, as they are added.
#[derive(Default)]
pub(crate) struct ServicesBuilder(Vec<(&'static str, Box<dyn Named>)>);

impl ServicesBuilder {
    /// Adds `service`, called for the paths under its name.
    pub(crate) fn add<S: Served>(&mut self, service: S) {
        self.0.push((S::NAME, Box::new(service)));
    }

    /// The services added, to serve.
    pub(crate) fn build(self) -> Services {
        Services(self.0.into())
    }
}

impl Services {
    /// The service `path` (`/SERVICE/METHOD`) names, if served.
    fn named(&self, path: &str) -> Option<&dyn Named> {
        let (name, method) = path.strip_prefix('/')?.split_once('/')?;
        if method.is_empty() {
            return None;
        }
        self.0
            .iter()
            .find(|(served, _)| *served == name)
            .map(|(_, service)| &**service)
    }

    /// The answer of the service `request`'s path names; `UNIMPLEMENTED`
    /// when none is.
    pub(crate) fn answer(&self, request: Request<Body>) -> Answer {
        match self.named(request.uri().path()) {
            Some(service) => service.answer(request),
            None => Box::pin(std::future::ready(Ok(
                tonic::Status::unimplemented("").into_http::<Body>()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::task::{Context, Poll};

    use super::*;

    #[derive(Clone)]
    struct Echo;

    impl tonic::server::NamedService for Echo {
        const NAME: &'static str = "pkg.Echo";
    }

    impl tower::Service<Request<Body>> for Echo {
        type Response = Response<Body>;
        type Error = Infallible;
        type Future = Answer;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _request: Request<Body>) -> Answer {
            Box::pin(std::future::ready(Ok(Response::new(Body::empty()))))
        }
    }

    fn grpc_status(response: &Response<Body>) -> Option<&str> {
        response
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
    }

    async fn answer_to(path: &str) -> Response<Body> {
        let mut services = ServicesBuilder::default();
        services.add(Echo);
        let services = services.build();
        let request = Request::builder()
            .uri(path)
            .body(Body::empty())
            .expect("a request");
        services.answer(request).await.expect("infallible")
    }

    #[tokio::test]
    async fn a_call_reaches_the_service_its_path_names() {
        assert_eq!(grpc_status(&answer_to("/pkg.Echo/Say").await), None);
    }

    #[tokio::test]
    async fn a_path_naming_no_served_service_or_no_method_is_unimplemented() {
        for path in [
            "/pkg.Other/Say",
            "/pkg.Echo/",
            "/pkg.Echo",
            "/pkg.Ech/Say",
            "/",
        ] {
            // Code 12 is UNIMPLEMENTED.
            assert_eq!(grpc_status(&answer_to(path).await), Some("12"), "{path}");
        }
    }
}
