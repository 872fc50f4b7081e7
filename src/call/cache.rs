//! The response cache the v1 protocol designed (`ResponseMeta.ttl`) and
//! Crossplane never built, as a layer over a [`FunctionRunner`] (as
//! Crossplane's `internal/xfn/cached` wraps its runner): a run whose
//! response sets a TTL answers identical requests from memory until it
//! expires. The input is a `RunFunctionRequest` as protobuf JSON, the
//! output's stdout a `RunFunctionResponse`.
//!
//! Bounded by entry count: when full, expired entries go first, then the one
//! closest to expiry (it had the least life left to serve).
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};

use tonic::Status;

use super::{Function, FunctionRunner, Request, Response};
use crate::proto::v1 as pb;
use crate::proto_json::response_from_json;

/// Identifies identical requests to one image: the request's `meta.tag`
/// (Crossplane sets it to a hash of the request), or a hash of the request
/// when it has none.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct CacheKey(String);

/// The part of a request's JSON the key reads: everything else is skipped
/// without being kept.
#[derive(serde::Deserialize)]
struct TagOnly {
    meta: Option<TagMeta>,
}

#[derive(serde::Deserialize)]
struct TagMeta {
    tag: Option<String>,
}

/// The part of a response's JSON that says whether to keep it.
#[derive(serde::Deserialize)]
struct TtlOnly {
    meta: Option<TtlMeta>,
}

#[derive(serde::Deserialize)]
struct TtlMeta {
    ttl: Option<serde::de::IgnoredAny>,
}

impl CacheKey {
    /// The key of a request to `image` whose protobuf JSON is `json`
    /// (hashed only when the tag is empty). The JSON is re-serialised
    /// through a sorted map first, so map order in the encoding (prost-
    /// reflect's maps are hash maps) does not split identical requests.
    pub(crate) fn of(image: &str, json: &[u8]) -> Self {
        let tag = serde_json::from_slice::<TagOnly>(json)
            .ok()
            .and_then(|r| r.meta?.tag)
            .filter(|tag| !tag.is_empty());
        if let Some(tag) = tag {
            return CacheKey(format!("{image}\ntag:{tag}"));
        }
        let canonical = serde_json::from_slice::<serde_json::Value>(json)
            .ok()
            .and_then(|v| serde_json::to_vec(&v).ok())
            .unwrap_or_else(|| json.to_vec());
        CacheKey(format!(
            "{image}\nsha256:{}",
            hex::encode(Sha256::digest(&canonical))
        ))
    }
}

struct Entry {
    output: Response,
    expires: Instant,
}

/// The cache (shared by every call; internally locked).
struct ResponseCache {
    capacity: usize,
    entries: Mutex<HashMap<CacheKey, Entry>>,
}

impl std::fmt::Debug for ResponseCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseCache")
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

/// The TTL a response asks for, if a positive one.
fn ttl_of(response: &pb::RunFunctionResponse) -> Option<Duration> {
    let ttl = response.meta.as_ref()?.ttl.as_ref()?;
    let seconds = u64::try_from(ttl.seconds).ok()?;
    let nanos = u32::try_from(ttl.nanos).ok()?;
    let ttl = Duration::new(seconds, nanos);
    (!ttl.is_zero()).then_some(ttl)
}

