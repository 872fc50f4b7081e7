//! The function service (v1 and v1beta1, whose messages share their wire
//! format) served raw: a call's request handed on as its bytes and its
//! answer sent back as bytes, never decoded (`xfn host`, `xfn adapt`).
//!
//! Why our own server and not tonic-build's: per call that one boxes the
//! method's future twice (its own and `async_trait`'s), copies the request
//! out of its decoder's buffer and the answer into its encoder's, and makes
//! the trailers from a `Status`: about a third of the hop's 46 allocations
//! per call, and its longest code path (benches/PROFILE.md, "The function
//! service served raw"). Here the request is the body's DATA frame as it
//! arrived (a gRPC client sends a small one whole: no copy), the answer one
//! frame and `grpc-status: 0`, and the only box is the call's future (the
//! router's [`Answer`]).
//!
//! Invariant: a caller sees what tonic's server would answer: a message
//! longer than the limit `OUT_OF_RANGE`, refused once its prefix is in
//! (never read further); a compressed one `UNIMPLEMENTED` (no compression
//! is accepted); none at all `INTERNAL`; another method `UNIMPLEMENTED`.
//! What is held of a request is bounded by the limit and one frame.
use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body as _, Frame};
use tonic::body::Body;
use tonic::codegen::http;
use tonic::Status;

use super::route::Answer;

/// A gRPC message's prefix: its compressed flag and its length.
pub(crate) const PREFIX: usize = 5;

/// One package of the function service.
pub(crate) trait Package: Send + Sync + 'static {
    /// The service's full name.
    const NAME: &'static str;
    /// The path of its one method.
    const PATH: &'static str;
}

/// `apiextensions.fn.proto.v1.FunctionRunnerService`.
#[derive(Debug)]
pub(crate) enum V1 {}

impl Package for V1 {
    const NAME: &'static str = "apiextensions.fn.proto.v1.FunctionRunnerService";
    const PATH: &'static str = "/apiextensions.fn.proto.v1.FunctionRunnerService/RunFunction";
}

/// `apiextensions.fn.proto.v1beta1.FunctionRunnerService`.
#[derive(Debug)]
pub(crate) enum V1beta1 {}

impl Package for V1beta1 {
    const NAME: &'static str = "apiextensions.fn.proto.v1beta1.FunctionRunnerService";
    const PATH: &'static str = "/apiextensions.fn.proto.v1beta1.FunctionRunnerService/RunFunction";
}

/// What answers `RunFunction`, raw: the request's message as its bytes,
/// with its metadata and extensions.
pub(crate) trait RunFunction: Send + Sync + 'static {
    /// The answer's message, as its bytes.
    fn run_function(
        &self,
        request: tonic::Request<Bytes>,
    ) -> impl Future<Output = Result<Bytes, Status>> + Send;
}

/// The service of package `P` over `S`, for the router
/// ([`super::route::Served`]).
pub(crate) struct Server<P, S> {
    inner: Arc<S>,
    max_message: usize,
    package: PhantomData<fn() -> P>,
}

impl<P, S> Server<P, S> {
    /// `inner`'s service, refusing request messages over `max_message`
    /// bytes.
    pub(crate) fn new(inner: Arc<S>, max_message: usize) -> Self {
        Self {
            inner,
            max_message,
            package: PhantomData,
        }
    }
}

impl<P, S> Clone for Server<P, S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            max_message: self.max_message,
            package: PhantomData,
        }
    }
}

impl<P: Package, S> tonic::server::NamedService for Server<P, S> {
    const NAME: &'static str = P::NAME;
}

impl<P: Package, S: RunFunction> tower::Service<http::Request<Body>> for Server<P, S> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Answer {
        if request.uri().path() != P::PATH {
            return Box::pin(std::future::ready(
                Ok(Status::unimplemented("").into_http()),
            ));
        }
        let inner = Arc::clone(&self.inner);
        let max_message = self.max_message;
        Box::pin(async move {
            Ok(match answer(&*inner, request, max_message).await {
                Ok(message) => answered(message),
                Err(status) => status.into_http(),
            })
        })
    }
}

async fn answer<S: RunFunction>(
    inner: &S,
    request: http::Request<Body>,
    max_message: usize,
) -> Result<Bytes, Status> {
    if let Some(encoding) = request.headers().get("grpc-encoding") {
        if encoding != "identity" {
            let encoding = String::from_utf8_lossy(encoding.as_bytes());
            return Err(Status::unimplemented(format!(
                "Content is compressed with `{encoding}` which isn't supported"
            )));
        }
    }
    let (parts, body) = request.into_parts();
    let message = message_of(body, max_message).await?;
    inner
        .run_function(tonic::Request::from_http(http::Request::from_parts(
            parts, message,
        )))
        .await
}

