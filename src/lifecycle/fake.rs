//! The one stand-in for crun: a [`Sandboxing`] whose parts (container,
//! rootfs, pin) write to a [`Log`] when they go, with the thread they went
//! on, and count themselves alive. The lifecycle's tests (`tests.rs`) and
//! the pool's (`pool.rs`) drive the real code over it, so a test sees what
//! a step leaves, what went through the teardown and in which order, and
//! what the pool holds, hands out and tears down.
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::seam::Sandboxing;
use super::{Recipe, RunError, Settings};
use crate::sandbox::{CrunError, CrunOutput, SandboxError};

/// What was made and what went, in order: (part, thread it went on).
#[derive(Debug, Default)]
pub(super) struct Log(Mutex<Entries>);

#[derive(Debug, Default)]
struct Entries {
    went: Vec<(&'static str, String)>,
    made: HashMap<&'static str, usize>,
    live: HashMap<&'static str, usize>,
    peak: HashMap<&'static str, usize>,
}

impl Log {
    fn lock(&self) -> MutexGuard<'_, Entries> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn made_one(&self, part: &'static str) {
        let mut entries = self.lock();
        *entries.made.entry(part).or_default() += 1;
        let live = entries.live.entry(part).or_default();
        *live += 1;
        let live = *live;
        let peak = entries.peak.entry(part).or_default();
        *peak = (*peak).max(live);
    }

    fn went(&self, part: &'static str, counted: bool) {
        let thread = std::thread::current().name().unwrap_or("?").to_string();
        let mut entries = self.lock();
        entries.went.push((part, thread));
        if counted {
            if let Some(live) = entries.live.get_mut(part) {
                *live -= 1;
            }
        }
    }

    /// The parts that went, in order.
    pub(super) fn parts(&self) -> Vec<&'static str> {
        self.lock().went.iter().map(|(part, _)| *part).collect()
    }

    /// The threads they went on, in order.
    pub(super) fn threads(&self) -> Vec<String> {
        self.lock().went.iter().map(|(_, t)| t.clone()).collect()
    }

    /// Forgets that any `part` went.
    pub(super) fn forget(&self, part: &'static str) {
        self.lock().went.retain(|(p, _)| *p != part);
    }

    /// How many `part`s were made.
    pub(super) fn made(&self, part: &'static str) -> usize {
        self.lock().made.get(part).copied().unwrap_or(0)
    }

    /// How many `part`s are alive now.
    pub(super) fn live(&self, part: &'static str) -> usize {
        self.lock().live.get(part).copied().unwrap_or(0)
    }

    /// Most `part`s alive at once.
    pub(super) fn peak(&self, part: &'static str) -> usize {
        self.lock().peak.get(part).copied().unwrap_or(0)
    }
}

/// A part of a container: logged when it goes.
#[derive(Debug)]
pub(super) struct Part {
    name: &'static str,
    log: Arc<Log>,
    /// Its going takes a while (on the teardown thread).
    slow: bool,
}

impl Drop for Part {
    fn drop(&mut self) {
        if self.slow {
            std::thread::sleep(Duration::from_millis(50));
        }
        self.log.went(self.name, true);
    }
}

/// The pin: every clone is logged when it goes.
#[derive(Debug)]
pub(super) struct Pin(Arc<Log>);

impl Clone for Pin {
    fn clone(&self) -> Self {
        Pin(Arc::clone(&self.0))
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.0.went("pin", false);
    }
}

/// The step that fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fails {
    Nothing,
    Create,
    Start,
}

/// The fake sandbox (and rootfs maker).
#[derive(Debug)]
pub(super) struct Fake {
    pub(super) log: Arc<Log>,
    fails: Fails,
    /// Parts take a while to go.
    pub(super) slow: bool,
    /// A creation (its rootfs made) waits for a permit here.
    pub(super) create_gate: Semaphore,
    /// A feed waits for a permit here (none: it never ends by itself).
    pub(super) feed_gate: Semaphore,
    /// Containers created, for their ids.
    created: AtomicUsize,
    /// Feeds begun.
    pub(super) feeding: AtomicUsize,
}

