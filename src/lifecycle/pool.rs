//! Warm containers: for each image and settings in recent demand, a few
//! containers created (and by default started) ahead of their calls, so
//! that a call only feeds one; the teardown runs after the reply, at idle
//! CPU priority (`teardown.rs`). Why each bound holds: docs/design.md,
//! "Warm containers".
//!
//! # Invariants
//! - **Each container serves one call** ([`Pool::lease`] removes the one it
//!   hands out) and only a call whose [`PoolKey`] (image digest, network
//!   policy, cpu and memory limits) it was made with.
//! - **Bounded**: at most `size` containers, ready or being created, over
//!   all keys; a key keeps as many as its most calls in flight lately, and
//!   loses them after `idle` without a call.
//! - **Nothing outlives the pool**: [`Pool::shutdown`] removes every waiting
//!   container and awaits teardowns in flight; a dropped pool removes its
//!   containers synchronously.
//! - **Never under the cache's collector, never over its budget**: each
//!   container pins its image until its teardown is done, and
//!   [`Pool::release_idle`] drops the keys of images no call uses.
//!
//! # The seam
//! The pool makes its containers through the lifecycle over
//! [`Sandboxing`] (crun in the [`Sandbox`]), the one seam: the unit tests
//! below drive it over the lifecycle's one fake (`super::fake`).
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use tokio_util::task::TaskTracker;

use super::seam::Sandboxing;
use super::teardown::Teardown;
use super::{Created, FunctionContainer, Recipe, RunError, Settings, Started};
use crate::sandbox::{CrunOutput, Limits, Sandbox};

/// What a container must match to serve a call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PoolKey {
    /// The image's manifest digest.
    pub(crate) digest: String,
    /// NetworkPolicy::Runner.
    pub(crate) host_network: bool,
    /// cpu, memory and pids limits.
    pub(crate) limits: Limits,
}

impl PoolKey {
    fn limits(&self) -> Limits {
        self.limits
    }
}

/// How the pool is sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolOptions {
    /// Most containers at once (ready or being created), over all images
    /// and settings; 0 turns the pool off.
    pub size: usize,
    /// Containers of an image and settings not called for this long are
    /// removed.
    pub idle: Duration,
    /// How far a container is taken before its call.
    pub start: WarmStart,
}

/// How far a warm container is taken before its call
/// (`--warm-pool-start`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WarmStart {
    /// Started: the function's process runs, blocked reading its stdin, so
    /// a call pays only for the function's own work on its input (what
    /// it does at start, an interpreter's start included, is done before).
    #[default]
    Started,
    /// Created only: the process waits before it execs the function, which
    /// starts when its call arrives (for functions that must not start
    /// before their input).
    Created,
}

/// The default pool size: two containers per CPU. A daemon runs at most
/// `--max-concurrent-runs` (the CPU count) calls at once, so one key never
/// needs more ready than that; twice as many let two images (a pipeline's
/// usual steps) each keep a container per running slot. Each costs a
/// blocked crun process and an empty tmpfs (benches/PROFILE.md).
pub(crate) fn default_size() -> usize {
    2 * std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The default idle expiry: two minutes, past Crossplane's default poll
/// interval (1m), so that an XR reconciled on that schedule still finds a
/// container; an image nobody calls costs nothing after it.
pub(crate) const DEFAULT_IDLE: Duration = Duration::from_secs(120);

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            size: default_size(),
            idle: DEFAULT_IDLE,
            start: WarmStart::default(),
        }
    }
}

/// What the pool holds now and did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Most containers at once (`PoolOptions::size`).
    pub size: usize,
    /// Containers ready for a call.
    pub ready: usize,
    /// Containers that exist: ready or being created.
    pub total: usize,
    /// Calls served by a warm container.
    pub warm_calls: u64,
    /// Calls that found none ready for their image and settings (cold).
    pub cold_calls: u64,
    /// Containers created.
    pub created: u64,
    /// Creations that failed.
    pub create_failures: u64,
    /// Containers removed unused (idle, above a key's target, shutdown).
    pub discarded: u64,
}

