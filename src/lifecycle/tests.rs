//! The lifecycle's own logic over a fake [`Sandboxing`]: no crun, no
//! rootfs. Every part the fake makes (container, rootfs, pin) writes to a
//! log when it goes, with the thread it went on, so a test sees what a
//! step leaves, what went through the teardown, and in which order.
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::pool::{Crun, Pool, PoolKey, PoolOptions, WarmStart};
use super::seam::Sandboxing;
use super::teardown::Teardown;
use super::{Created, FunctionContainer, Recipe, RunError, Settings, Started};
use crate::sandbox::{CrunError, CrunOutput, SandboxError};

/// What went, in order: (part, thread it went on).
#[derive(Debug, Default)]
struct Log(Mutex<Vec<(&'static str, String)>>);

impl Log {
    fn push(&self, part: &'static str) {
        let thread = std::thread::current().name().unwrap_or("?").to_string();
        self.0.lock().unwrap().push((part, thread));
    }

    fn parts(&self) -> Vec<&'static str> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(part, _)| *part)
            .collect()
    }

    fn threads(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(_, t)| t.clone())
            .collect()
    }
}

/// A part of a container: logged when it goes.
#[derive(Debug)]
struct Part {
    name: &'static str,
    log: Arc<Log>,
}

impl Drop for Part {
    fn drop(&mut self) {
        self.log.push(self.name);
    }
}

/// The pin: every clone is logged when it goes.
#[derive(Debug)]
struct Pin(Arc<Log>);

impl Clone for Pin {
    fn clone(&self) -> Self {
        Pin(Arc::clone(&self.0))
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.0.push("pin");
    }
}

/// The step that fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fails {
    Nothing,
    Create,
    Start,
}

#[derive(Debug)]
struct Fake {
    log: Arc<Log>,
    fails: Fails,
    /// A feed waits for a permit here (none: it never ends by itself).
    gate: Semaphore,
    /// Feeds begun.
    feeding: AtomicUsize,
}

impl Fake {
    fn new(fails: Fails) -> Self {
        Self {
            log: Arc::default(),
            fails,
            gate: Semaphore::new(Semaphore::MAX_PERMITS),
            feeding: AtomicUsize::new(0),
        }
    }

    fn part(&self, name: &'static str) -> Part {
        Part {
            name,
            log: Arc::clone(&self.log),
        }
    }

    fn recipe(&self) -> Recipe<Pin> {
        Recipe {
            config: None,
            layers: Vec::new(),
            flattened: None,
            pin: Pin(Arc::clone(&self.log)),
        }
    }
}

/// The fake's container, in any state: itself and its sandbox.
#[derive(Debug)]
struct FakeContainer {
    part: Part,
    fake: Arc<Fake>,
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

