//! The caller's gRPC deadline: the `grpc-timeout` request header
//! (<https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md>),
//! counted from the moment the request arrived.
//!
//! Why the arrival is stamped: the deadline runs from when the caller sent
//! the call; counted from when a service first looks at the request (its
//! body read, the call admitted) it would fall late by however long those
//! took. The gRPC layer stamps [`Arrived`] as a request's headers are
//! handed to it (`super::serve`), before anything else is done for it.
//!
//! Nothing in the layer ends a call on `grpc-timeout` by itself (tonic's
//! transport did, answering `CANCELLED` in place of whatever the service
//! was doing): each front end enforces the deadline where the call waits
//! or runs (admission, the call seam's `call::deadline`), so it says what
//! happened (`DEADLINE_EXCEEDED`, the function never ran). The layer
//! bounds only what comes before those: a request body still arriving at
//! its deadline ends there ([`Deadlined`]), so a caller trickling its body
//! holds a call no longer than it asked to wait.
use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tonic::codegen::http;

/// The metadata key gRPC clients put their deadline in.
pub(crate) const GRPC_TIMEOUT_HEADER: &str = "grpc-timeout";

/// The most digits a `grpc-timeout` value has.
const GRPC_TIMEOUT_DIGITS: usize = 8;

/// A `grpc-timeout` value, written on the stack (a call's header takes
/// its one copy): its digits and unit end `value`, from `start`.
pub(crate) struct GrpcTimeout {
    value: [u8; GRPC_TIMEOUT_DIGITS + 1],
    start: usize,
}

impl GrpcTimeout {
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.value[self.start..]
    }
}

/// A `grpc-timeout` value for `timeout`: milliseconds, rounded up, or
/// whole seconds past what 8 digits of milliseconds hold (at most
/// `99999999S`, three years).
pub(crate) fn format_grpc_timeout(timeout: Duration) -> GrpcTimeout {
    const MOST: u64 = 99_999_999;
    let millis = timeout.as_nanos().div_ceil(1_000_000);
    let (mut amount, unit) = match u64::try_from(millis) {
        Ok(millis) if millis <= MOST => (millis, b'm'),
        _ => (timeout.as_secs().min(MOST), b'S'),
    };
    let mut value = [0; GRPC_TIMEOUT_DIGITS + 1];
    let mut start = GRPC_TIMEOUT_DIGITS;
    value[start] = unit;
    // At most 8 digits (`MOST`): `start` stops at 0 or later.
    loop {
        start -= 1;
        value[start] = b'0' + (amount % 10) as u8;
        amount /= 10;
        if amount == 0 {
            break;
        }
    }
    GrpcTimeout { value, start }
}

/// Parses a `grpc-timeout` value: at most 8 ASCII digits and a unit
/// (`H`, `M`, `S`, `m`, `u`, `n`). `None` when malformed, as gRPC servers
/// treat a malformed header as absent.
pub(crate) fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    if value.len() < 2 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    if digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// The caller's deadline from request metadata, if it sent one.
pub(crate) fn caller_deadline(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    caller_timeout(metadata.as_ref())
}

/// The caller's timeout from a request's headers, if it sent one.
fn caller_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    headers
        .get(GRPC_TIMEOUT_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(parse_grpc_timeout)
}

/// What the gRPC layer puts in each request's extensions, once, as its
/// headers arrive: its deadline, and the name its client dialled when the
/// connection's TLS was routed by it (SNI, `super::sni`).
#[derive(Debug, Clone)]
pub(crate) struct Arrived {
    /// The instant the caller's deadline passes, counted from when the
    /// request's headers were handed to the gRPC layer; `None` without one.
    pub(crate) deadline: Option<Instant>,
    /// The SNI the connection's handshake was made for (lower case).
    pub(crate) server_name: Option<Arc<str>>,
}

impl Arrived {
    /// A request with `headers`, arrived now over a connection routed by
    /// `server_name`.
    pub(crate) fn now(headers: &http::HeaderMap, server_name: Option<Arc<str>>) -> Self {
        let at = Instant::now();
        Self {
            deadline: caller_timeout(headers).and_then(|timeout| at.checked_add(timeout)),
            server_name,
        }
    }
}