/// A container ready for a call (its rootfs and pin with it), created or
/// started ahead as [`PoolOptions::start`] says.
#[derive(Debug)]
pub(crate) enum Waiting<B: Sandboxing = Sandbox> {
    Created(FunctionContainer<Created, B>),
    Started(FunctionContainer<Started, B>),
}

impl<B: Sandboxing> Waiting<B> {
    fn id(&self) -> &str {
        match self {
            Waiting::Created(c) => B::id(&c.container),
            Waiting::Started(c) => B::id(&c.container),
        }
    }
}

/// A container handed to a call.
#[derive(Debug)]
pub(crate) struct Warm<B: Sandboxing = Sandbox> {
    waiting: Waiting<B>,
    pool: Arc<Pool<B>>,
}

impl<B: Sandboxing> Warm<B> {
    /// Runs the call in this container (starting it first unless it was
    /// started ahead), `timeout` from now; its teardown goes off the reply
    /// path (awaited by [`Pool::shutdown`]).
    pub(crate) async fn run(self, input: &[u8], timeout: Duration) -> Result<CrunOutput, RunError> {
        let (result, remains) = match self.waiting {
            Waiting::Created(created) => created.run(input, timeout, Instant::now()).await,
            Waiting::Started(started) => started.feed(input, timeout).await,
        };
        self.pool.dispose(remains);
        result
    }
}

/// The warm containers of every key, created by crun in the sandbox
/// (`B`, the fake in unit tests) on a rootfs of their own, started ahead
/// unless [`PoolOptions::start`] says not.
#[derive(Debug)]
pub(crate) struct Pool<B: Sandboxing = Sandbox> {
    sandbox: Arc<B>,
    rootfs: Arc<B::RootfsMaker>,
    options: PoolOptions,
    state: Mutex<State<B>>,
    /// Told when a creation ends (ready or failed), for [`Pool::prepare`].
    created_one: tokio::sync::Notify,
    /// Creations and teardowns in flight, awaited by `shutdown`.
    tasks: TaskTracker,
    /// Where teardowns run: at idle priority (`teardown.rs`).
    teardown: Teardown,
}

#[derive(Debug)]
struct State<B: Sandboxing> {
    slots: HashMap<PoolKey, Slot<B>>,
    /// Containers ready or being created, over all slots.
    total: usize,
    closed: bool,
    stats: PoolStats,
}

impl<B: Sandboxing> Default for State<B> {
    fn default() -> Self {
        Self {
            slots: HashMap::new(),
            total: 0,
            closed: false,
            stats: PoolStats::default(),
        }
    }
}

#[derive(Debug)]
struct Slot<B: Sandboxing> {
    recipe: Arc<Recipe<B::Pin>>,
    ready: Vec<Waiting<B>>,
    creating: usize,
    /// Calls of this key in flight now.
    in_use: usize,
    /// Most calls in flight at once in this window and the last one.
    peak: usize,
    last_peak: usize,
    last_call: Instant,
    /// A creation failed then: no more attempts for a while.
    failed_at: Option<Instant>,
}

impl<B: Sandboxing> Slot<B> {
    fn new(recipe: Recipe<B::Pin>) -> Self {
        Self {
            recipe: Arc::new(recipe),
            ready: Vec::new(),
            creating: 0,
            in_use: 0,
            peak: 0,
            last_peak: 0,
            last_call: Instant::now(),
            failed_at: None,
        }
    }

    /// How many containers this key should have: as many as its calls in
    /// flight at once lately, at least one while it is called.
    fn target(&self, size: usize) -> usize {
        self.peak.max(self.last_peak).max(1).min(size)
    }
}

/// One call's hold on a key: counts it in flight while it lives, and may
/// carry a warm container for it.
#[derive(Debug)]
pub(crate) struct Lease<B: Sandboxing = Sandbox> {
    pool: Arc<Pool<B>>,
    key: PoolKey,
    warm: Option<Waiting<B>>,
}

impl<B: Sandboxing> Lease<B> {
    /// The warm container, if one was ready.
    pub(crate) fn take(&mut self) -> Option<Warm<B>> {
        self.warm.take().map(|waiting| Warm {
            waiting,
            pool: Arc::clone(&self.pool),
        })
    }
}

