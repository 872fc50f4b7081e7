//! The response cache the v1 protocol designed (`ResponseMeta.ttl`) and
//! Crossplane never built: a response that sets a TTL answers identical
//! requests from memory until it expires.
//!
//! Bounded by entry count: when full, expired entries go first, then the one
//! closest to expiry (it had the least life left to serve).
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};

use crate::proto::v1 as pb;

/// Identifies identical requests: the request's `meta.tag` (Crossplane sets
/// it to a hash of the request), or a hash of the request when it has none.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey(String);

impl CacheKey {
    /// The key of a request whose protobuf JSON is `json` (hashed only when
    /// the tag is empty). The JSON is re-serialised through a sorted map
    /// first, so map order in the encoding does not split identical requests.
    pub fn of(request: &pb::RunFunctionRequest, json: &[u8]) -> Self {
        if let Some(tag) = request.meta.as_ref().map(|m| &m.tag) {
            if !tag.is_empty() {
                return CacheKey(format!("tag:{tag}"));
            }
        }
        let canonical = serde_json::from_slice::<serde_json::Value>(json)
            .ok()
            .and_then(|v| serde_json::to_vec(&v).ok())
            .unwrap_or_else(|| json.to_vec());
        CacheKey(format!(
            "sha256:{}",
            hex::encode(Sha256::digest(&canonical))
        ))
    }
}

struct Entry {
    response: pb::RunFunctionResponse,
    expires: Instant,
}

/// The cache (shared by every call; internally locked).
pub struct ResponseCache {
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
pub fn ttl_of(response: &pb::RunFunctionResponse) -> Option<Duration> {
    let ttl = response.meta.as_ref()?.ttl.as_ref()?;
    let seconds = u64::try_from(ttl.seconds).ok()?;
    let nanos = u32::try_from(ttl.nanos).ok()?;
    let ttl = Duration::new(seconds, nanos);
    (!ttl.is_zero()).then_some(ttl)
}

impl ResponseCache {
    /// A cache of at most `capacity` responses (at least one).
    pub fn new(capacity: usize) -> Self {
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

    /// The cached response for `key`, if one has not expired.
    pub fn get(&self, key: &CacheKey, now: Instant) -> Option<pb::RunFunctionResponse> {
        let mut entries = self.lock();
        match entries.get(key) {
            Some(entry) if entry.expires > now => Some(entry.response.clone()),
            Some(_) => {
                entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Remembers `response` for `ttl` from `now`.
    pub fn insert(
        &self,
        key: CacheKey,
        response: pb::RunFunctionResponse,
        ttl: Duration,
        now: Instant,
    ) {
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
        entries.insert(key, Entry { response, expires });
    }

    /// Entries held now (expired ones included until touched).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the cache holds nothing.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(message: &str) -> pb::RunFunctionResponse {
        pb::RunFunctionResponse {
            results: vec![pb::Result {
                message: message.into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn key(tag: &str) -> CacheKey {
        let request = pb::RunFunctionRequest {
            meta: Some(pb::RequestMeta {
                tag: tag.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        CacheKey::of(&request, b"{}")
    }

    #[test]
    fn entries_expire() {
        let cache = ResponseCache::new(4);
        let now = Instant::now();
        cache.insert(key("a"), response("a"), Duration::from_secs(10), now);
        assert_eq!(
            cache.get(&key("a"), now + Duration::from_secs(9)),
            Some(response("a"))
        );
        assert_eq!(cache.get(&key("a"), now + Duration::from_secs(10)), None);
        assert!(cache.is_empty());
    }

    #[test]
    fn full_cache_drops_the_soonest_to_expire() {
        let cache = ResponseCache::new(2);
        let now = Instant::now();
        cache.insert(key("long"), response("l"), Duration::from_secs(100), now);
        cache.insert(key("short"), response("s"), Duration::from_secs(5), now);
        cache.insert(key("new"), response("n"), Duration::from_secs(50), now);
        assert_eq!(cache.len(), 2);
        assert!(cache.get(&key("short"), now).is_none());
        assert!(cache.get(&key("long"), now).is_some());
        assert!(cache.get(&key("new"), now).is_some());
    }

    #[test]
    fn untagged_requests_are_keyed_by_content_regardless_of_key_order() {
        let untagged = pb::RunFunctionRequest::default();
        assert_eq!(
            CacheKey::of(&untagged, br#"{"a":1,"b":2}"#),
            CacheKey::of(&untagged, br#"{"b":2,"a":1}"#)
        );
        assert_ne!(
            CacheKey::of(&untagged, br#"{"a":1}"#),
            CacheKey::of(&untagged, br#"{"a":2}"#)
        );
        assert_ne!(key("x"), key("y"));
    }

    #[test]
    fn only_positive_ttls_count() {
        let mut r = response("r");
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
}