/// The one message of a unary request's `body`, its prefix checked and
/// cut (see the module's invariant).
async fn message_of(mut body: Body, max_message: usize) -> Result<Bytes, Status> {
    // What arrived: in one frame as it came, else copied together.
    let mut whole: Option<Bytes> = None;
    let mut joined = BytesMut::new();
    let mut length = None;
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        match whole.take() {
            None if joined.is_empty() => whole = Some(data),
            Some(first) => {
                joined.extend_from_slice(&first);
                joined.extend_from_slice(&data);
            }
            None => joined.extend_from_slice(&data),
        }
        let held: &[u8] = whole.as_deref().unwrap_or(&joined);
        let received = held.len();
        if length.is_none() && received >= PREFIX {
            let declared = prefixed_length(held, max_message)?;
            if whole.is_none() {
                joined.reserve((PREFIX + declared).saturating_sub(received));
            }
            length = Some(declared);
        }
        if let Some(declared) = length {
            if received > PREFIX + declared {
                return Err(Status::internal(
                    "protocol error: a unary request holds more than one message",
                ));
            }
        }
    }
    let held = whole.unwrap_or_else(|| joined.freeze());
    match length {
        None if held.is_empty() => Err(Status::internal("Missing request message.")),
        Some(declared) if held.len() == PREFIX + declared => Ok(held.slice(PREFIX..)),
        _ => Err(Status::internal("Unexpected EOF decoding stream.")),
    }
}

/// The length a message's prefix (at the start of `held`) declares, if it
/// is an uncompressed message within `max_message`.
fn prefixed_length(held: &[u8], max_message: usize) -> Result<usize, Status> {
    match held[0] {
        0 => {}
        1 => {
            return Err(Status::internal(
                "protocol error: received message with compressed-flag but no grpc-encoding was specified",
            ))
        }
        flag => {
            return Err(Status::internal(format!(
                "protocol error: received message with invalid compression flag: {flag} (valid flags are 0 and 1), while sending request"
            )))
        }
    }
    let length = u32::from_be_bytes([held[1], held[2], held[3], held[4]]);
    match usize::try_from(length) {
        Ok(length) if length <= max_message => Ok(length),
        _ => Err(Status::out_of_range(format!(
            "Error, decoded message length too large: found {length} bytes, the limit is: {max_message} bytes"
        ))),
    }
}

/// The prefix gRPC sends before an uncompressed message of `length` bytes.
pub(crate) fn prefix(length: usize) -> Result<[u8; PREFIX], Status> {
    let [a, b, c, d] = u32::try_from(length)
        .map_err(|_| {
            Status::resource_exhausted(format!(
                "a message of {length} bytes is longer than gRPC frames"
            ))
        })?
        .to_be_bytes();
    Ok([0, a, b, c, d])
}

/// `message` with its prefix, as gRPC sends one uncompressed.
pub(crate) fn framed(message: &[u8]) -> Result<Bytes, Status> {
    let prefix = prefix(message.len())?;
    let mut framed = BytesMut::with_capacity(PREFIX + message.len());
    framed.extend_from_slice(&prefix);
    framed.extend_from_slice(message);
    Ok(framed.freeze())
}