impl<B: Sandboxing> Drop for Lease<B> {
    fn drop(&mut self) {
        {
            let mut state = self.pool.lock();
            if let Some(slot) = state.slots.get_mut(&self.key) {
                slot.in_use = slot.in_use.saturating_sub(1);
            }
        }
        // A warm container never taken (a call dropped in between) is
        // removed, never handed to another call.
        if let Some(warm) = self.warm.take() {
            self.pool.dispose(warm);
        }
        // The call is done: its container's replacement may take the CPU.
        self.pool.refill(&self.key);
    }
}

/// How long a failed creation keeps a key from trying again.
const RETRY_AFTER: Duration = Duration::from_secs(10);

impl<B: Sandboxing> Pool<B> {
    /// A pool creating containers in `sandbox` on rootfs made by `rootfs`;
    /// starts the pool's clock.
    pub(crate) fn new(
        sandbox: Arc<B>,
        rootfs: Arc<B::RootfsMaker>,
        options: PoolOptions,
    ) -> Arc<Self> {
        let pool = Arc::new(Self {
            sandbox,
            rootfs,
            options,
            state: Mutex::new(State::default()),
            created_one: tokio::sync::Notify::new(),
            tasks: TaskTracker::new(),
            teardown: Teardown::start(),
        });
        tokio::spawn(maintain(Arc::downgrade(&pool)));
        tracing::info!(
            size = options.size,
            idle = ?options.idle,
            start = ?options.start,
            "warm containers: made ahead of calls"
        );
        pool
    }

    fn lock(&self) -> MutexGuard<'_, State<B>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a call of `key` in flight and hands it a warm container when
    /// one is ready; starts creating more where recent demand wants them.
    pub(crate) fn lease(
        self: &Arc<Self>,
        key: PoolKey,
        recipe: impl FnOnce() -> Recipe<B::Pin>,
    ) -> Lease<B> {
        let warm = {
            let mut state = self.lock();
            let state = &mut *state;
            let slot = state
                .slots
                .entry(key.clone())
                .or_insert_with(|| Slot::new(recipe()));
            slot.in_use += 1;
            slot.peak = slot.peak.max(slot.in_use);
            slot.last_call = Instant::now();
            let warm = slot.ready.pop();
            if warm.is_some() {
                state.total -= 1;
                state.stats.warm_calls += 1;
            } else {
                state.stats.cold_calls += 1;
            }
            warm
        };
        // A call that found none ready has another made now, for the calls
        // behind it. A warm call's replacement is made when it is done
        // (`Lease`'s drop): made now, it would take CPU from the call it
        // replaces (crun's set-up, the next function's start: an
        // interpreter's start and imports take more CPU than many calls).
        if warm.is_none() {
            self.refill(&key);
        }
        Lease {
            pool: Arc::clone(self),
            key,
            warm,
        }
    }

    /// Has a container of `key` made ahead of a call that will come,
    /// without counting a call (a render prepares every step's container
    /// before its first step runs), and waits until one is ready or its
    /// creation failed (the call then takes the cold path and says why).
    pub(crate) async fn prepare(
        self: &Arc<Self>,
        key: PoolKey,
        recipe: impl FnOnce() -> Recipe<B::Pin>,
    ) {
        self.lock()
            .slots
            .entry(key.clone())
            .or_insert_with(|| Slot::new(recipe()))
            .last_call = Instant::now();
        self.refill(&key);
        loop {
            // Registered before the look, so that a creation ending in
            // between still wakes this.
            let created = self.created_one.notified();
            tokio::pin!(created);
            created.as_mut().enable();
            {
                let state = self.lock();
                match state.slots.get(&key) {
                    Some(slot) if slot.ready.is_empty() && slot.creating > 0 => {}
                    // Ready; or none being made (failed, no room, closed).
                    _ => return,
                }
            }
            created.await;
        }
    }