impl Fake {
    pub(super) fn new(fails: Fails) -> Self {
        Self {
            log: Arc::default(),
            fails,
            slow: false,
            create_gate: Semaphore::new(Semaphore::MAX_PERMITS),
            feed_gate: Semaphore::new(Semaphore::MAX_PERMITS),
            created: AtomicUsize::new(0),
            feeding: AtomicUsize::new(0),
        }
    }

    fn part(&self, name: &'static str) -> Part {
        self.log.made_one(name);
        Part {
            name,
            log: Arc::clone(&self.log),
            slow: self.slow,
        }
    }

    /// A recipe whose pin logs each of its clones' going.
    pub(super) fn recipe(&self) -> Recipe<Pin> {
        Recipe {
            config: None,
            layers: Vec::new(),
            flattened: None,
            pin: Pin(Arc::clone(&self.log)),
        }
    }
}

/// The fake's container, in any state: itself, its id and its sandbox.
#[derive(Debug)]
pub(super) struct FakeContainer {
    part: Part,
    id: String,
    fake: Arc<Fake>,
    /// Killed out of band: its start fails.
    killed: bool,
}

impl FakeContainer {
    /// Kills it out of band (as a SIGKILL to its init would).
    pub(super) fn kill(&mut self) {
        self.killed = true;
    }
}

fn failed() -> SandboxError {
    SandboxError::Crun(CrunError::Timeout(Duration::ZERO))
}

impl Sandboxing for Arc<Fake> {
    type RootfsMaker = Arc<Fake>;
    type Rootfs = Part;
    type Pin = Pin;
    type Container<S: std::fmt::Debug + Send + 'static> = FakeContainer;
    type Finished = Part;

    /// `c0`, `c1`, … in the order they were created.
    fn id<S: std::fmt::Debug + Send + 'static>(container: &FakeContainer) -> &str {
        &container.id
    }

    async fn prepare(
        maker: &Arc<Fake>,
        _layers: Vec<std::path::PathBuf>,
        _flattened: Option<std::path::PathBuf>,
    ) -> Result<Part, RunError> {
        Ok(maker.part("rootfs"))
    }

    async fn create(
        &self,
        _rootfs: &Part,
        _recipe: &Recipe<Pin>,
        _settings: Settings<'_>,
    ) -> Result<FakeContainer, SandboxError> {
        if let Ok(permit) = self.create_gate.acquire().await {
            drop(permit);
        }
        tokio::task::yield_now().await;
        if self.fails == Fails::Create {
            return Err(failed());
        }
        let n = self.created.fetch_add(1, Ordering::AcqRel);
        Ok(FakeContainer {
            part: self.part("container"),
            id: format!("c{n}"),
            fake: Arc::clone(self),
            killed: false,
        })
    }

    async fn start(container: FakeContainer) -> Result<FakeContainer, (SandboxError, Part)> {
        tokio::task::yield_now().await;
        if container.fake.fails == Fails::Start || container.killed {
            return Err((failed(), container.part));
        }
        Ok(container)
    }

    async fn run(
        container: FakeContainer,
        input: &[u8],
        timeout: Duration,
        _since: Instant,
    ) -> (Result<CrunOutput, SandboxError>, Part) {
        match Self::start(container).await {
            Ok(started) => Self::feed(started, input, timeout).await,
            Err((err, finished)) => (Err(err), finished),
        }
    }

    async fn feed(
        container: FakeContainer,
        input: &[u8],
        _timeout: Duration,
    ) -> (Result<CrunOutput, SandboxError>, Part) {
        container.fake.feeding.fetch_add(1, Ordering::AcqRel);
        if let Ok(permit) = container.fake.feed_gate.acquire().await {
            drop(permit);
        }
        let output = CrunOutput {
            stdout: input.to_vec(),
            stderr_tail: Vec::new(),
            usage: None,
        };
        (Ok(output), container.part)
    }
}