/// The answer to a call: `message`, then `grpc-status: 0`.
fn answered(message: Bytes) -> http::Response<Body> {
    let framed = match framed(&message) {
        Ok(framed) => framed,
        Err(status) => return status.into_http(),
    };
    let mut response = http::Response::new(Body::new(Answered {
        message: Some(framed),
        ended: false,
    }));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

/// The body of an answer: its one message, then its trailers.
struct Answered {
    message: Option<Bytes>,
    ended: bool,
}

impl http_body::Body for Answered {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(message) = self.message.take() {
            return Poll::Ready(Some(Ok(Frame::data(message))));
        }
        if self.ended {
            return Poll::Ready(None);
        }
        self.ended = true;
        let mut trailers = http::HeaderMap::with_capacity(1);
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }

    fn is_end_stream(&self) -> bool {
        self.message.is_none() && self.ended
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::collections::VecDeque;

    use tonic::Code;

    use super::*;

    /// A request body of `frames`, then its end, or (`then_waits`) no end.
    pub(in crate::grpc) struct Frames {
        pub(in crate::grpc) frames: VecDeque<Bytes>,
        pub(in crate::grpc) then_waits: bool,
    }

    impl http_body::Body for Frames {
        type Data = Bytes;
        type Error = Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            match self.frames.pop_front() {
                Some(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
                None if self.then_waits => Poll::Pending,
                None => Poll::Ready(None),
            }
        }
    }

    fn body(frames: &[&[u8]], then_waits: bool) -> Body {
        Body::new(Frames {
            frames: frames.iter().map(|f| Bytes::copy_from_slice(f)).collect(),
            then_waits,
        })
    }

    fn prefixed(flag: u8, length: u32, message: &[u8]) -> Vec<u8> {
        let mut framed = vec![flag];
        framed.extend_from_slice(&length.to_be_bytes());
        framed.extend_from_slice(message);
        framed
    }

    async fn message(frames: &[&[u8]]) -> Result<Bytes, Status> {
        message_of(body(frames, false), 1024).await
    }

    #[tokio::test]
    async fn a_message_in_one_frame_is_handed_on_as_that_frame_without_a_copy() {
        let frame = Bytes::from(prefixed(0, 5, b"hello"));
        let from = Body::new(Frames {
            frames: VecDeque::from([frame.clone()]),
            then_waits: false,
        });
        let message = message_of(from, 1024).await.expect("a message");
        assert_eq!(&message[..], b"hello");
        assert_eq!(message.as_ptr(), frame[PREFIX..].as_ptr());
    }

    #[tokio::test]
    async fn a_message_in_several_frames_is_joined() {
        let framed = prefixed(0, 11, b"hello world");
        let (a, b) = framed.split_at(3);
        let (b, c) = b.split_at(6);
        assert_eq!(
            &message(&[a, b, c]).await.expect("a message")[..],
            b"hello world"
        );
    }

    #[tokio::test]
    async fn a_message_over_the_limit_is_refused_once_its_prefix_is_in_and_not_read_further() {
        // The body never ends: only a refusal at the prefix returns.
        let prefix = prefixed(0, 1025, b"");
        let status = message_of(body(&[&prefix[..3], &prefix[3..]], true), 1024)
            .await
            .expect_err("over the limit");
        assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    }

    #[tokio::test]
    async fn a_compressed_missing_cut_short_or_second_message_is_refused_as_tonic_would() {
        let compressed = prefixed(1, 2, b"hi");
        let short = prefixed(0, 3, b"hi");
        let two = [prefixed(0, 2, b"hi"), prefixed(0, 2, b"ho")].concat();
        for (frames, code) in [
            (vec![&compressed[..]], Code::Internal),
            (vec![], Code::Internal),
            (vec![&short[..]], Code::Internal),
            (vec![&short[..2]], Code::Internal),
            (vec![&two[..]], Code::Internal),
        ] {
            let status = message(&frames).await.expect_err("refused");
            assert_eq!(status.code(), code, "{frames:?}: {status:?}");
        }
    }

    /// Answers with the request's message reversed.
    struct Reverse;

    impl RunFunction for Reverse {
        async fn run_function(&self, request: tonic::Request<Bytes>) -> Result<Bytes, Status> {
            let mut message = request.into_inner().to_vec();
            message.reverse();
            Ok(message.into())
        }
    }

    async fn call(path: &str, headers: &[(&'static str, &'static str)]) -> http::Response<Body> {
        let mut server = Server::<V1, _>::new(Arc::new(Reverse), 1024);
        let mut request = http::Request::builder().uri(path);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(body(&[&prefixed(0, 3, b"abc")], false))
            .expect("a request");
        tower::Service::call(&mut server, request)
            .await
            .expect("infallible")
    }

    async fn frames_of(response: http::Response<Body>) -> Vec<Frame<Bytes>> {
        let mut body = response.into_body();
        let mut frames = Vec::new();
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            frames.push(frame.expect("a frame"));
        }
        frames
    }

    #[tokio::test]
    async fn an_answer_is_its_framed_message_then_grpc_status_zero() {
        let response = call(V1::PATH, &[]).await;
        assert_eq!(response.headers()["content-type"], "application/grpc");
        let frames = frames_of(response).await;
        assert_eq!(frames.len(), 2, "{frames:?}");
        assert_eq!(
            frames[0].data_ref().map(|d| &d[..]),
            Some(&prefixed(0, 3, b"cba")[..])
        );
        assert_eq!(
            frames[1].trailers_ref().map(|t| t["grpc-status"].clone()),
            Some(http::HeaderValue::from_static("0"))
        );
    }

    #[tokio::test]
    async fn another_method_or_a_compressed_request_is_unimplemented() {
        for response in [
            call(
                "/apiextensions.fn.proto.v1.FunctionRunnerService/Other",
                &[],
            )
            .await,
            call(V1::PATH, &[("grpc-encoding", "gzip")]).await,
        ] {
            // Code 12 is UNIMPLEMENTED, in a trailers-only answer.
            assert_eq!(response.headers()["grpc-status"], "12");
        }
        assert_eq!(
            call(V1::PATH, &[("grpc-encoding", "identity")])
                .await
                .headers()
                .get("grpc-status"),
            None
        );
    }
}