    /// Starts creating containers of `key` up to its target, within the
    /// pool's size.
    fn refill(self: &Arc<Self>, key: &PoolKey) {
        let mut state = self.lock();
        if state.closed {
            return;
        }
        let room = self.options.size.saturating_sub(state.total);
        let Some(slot) = state.slots.get_mut(key) else {
            return;
        };
        if slot.failed_at.is_some_and(|at| at.elapsed() < RETRY_AFTER) {
            return;
        }
        let have = slot.ready.len() + slot.creating;
        let wanted = slot
            .target(self.options.size)
            .saturating_sub(have)
            .min(room);
        slot.creating += wanted;
        let recipe = Arc::clone(&slot.recipe);
        state.total += wanted;
        drop(state);
        for _ in 0..wanted {
            let pool = Arc::clone(self);
            let key = key.clone();
            let recipe = Arc::clone(&recipe);
            self.tasks.spawn(async move {
                let created = pool.create(&key, &recipe).await;
                pool.created(&key, created);
            });
        }
    }

    /// Makes one container of `key` from `recipe`, started ahead unless
    /// the options say not; a creation that fails cleans up after itself
    /// (on the pool's teardown thread) and leaves nothing.
    async fn create(&self, key: &PoolKey, recipe: &Recipe<B::Pin>) -> Result<Waiting<B>, RunError> {
        let settings = Settings {
            host_network: key.host_network,
            limits: key.limits(),
            ..Settings::default()
        };
        let teardown = &self.teardown;
        let created =
            FunctionContainer::create(&*self.sandbox, &*self.rootfs, recipe, settings, teardown)
                .await?;
        match self.options.start {
            WarmStart::Created => Ok(Waiting::Created(created)),
            WarmStart::Started => Ok(Waiting::Started(created.start(teardown).await?)),
        }
    }

    /// Puts a created container in its slot, or removes it when the slot no
    /// longer wants it.
    fn created(&self, key: &PoolKey, created: Result<Waiting<B>, RunError>) {
        self.put_created(key, created);
        self.created_one.notify_waiters();
    }

    fn put_created(&self, key: &PoolKey, created: Result<Waiting<B>, RunError>) {
        let mut state = self.lock();
        let state = &mut *state;
        let closed = state.closed;
        let size = self.options.size;
        state.total -= 1;
        match &created {
            Ok(_) => state.stats.created += 1,
            Err(_) => state.stats.create_failures += 1,
        }
        let slot = state.slots.get_mut(key);
        let created = match (created, slot) {
            (Ok(warm), Some(slot)) => {
                slot.creating -= 1;
                if !closed && slot.ready.len() < slot.target(size) {
                    tracing::debug!(container = warm.id(), "warm container ready");
                    slot.ready.push(warm);
                    state.total += 1;
                    return;
                }
                Ok(warm)
            }
            (Err(err), Some(slot)) => {
                slot.creating -= 1;
                slot.failed_at = Some(Instant::now());
                Err(err)
            }
            (created, None) => created,
        };
        match created {
            Ok(warm) => {
                state.stats.discarded += 1;
                self.dispose(warm);
            }
            Err(err) => {
                tracing::warn!(
                    error = %crate::chain::Chain(&err),
                    "cannot create a warm container; calls take the cold path"
                );
            }
        }
    }

