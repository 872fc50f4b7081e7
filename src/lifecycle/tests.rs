//! The lifecycle's own logic over the one fake [`Sandboxing`]
//! (`fake.rs`): no crun, no rootfs. A test sees what a step leaves, what
//! went through the teardown, and in which order.
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::fake::{Fails, Fake};
use super::pool::{Pool, PoolKey, PoolOptions, WarmStart};
use super::teardown::Teardown;
use super::{Created, FunctionContainer, Origin, RunError, Settings, Started};

async fn create(
    fake: &Arc<Fake>,
    teardown: &Teardown,
) -> Result<FunctionContainer<Created, Arc<Fake>>, RunError> {
    let recipe = fake.recipe();
    let created =
        FunctionContainer::create(fake, fake, &recipe, Settings::default(), teardown).await;
    // The recipe's own pin is not the container's: forget its going.
    drop(recipe);
    fake.log.forget("pin");
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
    fake.feed_gate.forget_permits(Semaphore::MAX_PERMITS);
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

/// `prepared` started, or a container created and started in its stead.
async fn start_or_create(
    fake: &Arc<Fake>,
    prepared: Option<FunctionContainer<Created, Arc<Fake>>>,
    teardown: &Teardown,
) -> Result<(FunctionContainer<Started, Arc<Fake>>, Origin), RunError> {
    let recipe = fake.recipe();
    let started = FunctionContainer::start_or_create(
        prepared,
        fake,
        fake,
        &recipe,
        Settings::default(),
        teardown,
    )
    .await;
    drop(recipe);
    fake.log.forget("pin");
    started
}

#[tokio::test]
async fn a_container_created_ahead_is_started_by_its_call_and_no_other_is_created() {
    let fake = Arc::new(Fake::new(Fails::Nothing));
    let teardown = Teardown::start();
    let prepared = create(&fake, &teardown).await.expect("created ahead");
    let (started, origin) = start_or_create(&fake, Some(prepared), &teardown)
        .await
        .expect("started");
    assert_eq!(origin, Origin::Prepared);
    assert_eq!(fake.log.made("container"), 1, "the start consumed it");
    assert_eq!(fake.log.made("rootfs"), 1);
    assert!(fake.log.parts().is_empty(), "nothing went");
    drop(started);
    assert_eq!(fake.log.parts(), ["container", "rootfs", "pin"]);
}

#[tokio::test]
async fn a_container_created_ahead_and_killed_out_of_band_is_torn_down_and_another_created() {
    let fake = Arc::new(Fake::new(Fails::Nothing));
    let teardown = Teardown::start();
    let mut prepared = create(&fake, &teardown).await.expect("created ahead");
    prepared.container.kill();
    // The recipe lives on: every pin that goes is a container's.
    let recipe = fake.recipe();
    let (started, origin) = FunctionContainer::start_or_create(
        Some(prepared),
        &fake,
        &fake,
        &recipe,
        Settings::default(),
        &teardown,
    )
    .await
    .expect("started");
    assert_eq!(origin, Origin::Created);
    assert_eq!(fake.log.made("container"), 2);
    // The dead one went whole, through the teardown, before the new one
    // was handed out; the new one is alive.
    assert_eq!(fake.log.parts(), ["container", "rootfs", "pin"]);
    assert_eq!(fake.log.threads(), [TEARDOWN; 3]);
    assert_eq!(fake.log.live("container"), 1);
    drop(started);
    assert_eq!(fake.log.live("container"), 0);
}

#[tokio::test]
async fn with_none_created_ahead_one_is_created_and_a_failed_creation_leaves_nothing() {
    let fake = Arc::new(Fake::new(Fails::Nothing));
    let teardown = Teardown::start();
    let (_started, origin) = start_or_create(&fake, None, &teardown)
        .await
        .expect("started");
    assert_eq!(origin, Origin::Created);
    assert_eq!(fake.log.made("container"), 1);

    let failing = Arc::new(Fake::new(Fails::Create));
    let err = start_or_create(&failing, None, &teardown)
        .await
        .expect_err("the creation fails");
    assert!(matches!(err, RunError::Timeout(_)), "{err:?}");
    assert_eq!(failing.log.parts(), ["rootfs"]);
    assert_eq!(failing.log.live("rootfs"), 0);
}

/// A pool over the real lifecycle on the fake: `count` containers of as
/// many images made ahead and started.
async fn pool_of(fake: &Arc<Fake>, count: usize) -> Arc<Pool<Arc<Fake>>> {
    let options = PoolOptions {
        size: count + 1,
        idle: Duration::from_secs(3600),
        start: WarmStart::Started,
    };
    let pool = Pool::new(
        Arc::new(Arc::clone(fake)),
        Arc::new(Arc::clone(fake)),
        options,
    );
    for n in 0..count {
        pool.prepare(key(n), || fake.recipe()).await;
    }
    pool
}

fn key(n: usize) -> PoolKey {
    PoolKey {
        digest: format!("sha256:{n}"),
        host_network: false,
        limits: crate::sandbox::Limits::default(),
    }
}

#[tokio::test]
async fn shutdown_tears_down_every_waiting_container_and_awaits_the_teardowns_in_flight() {
    let fake = Arc::new(Fake::new(Fails::Nothing));
    let pool = pool_of(&fake, 2).await;
    assert_eq!(pool.stats().ready, 2);
    // A call served warm: its teardown is in flight (on the idle thread)
    // when shutdown (SIGTERM's path) begins.
    let mut lease = pool.lease(key(0), || fake.recipe());
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
