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
//! The pool asks one thing of a container, through [`Containers`]: to be
//! made ahead of a call, cleaning up after itself when that fails. [`Crun`]
//! is the real maker; the unit tests below drive the pool over a fake.
use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use tokio_util::task::TaskTracker;

use super::seam::Sandboxing;
use super::teardown::Teardown;
use super::{Created, FunctionContainer, Recipe, RootfsMaker, RunError, Settings, Started};
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
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

/// What the pool asks of a container: to be made ahead of its call. What
/// is made or left is torn down by dropping it (on the teardown thread).
pub(crate) trait Containers: Debug + Send + Sync + 'static {
    /// What every container of a key is made from.
    type Recipe: Debug + Send + Sync + 'static;
    /// A container ready for a call.
    type Waiting: Debug + Send + 'static;
    /// Makes one container of `key` from `recipe`, its teardowns through
    /// `teardown`; a creation that fails leaves nothing.
    fn create(
        &self,
        key: &PoolKey,
        recipe: &Self::Recipe,
        teardown: &Teardown,
    ) -> impl Future<Output = Result<Self::Waiting, RunError>> + Send;
    /// The container's id, for the logs.
    fn id(waiting: &Self::Waiting) -> &str;
}

/// The real maker: containers created by crun in the sandbox (`B`, a fake
/// in unit tests), on a rootfs of their own, started ahead unless
/// [`PoolOptions::start`] says not.
#[derive(Debug)]
pub(crate) struct Crun<B: Sandboxing = Sandbox> {
    pub(super) sandbox: Arc<B>,
    pub(super) rootfs: Arc<B::RootfsMaker>,
    pub(super) start: WarmStart,
}

impl<B: Sandboxing> Containers for Crun<B> {
    type Recipe = Recipe<B::Pin>;
    type Waiting = Waiting<B>;

    async fn create(
        &self,
        key: &PoolKey,
        recipe: &Recipe<B::Pin>,
        teardown: &Teardown,
    ) -> Result<Waiting<B>, RunError> {
        let settings = Settings {
            host_network: key.host_network,
            limits: key.limits(),
            ..Settings::default()
        };
        let created =
            FunctionContainer::create(&*self.sandbox, &*self.rootfs, recipe, settings, teardown)
                .await?;
        match self.start {
            WarmStart::Created => Ok(Waiting::Created(created)),
            WarmStart::Started => Ok(Waiting::Started(created.start(teardown).await?)),
        }
    }