    /// Removes `remains` (a container, its leftovers, a rootfs) in the
    /// background, at idle priority: unmounting and removing take
    /// milliseconds no call needs to wait for, nor share its CPU with.
    /// `shutdown` waits for them.
    fn dispose<T: Send + 'static>(&self, remains: T) {
        self.tasks.spawn(self.teardown.drop_later(remains));
    }

    /// Ages demand; removes containers of keys no longer called for, and
    /// those above a key's target.
    fn maintain_once(&self) {
        let mut removed = Vec::new();
        {
            let mut state = self.lock();
            let state = &mut *state;
            let size = self.options.size;
            let idle = self.options.idle;
            state.slots.retain(|_, slot| {
                if slot.in_use == 0 && slot.creating == 0 && slot.last_call.elapsed() >= idle {
                    removed.append(&mut slot.ready);
                    return false;
                }
                slot.last_peak = slot.peak;
                slot.peak = slot.in_use;
                let target = slot.target(size);
                while slot.ready.len() > target {
                    if let Some(warm) = slot.ready.pop() {
                        removed.push(warm);
                    }
                }
                true
            });
            state.total -= removed.len();
            state.stats.discarded += removed.len() as u64;
        }
        if !removed.is_empty() {
            tracing::debug!(count = removed.len(), "removing idle warm containers");
            self.dispose(removed);
        }
    }

    /// Removes the keys of the images `digests` that no call uses and no
    /// creation is making a container for: their waiting containers and
    /// their recipe, so that once the returned future is done (teardowns at
    /// idle priority) nothing of the pool pins those images. How the cache
    /// budget holds with warm containers: the collector asks for this when
    /// images in use keep the cache over its budget. Returns how many
    /// containers went; a later call of such an image makes its key again.
    pub(crate) fn release_idle(
        &self,
        digests: &[String],
    ) -> (
        usize,
        impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let mut removed: Vec<Waiting<B>> = Vec::new();
        let mut recipes = Vec::new();
        {
            let mut state = self.lock();
            let state = &mut *state;
            state.slots.retain(|key, slot| {
                let idle = slot.in_use == 0 && slot.creating == 0;
                if !idle || !digests.contains(&key.digest) {
                    return true;
                }
                removed.append(&mut slot.ready);
                recipes.push(Arc::clone(&slot.recipe));
                false
            });
            state.total -= removed.len();
            state.stats.discarded += removed.len() as u64;
        }
        let count = recipes.len();
        if count > 0 {
            tracing::debug!(
                containers = removed.len(),
                keys = count,
                "removing idle warm containers: their images keep the cache over its budget"
            );
        }
        let done = self
            .tasks
            .spawn(self.teardown.drop_later((removed, recipes)));
        (count, async move {
            let _ = done.await;
        })
    }

    /// What the pool holds now and did so far.
    pub(crate) fn stats(&self) -> PoolStats {
        let state = self.lock();
        PoolStats {
            size: self.options.size,
            ready: state.slots.values().map(|s| s.ready.len()).sum(),
            total: state.total,
            ..state.stats
        }
    }

    /// Stops creating, removes every waiting container and waits until
    /// creations and teardowns in flight are done.
    pub(crate) async fn shutdown(&self) {
        let removed: Vec<Waiting<B>> = {
            let mut state = self.lock();
            state.closed = true;
            let mut removed = Vec::new();
            for slot in state.slots.values_mut() {
                removed.append(&mut slot.ready);
            }
            state.total -= removed.len();
            state.stats.discarded += removed.len() as u64;
            removed
        };
        if !removed.is_empty() {
            tracing::info!(count = removed.len(), "removing warm containers");
        }
        self.dispose(removed);
        self.tasks.close();
        self.tasks.wait().await;
        // Creations that were in flight put nothing back (closed): done.
    }
}

/// The pool's clock while it lives: ages demand every `idle / 6` (20 s by
/// default).
async fn maintain<B: Sandboxing>(pool: Weak<Pool<B>>) {
    let period = match pool.upgrade() {
        Some(pool) => (pool.options.idle / 6).max(Duration::from_millis(100)),
        None => return,
    };
    let mut age = tokio::time::interval(period);
    age.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    age.tick().await;
    loop {
        age.tick().await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        if pool.lock().closed {
            return;
        }
        pool.maintain_once();
    }
}

#[cfg(test)]
mod tests {
    //! The pool's logic over the lifecycle's one fake (`super::fake`): no
    //! crun, no rootfs. Each container the fake makes has a rootfs that
    //! counts itself alive, so a test sees what the pool holds, hands out
    //! and tears down (a failed creation's rootfs included).
    use tokio::sync::Semaphore;

    use super::super::fake::{Fails, Fake};
    use super::*;

    type FakePool = Pool<Arc<Fake>>;

    /// Containers made and not yet torn down (one rootfs each).
    fn live(fake: &Fake) -> usize {
        fake.log.live("rootfs")
    }

    fn key(digest: &str) -> PoolKey {
        PoolKey {
            digest: digest.to_string(),
            host_network: false,
            limits: Limits::default(),
        }
    }

