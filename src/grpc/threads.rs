//! The serving threads: one per CPU, each a tokio current-thread runtime,
//! and every accepted connection served wholly on one of them.
//!
//! Why: under tokio's multi-thread scheduler a call's work moved between
//! workers — the connection's task (its TLS, its HTTP/2), the task hyper
//! spawned per request (xfn's own server, `super::http2`, spawns none), the task of the function server's connection
//! (`function_server::client`) — and each move woke a parked worker: two
//! `futex` and two context switches per call (benches/PROFILE.md, "Thread
//! per core for the hop"). On a thread of its own a connection's tasks
//! wake only that thread, as haproxy runs a connection and its backend on
//! one. Invariants:
//! - **A connection is handed over once**, accepted (and counted against
//!   the connections' cap) on the daemon's runtime, then registered with
//!   the chosen thread's reactor and served there; its calls, and the tasks
//!   they spawn, run on that thread. Each thread knows its [`index`], by
//!   which a function server's client keeps one upstream connection per
//!   thread (`function_server::client`): a call never crosses to another.
//! - **Fewest connections first**: N connections land on N threads.
//! - **The threads outlive every daemon's serving**: what calls spawn
//!   there (a server's output readers, its exit watch, its connection) is
//!   still needed by the drain and the servers' stop after serving ends;
//!   [`stop`] ends them once the daemon is done (`cli::main`).
//! - Long work stays off them as off any async thread: crun is a process,
//!   a rootfs is made on blocking threads.
use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tokio::runtime::Handle;

/// What each serving thread is called (`/proc/PID/task/TID/comm`), its
/// index after it.
pub(crate) const THREAD_NAME: &str = "xfn-serve-";

/// How long a stopping thread waits for its blocking tasks.
const STOP_WAIT: Duration = Duration::from_secs(1);

/// One serving thread.
#[derive(Debug)]
struct Thread {
    handle: Handle,
    /// Connections it serves now.
    connections: AtomicUsize,
    /// Sent (dropped) to end it, with its join handle.
    stop: Mutex<
        Option<(
            tokio::sync::oneshot::Sender<()>,
            std::thread::JoinHandle<()>,
        )>,
    >,
}

/// The serving threads, made on the first connection.
static THREADS: OnceLock<Vec<Thread>> = OnceLock::new();

thread_local! {
    /// This thread's index among the serving threads; `None` on any other.
    static INDEX: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The index of the serving thread this runs on, `None` off them (the
/// daemon's runtime, a blocking task, `xfn run`'s or render's runtime).
pub(crate) fn index() -> Option<usize> {
    INDEX.with(Cell::get)
}

/// How many serving threads there are, or will be once the first
/// connection starts them: every [`index`] is below it. Starts none.
pub(crate) fn count() -> usize {
    THREADS.get().map_or_else(wanted, Vec::len)
}

/// One serving thread per CPU.
fn wanted() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

fn threads() -> &'static [Thread] {
    THREADS.get_or_init(|| {
        let wanted = wanted();
        let threads: Vec<Thread> = (0..wanted).map_while(start).collect();
        if threads.len() < wanted {
            tracing::warn!(
                wanted,
                started = threads.len(),
                "cannot start every serving thread; connections are served on the rest"
            );
        }
        threads
    })
}

/// Starts serving thread `index`; `None` (logged) when it cannot be.
fn start(index: usize) -> Option<Thread> {
    let made = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .and_then(|runtime| {
            let handle = runtime.handle().clone();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let thread = std::thread::Builder::new()
                .name(format!("{THREAD_NAME}{index}"))
                .spawn(move || {
                    INDEX.with(|i| i.set(Some(index)));
                    runtime.block_on(async {
                        let _ = stopped.await;
                    });
                    runtime.shutdown_timeout(STOP_WAIT);
                })?;
            Ok((handle, stop, thread))
        });
    match made {
        Ok((handle, stop, thread)) => Some(Thread {
            handle,
            connections: AtomicUsize::new(0),
            stop: Mutex::new(Some((stop, thread))),
        }),
        Err(err) => {
            tracing::warn!(index, error = %crate::chain::Chain(&err), "cannot start a serving thread");
            None
        }
    }
}

/// Counts a connection on its thread until its task ends.
struct Serving(&'static Thread);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves one connection (`serve`, which registers its socket) on the
/// serving thread with the fewest; on the current runtime when there is
/// none.
pub(crate) fn serve_connection<F>(serve: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let Some(thread) = threads()
        .iter()
        .min_by_key(|t| t.connections.load(Ordering::Relaxed))
    else {
        tokio::spawn(serve);
        return;
    };
    thread.connections.fetch_add(1, Ordering::Relaxed);
    let serving = Serving(thread);
    thread.handle.spawn(async move {
        let _serving = serving;
        serve.await;
    });
}

/// Ends the serving threads (dropping what still runs there) and waits
/// for them: after the daemon is done, before the process exits.
pub(crate) fn stop() {
    let Some(threads) = THREADS.get() else {
        return;
    };
    let stops: Vec<_> = threads
        .iter()
        .filter_map(|t| t.stop.lock().unwrap_or_else(|p| p.into_inner()).take())
        .collect();
    for (stop, thread) in stops {
        drop(stop);
        let _ = thread.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread_name() -> String {
        std::thread::current()
            .name()
            .unwrap_or_default()
            .to_string()
    }

    #[tokio::test]
    async fn connections_go_to_the_serving_thread_with_the_fewest_which_knows_its_index() {
        let count = threads().len();
        assert_eq!(
            count,
            std::thread::available_parallelism().map_or(1, usize::from)
        );
        assert_eq!(super::count(), count);
        assert_eq!(index(), None, "the test's own thread is no serving thread");
        // Each held open until told: N at once land on N threads.
        let (names, mut named) = tokio::sync::mpsc::unbounded_channel();
        let mut holds = Vec::new();
        for _ in 0..count {
            let (hold, held) = tokio::sync::oneshot::channel::<()>();
            holds.push(hold);
            let names = names.clone();
            serve_connection(async move {
                let _ = names.send((thread_name(), index()));
                let _ = held.await;
            });
        }
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..count {
            let (name, index) = named.recv().await.unwrap();
            // Its index is the one in its name.
            let index = index.map(|i| format!("{THREAD_NAME}{i}"));
            assert_eq!(index.as_ref(), Some(&name));
            seen.insert(name);
        }
        assert_eq!(seen.len(), count, "{seen:?}");
        // What a connection's task spawns runs on its thread too.
        let (spawned, on) = tokio::sync::oneshot::channel();
        serve_connection(async move {
            let outer = thread_name();
            let inner = tokio::spawn(async { thread_name() }).await.unwrap();
            let _ = spawned.send((outer, inner));
        });
        let (outer, inner) = on.await.unwrap();
        assert_eq!(outer, inner);
        drop(holds);
    }
}