    fn id<S: std::fmt::Debug + Send + 'static>(container: &FakeContainer) -> &str {
        container.part.name
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
        tokio::task::yield_now().await;
        if self.fails == Fails::Create {
            return Err(failed());
        }
        Ok(FakeContainer {
            part: self.part("container"),
            fake: Arc::clone(self),
        })
    }

    async fn start(container: FakeContainer) -> Result<FakeContainer, (SandboxError, Part)> {
        tokio::task::yield_now().await;
        if container.fake.fails == Fails::Start {
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
        if let Ok(permit) = container.fake.gate.acquire().await {
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

async fn create(
    fake: &Arc<Fake>,
    teardown: &Teardown,
) -> Result<FunctionContainer<Created, Arc<Fake>>, RunError> {
    let recipe = fake.recipe();
    let created =
        FunctionContainer::create(fake, fake, &recipe, Settings::default(), teardown).await;
    // The recipe's own pin is not the container's: forget its going.
    drop(recipe);
    fake.log
        .0
        .lock()
        .unwrap()
        .retain(|(part, _)| *part != "pin");
    created
}

async fn started(fake: &Arc<Fake>, teardown: &Teardown) -> FunctionContainer<Started, Arc<Fake>> {
    let created = create(fake, teardown).await.expect("created");
    created.start(teardown).await.expect("started")
}

const TEARDOWN: &str = "xfn-teardown";

#[tokio::test]
async fn a_failed_create_leaves_nothing_its_rootfs_torn_down_once_before_the_error_returns() {
    let fake = Arc::new(Fake::new(Fails::Create));
    let teardown = Teardown::start();
    let err = create(&fake, &teardown).await.expect_err("create fails");
    assert!(matches!(err, RunError::Timeout(_)), "{err:?}");
    // Only the rootfs was made; it went through the teardown thread, once,
    // before the error came back. No pin was taken.
    assert_eq!(fake.log.parts(), ["rootfs"]);
    assert_eq!(fake.log.threads(), [TEARDOWN]);
}

#[tokio::test]
async fn a_failed_start_leaves_nothing_torn_down_container_then_rootfs_then_pin() {
    let fake = Arc::new(Fake::new(Fails::Start));
    let teardown = Teardown::start();
    let created = create(&fake, &teardown).await.expect("created");
    assert!(fake.log.parts().is_empty());
    let err = created.start(&teardown).await.expect_err("start fails");
    assert!(matches!(err, RunError::Timeout(_)), "{err:?}");
    assert_eq!(fake.log.parts(), ["container", "rootfs", "pin"]);
    assert_eq!(fake.log.threads(), [TEARDOWN; 3]);
}

#[tokio::test]
async fn a_call_dropped_mid_feed_tears_its_container_down_container_then_rootfs_then_pin() {
    let fake = Arc::new(Fake::new(Fails::Nothing));
    fake.gate.forget_permits(Semaphore::MAX_PERMITS);
    let teardown = Teardown::start();
    let started = started(&fake, &teardown).await;
    let mut call = Box::pin(started.feed(b"input", Duration::from_secs(60)));
    let mut context = Context::from_waker(Waker::noop());
    assert!(call.as_mut().poll(&mut context).is_pending());
    assert_eq!(fake.feeding.load(Ordering::Acquire), 1, "the feed began");
    assert!(fake.log.parts().is_empty(), "nothing went while it runs");
    // The caller goes away (a cancelled gRPC call, a timeout above).
    drop(call);
    assert_eq!(fake.log.parts(), ["container", "rootfs", "pin"]);
}

#[tokio::test]
async fn a_fed_call_leaves_remains_torn_down_container_then_rootfs_then_pin() {
    let fake = Arc::new(Fake::new(Fails::Nothing));
    let teardown = Teardown::start();
    let started = started(&fake, &teardown).await;
    let (output, remains) = started.feed(b"input", Duration::from_secs(60)).await;
    assert_eq!(output.expect("fed").stdout, b"input");
    // Nothing goes on the reply path: all waits for the teardown.
    assert!(fake.log.parts().is_empty());
    teardown.drop_later(remains).await;
    assert_eq!(fake.log.parts(), ["container", "rootfs", "pin"]);
    assert_eq!(fake.log.threads(), [TEARDOWN; 3]);
}

#[tokio::test]
async fn a_cold_run_that_fails_to_start_hands_back_all_its_remains() {
    let fake = Arc::new(Fake::new(Fails::Start));
    let teardown = Teardown::start();
    let created = create(&fake, &teardown).await.expect("created");
    let (output, remains) = created
        .run(b"input", Duration::from_secs(60), Instant::now())
        .await;
    assert!(output.is_err());
    assert!(fake.log.parts().is_empty());
    teardown.drop_later(remains).await;
    assert_eq!(fake.log.parts(), ["container", "rootfs", "pin"]);
}

#[tokio::test]
async fn a_container_dropped_unused_goes_container_then_rootfs_then_pin() {
    let fake = Arc::new(Fake::new(Fails::Nothing));
    let teardown = Teardown::start();
    let started = started(&fake, &teardown).await;
    drop(started);
    assert_eq!(fake.log.parts(), ["container", "rootfs", "pin"]);
}

/// A pool over the real lifecycle on the fake: `count` containers of as
/// many images made ahead and started.
async fn pool_of(fake: &Arc<Fake>, count: usize) -> Arc<Pool<Crun<Arc<Fake>>>> {
    let options = PoolOptions {
        size: count + 1,
        idle: Duration::from_secs(3600),
        start: WarmStart::Started,
    };
    let maker = Crun {
        sandbox: Arc::new(Arc::clone(fake)),
        rootfs: Arc::new(Arc::clone(fake)),
        start: WarmStart::Started,
    };
    let pool = Pool::with(maker, options);
    for n in 0..count {
        let key = PoolKey {
            digest: format!("sha256:{n}"),
            host_network: false,
            limits: crate::sandbox::Limits::default(),
        };
        pool.prepare(key, || fake.recipe()).await;
    }
    pool
}

#[tokio::test]
async fn shutdown_tears_down_every_waiting_container_and_awaits_the_teardowns_in_flight() {
    let fake = Arc::new(Fake::new(Fails::Nothing));
    let pool = pool_of(&fake, 2).await;
    assert_eq!(pool.stats().ready, 2);
    // A call served warm: its teardown is in flight (on the idle thread)
    // when shutdown (SIGTERM's path) begins.
    let mut lease = pool.lease(
        PoolKey {
            digest: "sha256:0".into(),
            host_network: false,
            limits: crate::sandbox::Limits::default(),
        },
        || fake.recipe(),
    );
    let warm = lease.take().expect("one is ready");
    let output = warm.run(b"input", Duration::from_secs(60)).await;
    assert_eq!(output.expect("fed").stdout, b"input");
    drop(lease);
    pool.shutdown().await;
    // Three containers (the two made ahead, the used one's replacement),
    // each gone whole and in order, none left waiting.
    assert_eq!(fake.log.parts(), ["container", "rootfs", "pin"].repeat(3));
    let stats = pool.stats();
    assert_eq!((stats.ready, stats.total), (0, 0), "{stats:?}");
}