    fn pool(fake: &Arc<Fake>, size: usize, idle: Duration) -> Arc<FakePool> {
        let options = PoolOptions {
            size,
            idle,
            start: WarmStart::Started,
        };
        Pool::new(
            Arc::new(Arc::clone(fake)),
            Arc::new(Arc::clone(fake)),
            options,
        )
    }

    const HOUR: Duration = Duration::from_secs(3600);

    /// Waits until no creation is in flight.
    async fn settled(pool: &FakePool) {
        loop {
            let created = pool.created_one.notified();
            tokio::pin!(created);
            created.as_mut().enable();
            if pool.lock().slots.values().all(|slot| slot.creating == 0) {
                return;
            }
            created.await;
        }
    }

    fn ready(pool: &FakePool, digest: &str) -> usize {
        pool.lock()
            .slots
            .get(&key(digest))
            .map_or(0, |s| s.ready.len())
    }

    #[tokio::test]
    async fn the_pool_never_holds_more_containers_than_its_size_over_all_keys() {
        let fake = Arc::new(Fake::new(Fails::Nothing));
        let pool = pool(&fake, 3, HOUR);
        // Two calls in flight of each of two images: each key wants two.
        let leases: Vec<_> = ["a", "a", "b", "b"]
            .into_iter()
            .map(|d| pool.lease(key(d), || fake.recipe()))
            .collect();
        settled(&pool).await;
        let stats = pool.stats();
        assert_eq!(stats.total, 3, "{stats:?}");
        assert_eq!(stats.ready, 3, "{stats:?}");
        assert_eq!(fake.log.peak("rootfs"), 3);
        drop(leases);
        settled(&pool).await;
        assert!(pool.stats().total <= 3, "{:?}", pool.stats());
        pool.shutdown().await;
        assert_eq!(live(&fake), 0);
    }

    #[tokio::test]
    async fn a_key_is_refilled_to_the_most_calls_seen_in_flight_at_once() {
        let fake = Arc::new(Fake::new(Fails::Nothing));
        let pool = pool(&fake, 8, HOUR);
        let leases: Vec<_> = (0..3)
            .map(|_| pool.lease(key("a"), || fake.recipe()))
            .collect();
        assert_eq!(pool.stats().cold_calls, 3);
        settled(&pool).await;
        assert_eq!(ready(&pool, "a"), 3);
        drop(leases);
        settled(&pool).await;
        // As many calls again find one ready each.
        let mut leases: Vec<_> = (0..3)
            .map(|_| pool.lease(key("a"), || fake.recipe()))
            .collect();
        assert!(leases.iter_mut().all(|lease| lease.take().is_some()));
        assert_eq!(pool.stats().warm_calls, 3);
        drop(leases);
        pool.shutdown().await;
        assert_eq!(live(&fake), 0);
    }

    #[tokio::test]
    async fn an_image_not_called_for_its_idle_time_loses_its_containers() {
        for (idle, kept) in [(HOUR, 1), (Duration::ZERO, 0)] {
            let fake = Arc::new(Fake::new(Fails::Nothing));
            let pool = pool(&fake, 4, idle);
            pool.prepare(key("a"), || fake.recipe()).await;
            pool.maintain_once();
            assert_eq!(ready(&pool, "a"), kept, "idle {idle:?}");
            assert_eq!(pool.stats().total, kept, "idle {idle:?}");
            assert_eq!(pool.lock().slots.contains_key(&key("a")), kept == 1);
            pool.shutdown().await;
            assert_eq!(live(&fake), 0);
        }
    }

    #[tokio::test]
    async fn a_failed_creation_leaks_nothing_and_its_call_goes_cold() {
        let fake = Arc::new(Fake::new(Fails::Create));
        let pool = pool(&fake, 4, HOUR);
        let mut lease = pool.lease(key("a"), || fake.recipe());
        assert!(lease.take().is_none());
        settled(&pool).await;
        let stats = pool.stats();
        assert_eq!((stats.create_failures, stats.total, stats.ready), (1, 0, 0));
        drop(lease);
        // Within the retry window a call goes cold and starts no creation.
        let mut lease = pool.lease(key("a"), || fake.recipe());
        assert!(lease.take().is_none());
        drop(lease);
        assert_eq!(fake.log.made("rootfs"), 1);
        assert_eq!(pool.stats().cold_calls, 2);
        pool.shutdown().await;
        // The failed creation's remains were torn down.
        assert_eq!(live(&fake), 0);
    }