/// A request body that ends in `DEADLINE_EXCEEDED` if it is still
/// arriving at `deadline`. No timer is made unless a frame is waited for
/// (a gRPC client sends a small request whole, with its headers).
pub(crate) struct Deadlined<B> {
    body: B,
    deadline: Option<Instant>,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<B> Deadlined<B> {
    /// `body` of a request whose deadline is `deadline` ([`Arrived`]).
    pub(crate) fn new(body: B, deadline: Option<Instant>) -> Self {
        Self {
            body,
            deadline,
            timer: None,
        }
    }
}

impl<B> http_body::Body for Deadlined<B>
where
    B: http_body::Body + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = B::Data;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        let Some(deadline) = self.deadline else {
            return Poll::Pending;
        };
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        std::task::ready!(timer.as_mut().poll(cx));
        self.deadline = None;
        Poll::Ready(Some(Err(Box::new(tonic::Status::deadline_exceeded(
            "the request's body was still arriving at its deadline",
        )))))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The name a request's client dialled, when its connection's TLS was
/// routed by it (see [`Arrived`]).
pub(crate) fn server_name_of(extensions: &tonic::Extensions) -> Option<&Arc<str>> {
    extensions
        .get::<Arrived>()
        .and_then(|arrived| arrived.server_name.as_ref())
}

/// The instant the caller's deadline passes, if it sent one: counted from
/// the request's arrival ([`Arrived`]; from now, when it was not stamped).
pub(crate) fn deadline_of<T>(request: &tonic::Request<T>) -> Option<Instant> {
    match request.extensions().get::<Arrived>() {
        Some(arrived) => arrived.deadline,
        None => caller_deadline(request.metadata()).map(|timeout| Instant::now() + timeout),
    }
}

/// The time a run gets: the request's own timeout capped by the caller's
/// deadline, when it has one.
pub(crate) fn effective_timeout(requested: Duration, caller: Option<Duration>) -> Duration {
    match caller {
        Some(caller) => requested.min(caller),
        None => requested,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::raw::tests::Frames;

    #[test]
    fn parses_every_unit() {
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        for timeout in [
            Duration::from_micros(1500),
            Duration::from_secs(120),
            Duration::from_secs(7 * 86400),
        ] {
            let parsed = parse_grpc_timeout(&formatted(timeout)).unwrap();
            assert!(
                parsed >= timeout && parsed - timeout < Duration::from_millis(1),
                "{timeout:?}"
            );
        }
        assert_eq!(parse_grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse_grpc_timeout("9n"), Some(Duration::from_nanos(9)));
    }

    fn formatted(timeout: Duration) -> String {
        String::from_utf8(format_grpc_timeout(timeout).as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn a_timeout_is_told_in_at_most_eight_digits_milliseconds_rounded_up_then_seconds() {
        let ms = Duration::from_millis;
        for (timeout, told) in [
            (Duration::ZERO, "0m"),
            (Duration::from_nanos(1), "1m"),
            (ms(1), "1m"),
            (ms(1) + Duration::from_nanos(1), "2m"),
            (ms(99_999_999), "99999999m"),
            // Past 8 digits of milliseconds: whole seconds, rounded down.
            (ms(99_999_999) + Duration::from_nanos(1), "99999S"),
            (ms(100_000_000), "100000S"),
            (Duration::from_secs(99_999_999), "99999999S"),
            (Duration::from_secs(100_000_000), "99999999S"),
            (Duration::MAX, "99999999S"),
        ] {
            assert_eq!(formatted(timeout), told, "{timeout:?}");
            assert!(parse_grpc_timeout(told).is_some(), "{told}");
        }
    }

    #[test]
    fn rejects_malformed_values() {
        for bad in ["", "S", "5", "5x", "123456789S", "-5S", "5 S", "1.5S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn caller_deadline_caps_the_request_timeout() {
        let req = Duration::from_secs(25);
        assert_eq!(effective_timeout(req, None), req);
        assert_eq!(
            effective_timeout(req, Some(Duration::from_secs(1))),
            Duration::from_secs(1)
        );
        assert_eq!(effective_timeout(req, Some(Duration::from_secs(60))), req);
    }

    #[test]
    fn reads_the_header_from_metadata() {
        let mut md = tonic::metadata::MetadataMap::new();
        assert_eq!(caller_deadline(&md), None);
        md.insert(GRPC_TIMEOUT_HEADER, "1500m".parse().unwrap());
        assert_eq!(caller_deadline(&md), Some(Duration::from_millis(1500)));
    }

    fn deadlined(ends: bool, timeout: Option<&'static str>) -> Deadlined<Frames> {
        let mut headers = http::HeaderMap::new();
        if let Some(timeout) = timeout {
            headers.insert(GRPC_TIMEOUT_HEADER, http::HeaderValue::from_static(timeout));
        }
        let body = Frames {
            frames: [bytes::Bytes::from_static(b"hi")].into(),
            then_waits: !ends,
        };
        Deadlined::new(body, Arrived::now(&headers, None).deadline)
    }

    async fn next(body: &mut Deadlined<Frames>) -> Option<Result<bool, tonic::Code>> {
        use http_body::Body as _;
        std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx))
            .await
            .map(|frame| match frame {
                Ok(frame) => Ok(frame.is_data()),
                Err(err) => Err(tonic::Status::from_error(err).code()),
            })
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_still_arriving_at_its_deadline_ends_deadline_exceeded_then() {
        let mut body = deadlined(false, Some("2S"));
        let started = Instant::now();
        assert_eq!(next(&mut body).await, Some(Ok(true)));
        assert_eq!(
            next(&mut body).await,
            Some(Err(tonic::Code::DeadlineExceeded))
        );
        // Paused time: it ended when the deadline came, not before.
        assert_eq!(started.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_whole_before_its_deadline_or_without_one_is_passed_on_as_it_came() {
        let mut body = deadlined(true, Some("2S"));
        assert_eq!(next(&mut body).await, Some(Ok(true)));
        assert_eq!(next(&mut body).await, None);
        assert!(
            body.timer.is_none(),
            "no timer made for a body that never waited"
        );
        let mut body = deadlined(false, None);
        assert_eq!(next(&mut body).await, Some(Ok(true)));
        let waited = tokio::time::timeout(Duration::from_secs(3600), next(&mut body)).await;
        assert!(waited.is_err(), "without a deadline the body is waited for");
    }
}