impl ResponseCache {
    /// A cache of at most `capacity` responses (at least one).
    fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CacheKey, Entry>> {
        // A panic while holding the lock leaves a consistent map (every
        // operation is a single insert or remove): keep using it.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached output for `key`, if one has not expired.
    fn get(&self, key: &CacheKey, now: Instant) -> Option<Response> {
        let mut entries = self.lock();
        match entries.get(key) {
            Some(entry) if entry.expires > now => Some(entry.output.clone()),
            Some(_) => {
                entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Remembers `output` for `ttl` from `now`.
    fn insert(&self, key: CacheKey, output: Response, ttl: Duration, now: Instant) {
        let Some(expires) = now.checked_add(ttl) else {
            return;
        };
        let mut entries = self.lock();
        if entries.len() >= self.capacity && !entries.contains_key(&key) {
            entries.retain(|_, e| e.expires > now);
            if entries.len() >= self.capacity {
                let soonest = entries
                    .iter()
                    .min_by_key(|(_, e)| e.expires)
                    .map(|(k, _)| k.clone());
                if let Some(soonest) = soonest {
                    entries.remove(&soonest);
                }
            }
        }
        entries.insert(key, Entry { output, expires });
    }

    /// Entries held now (expired ones included until touched).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the cache holds nothing.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A [`FunctionRunner`] that answers from memory what the runner beneath
/// answered with a `meta.ttl` that has not run out, before the call waits
/// for a run slot (stacked above admission).
pub(crate) struct Cached<R> {
    inner: R,
    cache: ResponseCache,
}

impl<R> std::fmt::Debug for Cached<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cached")
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

impl<R> Cached<R> {
    /// `inner`, with at most `capacity` responses kept (at least one).
    pub(crate) fn new(capacity: usize, inner: R) -> Self {
        Self {
            inner,
            cache: ResponseCache::new(capacity),
        }
    }
}

/// How long `output` may answer for its request: its response's positive
/// `meta.ttl`, when its stdout is a response the caller will read (a
/// response without a TTL, the common case, is not decoded here).
fn keep_for(output: &[u8]) -> Option<Duration> {
    let asks = serde_json::from_slice::<TtlOnly>(output)
        .ok()
        .and_then(|r| r.meta?.ttl)
        .is_some();
    if !asks {
        return None;
    }
    ttl_of(&response_from_json(output).ok()?)
}

#[async_trait::async_trait]
impl<R: FunctionRunner> FunctionRunner for Cached<R> {
    async fn run_function(
        &self,
        function: &Function,
        request: Request,
    ) -> Result<Response, Status> {
        let key = CacheKey::of(&function.image, &request.input);
        if let Some(held) = self.cache.get(&key, Instant::now()) {
            tracing::debug!(function = %function.name.as_deref().unwrap_or(&function.image), "answered from the response cache");
            return Ok(held);
        }
        let response = self.inner.run_function(function, request).await?;
        if let Some(ttl) = keep_for(&response.output) {
            // A hit used no CPU or memory: it reports no usage.
            let kept = Response {
                usage: None,
                outcome: "cache_hit",
                ..response.clone()
            };
            self.cache.insert(key, kept, ttl, Instant::now());
        }
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::runner::{RunConfig, RunUsage};

    fn output(stdout: &str) -> Response {
        Response::ran(bytes::Bytes::copy_from_slice(stdout.as_bytes()))
    }

    fn key(tag: &str) -> CacheKey {
        CacheKey::of(
            "image",
            format!(r#"{{"meta":{{"tag":"{tag}"}}}}"#).as_bytes(),
        )
    }

    #[test]
    fn entries_expire() {
        let cache = ResponseCache::new(4);
        let now = Instant::now();
        cache.insert(key("a"), output("a"), Duration::from_secs(10), now);
        let held = cache.get(&key("a"), now + Duration::from_secs(9));
        assert_eq!(
            held.map(|o| o.output),
            Some(bytes::Bytes::from_static(b"a"))
        );
        assert!(cache
            .get(&key("a"), now + Duration::from_secs(10))
            .is_none());
        assert!(cache.is_empty());
    }

    #[test]
    fn full_cache_drops_the_soonest_to_expire() {
        let cache = ResponseCache::new(2);
        let now = Instant::now();
        cache.insert(key("long"), output("l"), Duration::from_secs(100), now);
        cache.insert(key("short"), output("s"), Duration::from_secs(5), now);
        cache.insert(key("new"), output("n"), Duration::from_secs(50), now);
        assert_eq!(cache.len(), 2);
        assert!(cache.get(&key("short"), now).is_none());
        assert!(cache.get(&key("long"), now).is_some());
        assert!(cache.get(&key("new"), now).is_some());
    }

    #[test]
    fn untagged_requests_are_keyed_by_content_regardless_of_key_order() {
        assert_eq!(
            CacheKey::of("image", br#"{"a":1,"b":2}"#),
            CacheKey::of("image", br#"{"b":2,"a":1}"#)
        );
        assert_ne!(
            CacheKey::of("image", br#"{"a":1}"#),
            CacheKey::of("image", br#"{"a":2}"#)
        );
        assert_eq!(
            CacheKey::of("image", br#"{"meta":{"tag":""},"a":1}"#),
            CacheKey::of("image", br#"{"a":1,"meta":{"tag":""}}"#)
        );
        assert_ne!(key("x"), key("y"));
        assert_ne!(
            CacheKey::of("one", br#"{"meta":{"tag":"t"}}"#),
            CacheKey::of("other", br#"{"meta":{"tag":"t"}}"#)
        );
    }

    #[test]
    fn only_positive_ttls_count() {
        let mut r = pb::RunFunctionResponse::default();
        assert_eq!(ttl_of(&r), None);
        r.meta = Some(pb::ResponseMeta {
            ttl: Some(prost_types::Duration {
                seconds: 0,
                nanos: 0,
            }),
            ..Default::default()
        });
        assert_eq!(ttl_of(&r), None);
        r.meta = Some(pb::ResponseMeta {
            ttl: Some(prost_types::Duration {
                seconds: 60,
                nanos: 0,
            }),
            ..Default::default()
        });
        assert_eq!(ttl_of(&r), Some(Duration::from_secs(60)));
    }

    /// Answers every run with `stdout` (or fails), counting the runs.
    struct FakeRunner {
        stdout: &'static str,
        fail: bool,
        runs: AtomicUsize,
    }

    impl FakeRunner {
        fn answering(stdout: &'static str) -> Arc<Self> {
            Arc::new(Self {
                stdout,
                fail: false,
                runs: AtomicUsize::new(0),
            })
        }

        fn runs(&self) -> usize {
            self.runs.load(Ordering::SeqCst)
        }
    }

    #[async_trait::async_trait]
    impl FunctionRunner for FakeRunner {
        async fn run_function(
            &self,
            _function: &Function,
            _request: Request,
        ) -> Result<Response, Status> {
            self.runs.fetch_add(1, Ordering::SeqCst);
            if self.fail {
                return Err(Status::deadline_exceeded("timed out"));
            }
            Ok(Response {
                usage: Some(RunUsage {
                    cpu_usec: 1000,
                    ..RunUsage::default()
                }),
                ..output(self.stdout)
            })
        }
    }

    const TAGGED: &[u8] = br#"{"meta":{"tag":"t"},"input":{"a":1}}"#;
    const KEPT: &str = r#"{"meta":{"tag":"t","ttl":"60s"},"results":[{"message":"m"}]}"#;

    fn function(image: &str) -> Function {
        Function {
            name: Some("fn".into()),
            image: image.into(),
            config: RunConfig::default(),
        }
    }

    async fn run_to(
        layer: &Cached<Arc<FakeRunner>>,
        image: &str,
        input: &'static [u8],
    ) -> Result<Response, Status> {
        let request = Request {
            input: bytes::Bytes::from_static(input),
            deadline: None,
        };
        layer.run_function(&function(image), request).await
    }

    async fn run(
        layer: &Cached<Arc<FakeRunner>>,
        input: &'static [u8],
    ) -> Result<Response, Status> {
        run_to(layer, "image", input).await
    }

    #[tokio::test]
    async fn a_response_with_a_ttl_is_run_once_then_held_without_usage() {
        let inner = FakeRunner::answering(KEPT);
        let layer = Cached::new(8, Arc::clone(&inner));
        let first = run(&layer, TAGGED).await.unwrap();
        assert!(first.usage.is_some());
        assert_eq!(first.outcome, "ok");
        let held = run(&layer, TAGGED).await.unwrap();
        assert_eq!(held.output, KEPT.as_bytes());
        assert_eq!(held.usage, None);
        assert_eq!(held.outcome, "cache_hit");
        assert_eq!(inner.runs(), 1);
    }

    #[tokio::test]
    async fn another_tag_or_image_is_not_answered_with_a_held_response() {
        let inner = FakeRunner::answering(KEPT);
        let layer = Cached::new(8, Arc::clone(&inner));
        run(&layer, TAGGED).await.unwrap();
        run(&layer, br#"{"meta":{"tag":"u"},"input":{"a":1}}"#)
            .await
            .unwrap();
        run_to(&layer, "other-image", TAGGED).await.unwrap();
        assert_eq!(inner.runs(), 3);
    }

    #[tokio::test]
    async fn a_response_without_a_positive_ttl_is_run_every_time() {
        for stdout in [
            r#"{"results":[{"message":"m"}]}"#,
            r#"{"meta":{"ttl":"0s"}}"#,
            r#"{"meta":{"ttl":null}}"#,
        ] {
            let inner = FakeRunner::answering(stdout);
            let layer = Cached::new(8, Arc::clone(&inner));
            run(&layer, TAGGED).await.unwrap();
            run(&layer, TAGGED).await.unwrap();
            assert_eq!(inner.runs(), 2, "{stdout}");
        }
    }

    #[tokio::test]
    async fn an_output_that_is_no_response_is_not_held_even_with_a_ttl() {
        for stdout in [
            r#"{"meta":{"ttl":"60s"},"results":"not a list"}"#,
            r#"{"meta":{"ttl":"sixty"}}"#,
            r#"{"meta":{"ttl":"60s"}} trailing"#,
        ] {
            let inner = FakeRunner::answering(stdout);
            let layer = Cached::new(8, Arc::clone(&inner));
            run(&layer, TAGGED).await.unwrap();
            run(&layer, TAGGED).await.unwrap();
            assert_eq!(inner.runs(), 2, "{stdout}");
        }
    }

    #[tokio::test]
    async fn a_failed_run_is_not_held() {
        let inner = Arc::new(FakeRunner {
            stdout: KEPT,
            fail: true,
            runs: AtomicUsize::new(0),
        });
        let layer = Cached::new(8, Arc::clone(&inner));
        assert!(run(&layer, TAGGED).await.is_err());
        assert!(run(&layer, TAGGED).await.is_err());
        assert_eq!(inner.runs(), 2);
    }
}