    #[tokio::test]
    async fn a_call_dropped_before_taking_its_warm_container_has_it_removed_not_reused() {
        let fake = Arc::new(Fake::new(Fails::Nothing));
        let pool = pool(&fake, 4, HOUR);
        pool.prepare(key("a"), || fake.recipe()).await;
        // The call gets c0 and is cancelled before it takes it.
        drop(pool.lease(key("a"), || fake.recipe()));
        settled(&pool).await;
        let mut lease = pool.lease(key("a"), || fake.recipe());
        let warm = lease.take().expect("a replacement is ready");
        assert_eq!(warm.waiting.id(), "c1");
        pool.dispose(warm.waiting);
        drop(lease);
        pool.shutdown().await;
        assert_eq!(live(&fake), 0);
    }

    #[tokio::test]
    async fn shutdown_removes_every_waiting_container_and_waits_for_teardowns_in_flight() {
        let mut fake = Fake::new(Fails::Nothing);
        fake.slow = true;
        let fake = Arc::new(fake);
        let pool = pool(&fake, 4, HOUR);
        pool.prepare(key("a"), || fake.recipe()).await;
        pool.prepare(key("b"), || fake.recipe()).await;
        // A used container's teardown, in flight when shutdown starts.
        let mut lease = pool.lease(key("a"), || fake.recipe());
        let warm = lease.take().expect("one is ready");
        pool.dispose(warm.waiting);
        pool.shutdown().await;
        assert_eq!(live(&fake), 0);
        let stats = pool.stats();
        assert_eq!((stats.total, stats.ready), (0, 0), "{stats:?}");
        drop(lease);
        // Closed: a later call makes nothing.
        drop(pool.lease(key("c"), || fake.recipe()));
        assert_eq!(pool.stats().total, 0);
    }

    #[tokio::test]
    async fn shutdown_waits_for_creations_in_flight_and_keeps_nothing_they_make() {
        let fake = Arc::new(Fake::new(Fails::Nothing));
        fake.create_gate.forget_permits(Semaphore::MAX_PERMITS);
        let pool = pool(&fake, 4, HOUR);
        drop(pool.lease(key("a"), || fake.recipe()));
        assert_eq!(pool.stats().total, 1);
        let closing = tokio::spawn({
            let pool = Arc::clone(&pool);
            async move { pool.shutdown().await }
        });
        while !pool.lock().closed {
            tokio::task::yield_now().await;
        }
        // The creation cannot end until the gate opens, nor shutdown.
        assert!(!closing.is_finished());
        fake.create_gate.add_permits(1);
        closing.await.expect("shutdown");
        assert_eq!(live(&fake), 0);
        assert_eq!(pool.stats().discarded, 1);
    }

    #[tokio::test]
    async fn release_idle_removes_only_the_keys_of_those_images_no_call_uses() {
        let fake = Arc::new(Fake::new(Fails::Nothing));
        let pool = pool(&fake, 8, HOUR);
        let in_use = PoolKey {
            limits: Limits {
                memory_bytes: Some(1 << 20),
                ..Limits::default()
            },
            ..key("a")
        };
        pool.prepare(key("a"), || fake.recipe()).await;
        pool.prepare(key("b"), || fake.recipe()).await;
        let lease = pool.lease(in_use.clone(), || fake.recipe());
        settled(&pool).await;
        assert_eq!(live(&fake), 3);
        let (count, done) = pool.release_idle(&["a".to_string()]);
        done.await;
        assert_eq!(count, 1);
        assert_eq!(live(&fake), 2);
        {
            let state = pool.lock();
            assert!(!state.slots.contains_key(&key("a")));
            assert!(state.slots.contains_key(&key("b")));
            assert!(state.slots.contains_key(&in_use));
        }
        drop(lease);
        pool.shutdown().await;
        assert_eq!(live(&fake), 0);
    }
}