    fn id(waiting: &Waiting<B>) -> &str {
        waiting.id()
    }
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
pub(crate) struct Warm<C: Containers = Crun> {
    waiting: C::Waiting,
    pool: Arc<Pool<C>>,
}

impl<B: Sandboxing> Warm<Crun<B>> {
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

/// The warm containers of every key.
#[derive(Debug)]
pub(crate) struct Pool<C: Containers = Crun> {
    containers: C,
    options: PoolOptions,
    state: Mutex<State<C>>,
    /// Told when a creation ends (ready or failed), for [`Pool::prepare`].
    created_one: tokio::sync::Notify,
    /// Creations and teardowns in flight, awaited by `shutdown`.
    tasks: TaskTracker,
    /// Where teardowns run: at idle priority (`teardown.rs`).
    teardown: Teardown,
}

#[derive(Debug)]
struct State<C: Containers> {
    slots: HashMap<PoolKey, Slot<C>>,
    /// Containers ready or being created, over all slots.
    total: usize,
    closed: bool,
    stats: PoolStats,
}

impl<C: Containers> Default for State<C> {
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
struct Slot<C: Containers> {
    recipe: Arc<C::Recipe>,
    ready: Vec<C::Waiting>,
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

impl<C: Containers> Slot<C> {
    fn new(recipe: C::Recipe) -> Self {
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
pub(crate) struct Lease<C: Containers = Crun> {
    pool: Arc<Pool<C>>,
    key: PoolKey,
    warm: Option<C::Waiting>,
}

impl<C: Containers> Lease<C> {
    /// The warm container, if one was ready.
    pub(crate) fn take(&mut self) -> Option<Warm<C>> {
        self.warm.take().map(|waiting| Warm {
            waiting,
            pool: Arc::clone(&self.pool),
        })
    }
}

impl<C: Containers> Drop for Lease<C> {
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

impl Pool<Crun> {
    /// A pool creating containers in `sandbox` on rootfs made by `rootfs`;
    /// starts the pool's clock.
    pub(crate) fn new(
        sandbox: Arc<Sandbox>,
        rootfs: Arc<RootfsMaker>,
        options: PoolOptions,
    ) -> Result<Arc<Self>, RunError> {
        let containers = Crun {
            sandbox,
            rootfs,
            start: options.start,
        };
        Ok(Self::with(containers, options))
    }
}

impl<C: Containers> Pool<C> {
    /// A pool of containers made by `containers`; starts the pool's clock.
    pub(super) fn with(containers: C, options: PoolOptions) -> Arc<Self> {
        let pool = Arc::new(Self {
            containers,
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

    fn lock(&self) -> MutexGuard<'_, State<C>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a call of `key` in flight and hands it a warm container when
    /// one is ready; starts creating more where recent demand wants them.
    pub(crate) fn lease(
        self: &Arc<Self>,
        key: PoolKey,
        recipe: impl FnOnce() -> C::Recipe,
    ) -> Lease<C> {
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
        recipe: impl FnOnce() -> C::Recipe,
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

    /// Makes one container of `key` (which cleans up after itself when it
    /// fails, on the pool's teardown thread).
    async fn create(&self, key: &PoolKey, recipe: &C::Recipe) -> Result<C::Waiting, RunError> {
        self.containers.create(key, recipe, &self.teardown).await
    }

    /// Puts a created container in its slot, or removes it when the slot no
    /// longer wants it.
    fn created(&self, key: &PoolKey, created: Result<C::Waiting, RunError>) {
        self.put_created(key, created);
        self.created_one.notify_waiters();
    }

    fn put_created(&self, key: &PoolKey, created: Result<C::Waiting, RunError>) {
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
                    tracing::debug!(container = C::id(&warm), "warm container ready");
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
        let mut removed: Vec<C::Waiting> = Vec::new();
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
        let removed: Vec<C::Waiting> = {
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
async fn maintain<C: Containers>(pool: Weak<Pool<C>>) {
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
    //! The pool's logic over a fake maker: no crun, no rootfs. What the
    //! fake makes or leaves is a [`Token`] that counts itself alive, so a
    //! test sees what the pool holds, hands out and tears down.
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use tokio::sync::Semaphore;

    use super::*;

    #[derive(Debug, Default)]
    struct Counts {
        /// Tokens alive now: containers made and not torn down, remains.
        live: AtomicUsize,
        /// Most tokens alive at once.
        peak: AtomicUsize,
        /// Creations started.
        made: AtomicUsize,
    }

    /// A container (or a failed creation's remains) of the fake.
    #[derive(Debug)]
    struct Token {
        id: String,
        counts: Arc<Counts>,
        /// Its teardown takes a while (on the teardown thread).
        slow: bool,
    }

    impl Drop for Token {
        fn drop(&mut self) {
            if self.slow {
                std::thread::sleep(Duration::from_millis(50));
            }
            self.counts.live.fetch_sub(1, Ordering::AcqRel);
        }
    }

    #[derive(Debug)]
    struct Fake {
        counts: Arc<Counts>,
        /// Every creation fails, leaving remains.
        fail: AtomicBool,
        slow: bool,
        /// A creation waits for a permit here.
        gate: Semaphore,
    }

    impl Fake {
        fn new() -> Self {
            Self {
                counts: Arc::default(),
                fail: AtomicBool::new(false),
                slow: false,
                gate: Semaphore::new(Semaphore::MAX_PERMITS),
            }
        }

        fn token(&self) -> Token {
            let n = self.counts.made.fetch_add(1, Ordering::AcqRel);
            let live = self.counts.live.fetch_add(1, Ordering::AcqRel) + 1;
            self.counts.peak.fetch_max(live, Ordering::AcqRel);
            Token {
                id: format!("c{n}"),
                counts: Arc::clone(&self.counts),
                slow: self.slow,
            }
        }

        fn live(&self) -> usize {
            self.counts.live.load(Ordering::Acquire)
        }
    }

    impl Containers for Fake {
        type Recipe = ();
        type Waiting = Token;

        async fn create(
            &self,
            _key: &PoolKey,
            _recipe: &(),
            teardown: &Teardown,
        ) -> Result<Token, RunError> {
            let token = self.token();
            if let Ok(permit) = self.gate.acquire().await {
                drop(permit);
            }
            tokio::task::yield_now().await;
            if self.fail.load(Ordering::Acquire) {
                teardown.drop_later(token).await;
                return Err(RunError::Timeout(Duration::ZERO));
            }
            Ok(token)
        }

        fn id(waiting: &Token) -> &str {
            &waiting.id
        }
    }

    fn key(digest: &str) -> PoolKey {
        PoolKey {
            digest: digest.to_string(),
            host_network: false,
            limits: Limits::default(),
        }
    }

    fn pool(fake: Fake, size: usize, idle: Duration) -> Arc<Pool<Fake>> {
        let options = PoolOptions {
            size,
            idle,
            start: WarmStart::Started,
        };
        Pool::with(fake, options)
    }

    const HOUR: Duration = Duration::from_secs(3600);

    /// Waits until no creation is in flight.
    async fn settled(pool: &Pool<Fake>) {
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

    fn ready(pool: &Pool<Fake>, digest: &str) -> usize {
        pool.lock()
            .slots
            .get(&key(digest))
            .map_or(0, |s| s.ready.len())
    }

    #[tokio::test]
    async fn the_pool_never_holds_more_containers_than_its_size_over_all_keys() {
        let pool = pool(Fake::new(), 3, HOUR);
        // Two calls in flight of each of two images: each key wants two.
        let leases: Vec<_> = ["a", "a", "b", "b"]
            .into_iter()
            .map(|d| pool.lease(key(d), || ()))
            .collect();
        settled(&pool).await;
        let stats = pool.stats();
        assert_eq!(stats.total, 3, "{stats:?}");
        assert_eq!(stats.ready, 3, "{stats:?}");
        assert_eq!(pool.containers.counts.peak.load(Ordering::Acquire), 3);
        drop(leases);
        settled(&pool).await;
        assert!(pool.stats().total <= 3, "{:?}", pool.stats());
        pool.shutdown().await;
        assert_eq!(pool.containers.live(), 0);
    }

    #[tokio::test]
    async fn a_key_is_refilled_to_the_most_calls_seen_in_flight_at_once() {
        let pool = pool(Fake::new(), 8, HOUR);
        let leases: Vec<_> = (0..3).map(|_| pool.lease(key("a"), || ())).collect();
        assert_eq!(pool.stats().cold_calls, 3);
        settled(&pool).await;
        assert_eq!(ready(&pool, "a"), 3);
        drop(leases);
        settled(&pool).await;
        // As many calls again find one ready each.
        let mut leases: Vec<_> = (0..3).map(|_| pool.lease(key("a"), || ())).collect();
        assert!(leases.iter_mut().all(|lease| lease.take().is_some()));
        assert_eq!(pool.stats().warm_calls, 3);
        drop(leases);
        pool.shutdown().await;
        assert_eq!(pool.containers.live(), 0);
    }

    #[tokio::test]
    async fn an_image_not_called_for_its_idle_time_loses_its_containers() {
        for (idle, kept) in [(HOUR, 1), (Duration::ZERO, 0)] {
            let pool = pool(Fake::new(), 4, idle);
            pool.prepare(key("a"), || ()).await;
            pool.maintain_once();
            assert_eq!(ready(&pool, "a"), kept, "idle {idle:?}");
            assert_eq!(pool.stats().total, kept, "idle {idle:?}");
            assert_eq!(pool.lock().slots.contains_key(&key("a")), kept == 1);
            pool.shutdown().await;
            assert_eq!(pool.containers.live(), 0);
        }
    }

    #[tokio::test]
    async fn a_failed_creation_leaks_nothing_and_its_call_goes_cold() {
        let fake = Fake::new();
        fake.fail.store(true, Ordering::Release);
        let pool = pool(fake, 4, HOUR);
        let mut lease = pool.lease(key("a"), || ());
        assert!(lease.take().is_none());
        settled(&pool).await;
        let stats = pool.stats();
        assert_eq!((stats.create_failures, stats.total, stats.ready), (1, 0, 0));
        drop(lease);
        // Within the retry window a call goes cold and starts no creation.
        let mut lease = pool.lease(key("a"), || ());
        assert!(lease.take().is_none());
        drop(lease);
        assert_eq!(pool.containers.counts.made.load(Ordering::Acquire), 1);
        assert_eq!(pool.stats().cold_calls, 2);
        pool.shutdown().await;
        // The failed creation's remains were torn down.
        assert_eq!(pool.containers.live(), 0);
    }

    #[tokio::test]
    async fn a_call_dropped_before_taking_its_warm_container_has_it_removed_not_reused() {
        let pool = pool(Fake::new(), 4, HOUR);
        pool.prepare(key("a"), || ()).await;
        // The call gets c0 and is cancelled before it takes it.
        drop(pool.lease(key("a"), || ()));
        settled(&pool).await;
        let mut lease = pool.lease(key("a"), || ());
        let warm = lease.take().expect("a replacement is ready");
        assert_eq!(warm.waiting.id, "c1");
        pool.dispose(warm.waiting);
        drop(lease);
        pool.shutdown().await;
        assert_eq!(pool.containers.live(), 0);
    }

    #[tokio::test]
    async fn shutdown_removes_every_waiting_container_and_waits_for_teardowns_in_flight() {
        let mut fake = Fake::new();
        fake.slow = true;
        let pool = pool(fake, 4, HOUR);
        pool.prepare(key("a"), || ()).await;
        pool.prepare(key("b"), || ()).await;
        // A used container's teardown, in flight when shutdown starts.
        let mut lease = pool.lease(key("a"), || ());
        let warm = lease.take().expect("one is ready");
        pool.dispose(warm.waiting);
        pool.shutdown().await;
        assert_eq!(pool.containers.live(), 0);
        let stats = pool.stats();
        assert_eq!((stats.total, stats.ready), (0, 0), "{stats:?}");
        drop(lease);
        // Closed: a later call makes nothing.
        drop(pool.lease(key("c"), || ()));
        assert_eq!(pool.stats().total, 0);
    }

    #[tokio::test]
    async fn shutdown_waits_for_creations_in_flight_and_keeps_nothing_they_make() {
        let fake = Fake::new();
        fake.gate.forget_permits(Semaphore::MAX_PERMITS);
        let pool = pool(fake, 4, HOUR);
        drop(pool.lease(key("a"), || ()));
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
        pool.containers.gate.add_permits(1);
        closing.await.expect("shutdown");
        assert_eq!(pool.containers.live(), 0);
        assert_eq!(pool.stats().discarded, 1);
    }

    #[tokio::test]
    async fn release_idle_removes_only_the_keys_of_those_images_no_call_uses() {
        let pool = pool(Fake::new(), 8, HOUR);
        let in_use = PoolKey {
            limits: Limits {
                memory_bytes: Some(1 << 20),
                ..Limits::default()
            },
            ..key("a")
        };
        pool.prepare(key("a"), || ()).await;
        pool.prepare(key("b"), || ()).await;
        let lease = pool.lease(in_use.clone(), || ());
        settled(&pool).await;
        assert_eq!(pool.containers.live(), 3);
        let (count, done) = pool.release_idle(&["a".to_string()]);
        done.await;
        assert_eq!(count, 1);
        assert_eq!(pool.containers.live(), 2);
        {
            let state = pool.lock();
            assert!(!state.slots.contains_key(&key("a")));
            assert!(state.slots.contains_key(&key("b")));
            assert!(state.slots.contains_key(&in_use));
        }
        drop(lease);
        pool.shutdown().await;
        assert_eq!(pool.containers.live(), 0);
    }
}
