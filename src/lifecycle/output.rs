//! A served container's output: every byte goes to a tail kept for its
//! errors and, line by line, to xfn's log ([`OutputLog`]: a hosted
//! function's at INFO as `function=NAME`, at most [`LOG_LINES_PER_SECOND`]
//! a second).
//!
//! # Invariants
//! - **Nothing is lost or held without bound**: each stream is read to its
//!   end; a line without end is logged in pieces of [`MAX_LOG_LINE`].
//! - **A server writing on every call does not wake xfn on every write**:
//!   a pipe wakes its serving thread on each write whether or not a task
//!   waits for it (epoll), and a function that logs a line or two per call
//!   made that the hop's dearest part past haproxy's (benches/PROFILE.md).
//!   So a stream is read when it wakes the thread only while its writes are
//!   rare ([`Pace`]); past [`WAKES_TO_TICK`] a second it is taken off epoll
//!   and read every [`TICK`] (its lines logged up to a tick late), until a
//!   tick finds it empty.
//! - **A writer does not wait long on a full pipe**: [`LOUD`] bytes found
//!   at once keep (or put) its stream on epoll for [`LOUD_FOR`], so a
//!   flood is read as it comes; a writer waits at most one tick for it.
//! - **An exit's last words make its error and the log**:
//!   [`Output::drained`] (on an exit and on a stop) has the streams read
//!   at once, not at their next tick.
use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::Notify;

use crate::sandbox::crun::STDERR_TAIL_BYTES;

/// How long an exited container's output readers are waited for: they end
/// as soon as the pipes close, so this bounds only a descendant that keeps
/// them open after the init is gone.
const DRAIN_WAIT: Duration = Duration::from_millis(500);

/// How often [`Output::drained`] tells the readers on the clock to read.
const LOOK_AGAIN: Duration = Duration::from_millis(10);

/// What the container wrote: the last [`STDERR_TAIL_BYTES`] of it, and how
/// many of its streams are still open.
#[derive(Debug, Default)]
pub(super) struct Output {
    tail: Mutex<Tail>,
    open_streams: AtomicUsize,
    /// Has a stream read on the clock read now.
    look: Notify,
    /// Told when a stream was read to its end.
    ended: Notify,
}

impl Output {
    /// Reads `stream` (a pipe, nonblocking) on this task's runtime until its
    /// end: its lines go to `log`.
    pub(super) fn forward(self: &Arc<Self>, stream: OwnedFd, log: OutputLog) {
        self.open_streams.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(forward(File::from(stream), log, Arc::clone(self)));
    }

    /// Waits (up to [`DRAIN_WAIT`]) until every stream was read to its end:
    /// a container that exited (or was killed) may have written its last
    /// words after its readers last ran, or since their last tick.
    pub(super) async fn drained(&self) {
        let deadline = tokio::time::Instant::now() + DRAIN_WAIT;
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            // Waiting before the count is read: an end between the two is
            // not missed.
            ended.as_mut().enable();
            if self.open_streams.load(Ordering::SeqCst) == 0 {
                return;
            }
            // Told again and again: a reader between two ticks is not
            // waiting to be told.
            self.look.notify_waiters();
            let again = (tokio::time::Instant::now() + LOOK_AGAIN).min(deadline);
            let _ = tokio::time::timeout_at(again, ended).await;
            if tokio::time::Instant::now() >= deadline {
                return;
            }
        }
    }

    /// The last bytes written (the streams interleaved).
    pub(super) fn tail(&self) -> Vec<u8> {
        self.tail
            .lock()
            .map(|t| t.bytes.clone())
            .unwrap_or_default()
    }
}

/// The last [`STDERR_TAIL_BYTES`] of a container's output.
#[derive(Debug, Default)]
struct Tail {
    bytes: Vec<u8>,
}

impl Tail {
    fn push(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
        if self.bytes.len() > STDERR_TAIL_BYTES {
            self.bytes.drain(..self.bytes.len() - STDERR_TAIL_BYTES);
        }
    }
}

/// How often a stream that writes often is read: a tick costs a wake of its
/// own (and tokio's timer an `eventfd` write), so not often; a log line
/// seen a quarter of a second late is still seen.
const TICK: Duration = Duration::from_millis(250);

/// Wakes in a second past which a stream is read every [`TICK`] instead:
/// two a tick, where a tick (one wake) saves at least one.
const WAKES_TO_TICK: u32 = 8;

/// Bytes read at once that make a stream loud, read as it writes: a quarter
/// of a pipe's default 64 KiB, so a writer at that pace fills its pipe in
/// no less than four ticks. One read (woken or ticked) takes no more.
const LOUD: usize = 16 * 1024;

/// How long a loud stream is read as it writes before its pace counts again.
const LOUD_FOR: Duration = Duration::from_secs(1);

/// When a stream is read: woken by each write while writes are rare, on the
/// clock while they are not.
#[derive(Debug, Default)]
struct Pace {
    /// Since when, and how many wakes since.
    window: Option<(Instant, u32)>,
    /// Read when woken, whatever the pace, until then (the stream was loud).
    woken_until: Option<Instant>,
}

impl Pace {
    /// After a wake at `now` that read `bytes`: whether to read on the
    /// clock from now on.
    fn woken(&mut self, now: Instant, bytes: usize) -> bool {
        self.loud(now, bytes);
        let (since, wakes) = match self.window {
            Some((since, wakes)) if now.duration_since(since) < Duration::from_secs(1) => {
                (since, wakes + 1)
            }
            _ => (now, 1),
        };
        self.window = Some((since, wakes));
        let calm = self.woken_until.is_none_or(|until| now >= until);
        if wakes >= WAKES_TO_TICK && calm {
            self.window = None;
            return true;
        }
        false
    }

    /// After a tick at `now` that read `bytes`: whether to go on reading on
    /// the clock.
    fn ticked(&mut self, now: Instant, bytes: usize) -> bool {
        bytes > 0 && !self.loud(now, bytes)
    }

    /// Whether `bytes` at once are loud: read as written for [`LOUD_FOR`].
    fn loud(&mut self, now: Instant, bytes: usize) -> bool {
        let loud = bytes >= LOUD;
        if loud {
            self.woken_until = Some(now + LOUD_FOR);
        }
        loud
    }
}

/// A stream as it is read now.
enum Pipe {
    /// On epoll: each write wakes the thread.
    Woken(AsyncFd<File>),
    /// Off epoll: read every [`TICK`] (or when [`Output::drained`] asks).
    Ticked(File),
}

impl Pipe {
    /// On epoll again; on the clock still where it cannot be.
    fn woken(file: File) -> Self {
        // SAFETY: the `File` owns its descriptor, which stays open and the
        // same until the `AsyncFd` is dropped or gives it back (`into_inner`).
        match unsafe { AsyncFd::register_with_interest(file, Interest::READABLE) } {
            Ok(fd) => Self::Woken(fd),
            Err(err) => {
                let (file, err) = err.into_parts();
                tracing::debug!(%err, "a server's output is read on the clock: not on epoll");
                Self::Ticked(file)
            }
        }
    }
}

/// Logs what the container writes, line by line (see [`OutputLog`]), and
/// keeps the tail for errors, reading as [`Pace`] says.
async fn forward(file: File, log: OutputLog, output: Arc<Output>) {
    let mut lines = Lines {
        log,
        output: &output,
        line: Vec::new(),
    };
    let mut buf = vec![0u8; 8 * 1024];
    let mut pace = Pace::default();
    let mut pipe = Pipe::woken(file);
    loop {
        let (read, ended) = match &pipe {
            Pipe::Woken(fd) => {
                let Ok(mut guard) = fd.readable().await else {
                    break;
                };
                let drained = drain(&mut buf, &mut lines, |buf| {
                    guard.try_io(|fd| fd.get_ref().read(buf)).ok()
                });
                if drained.short {
                    // A pipe read short is empty: its next write is a new
                    // edge (tokio's own streams clear the same way).
                    guard.clear_ready();
                }
                (drained.bytes, drained.ended)
            }
            Pipe::Ticked(file) => {
                tokio::select! {
                    () = tokio::time::sleep(TICK) => {}
                    () = output.look.notified() => {}
                }
                let drained = drain(&mut buf, &mut lines, |buf| match (&*file).read(buf) {
                    Err(err) if err.kind() == ErrorKind::WouldBlock => None,
                    read => Some(read),
                });
                (drained.bytes, drained.ended)
            }
        };
        if ended {
            break;
        }
        let now = Instant::now();
        pipe = match pipe {
            Pipe::Woken(fd) if pace.woken(now, read) => Pipe::Ticked(fd.into_inner()),
            Pipe::Ticked(file) if !pace.ticked(now, read) => Pipe::woken(file),
            same => same,
        };
    }
    lines.end();
    output.open_streams.fetch_sub(1, Ordering::SeqCst);
    output.ended.notify_waiters();
}

/// What one [`drain`] read.
struct Drained {
    bytes: usize,
    /// The stream ended (or failed).
    ended: bool,
    /// The last read was short: the pipe is empty.
    short: bool,
}

/// Reads what is in the pipe now, up to [`LOUD`] bytes, into `lines`;
/// `read` gives `None` when there is nothing.
fn drain(
    buf: &mut [u8],
    lines: &mut Lines<'_>,
    mut read: impl FnMut(&mut [u8]) -> Option<std::io::Result<usize>>,
) -> Drained {
    let mut drained = Drained {
        bytes: 0,
        ended: false,
        short: false,
    };
    while drained.bytes < LOUD {
        match read(buf) {
            None => break,
            Some(Ok(0)) => {
                drained.ended = true;
                break;
            }
            Some(Ok(n)) => {
                lines.take(&buf[..n]);
                drained.bytes += n;
                if n < buf.len() {
                    drained.short = true;
                    break;
                }
            }
            Some(Err(err)) if err.kind() == ErrorKind::Interrupted => {}
            Some(Err(_)) => {
                drained.ended = true;
                break;
            }
        }
    }
    drained
}

/// A stream's bytes cut into lines.
struct Lines<'a> {
    log: OutputLog,
    output: &'a Output,
    line: Vec<u8>,
}

impl Lines<'_> {
    fn take(&mut self, bytes: &[u8]) {
        if let Ok(mut tail) = self.output.tail.lock() {
            tail.push(bytes);
        }
        for piece in bytes.split_inclusive(|b| *b == b'\n') {
            self.line.extend_from_slice(piece);
            if self.line.ends_with(b"\n") || self.line.len() >= MAX_LOG_LINE {
                self.log.line(&self.line);
                self.line.clear();
            }
        }
    }

    /// Logs a last line without end, and what the budget dropped.
    fn end(mut self) {
        if !self.line.is_empty() {
            self.log.line(&self.line);
        }
        self.log.flush();
    }
}

/// The longest piece of a container's output logged as one line.
const MAX_LOG_LINE: usize = 8 * 1024;

/// Most lines of one output stream of a named function's server logged per
/// second; the rest are counted and the count logged. A server that logs
/// in a loop must not make xfn's log (and a node's log pipeline) pay for
/// it: 20 lines a second is far above a function's own start and error
/// lines, and bounds a flood at about 160 KiB/s of log per stream.
const LOG_LINES_PER_SECOND: u32 = 20;

/// Where a served container's output goes: a named function's (a hosted
/// Function's: an operator's only window on it, as `kubectl logs` would
/// be) at INFO as `function=NAME`, rate-limited; an unnamed one's (a
/// render's servers) at DEBUG under its container id, as noise unless
/// something goes wrong.
pub(super) struct OutputLog {
    container: String,
    function: Option<Arc<str>>,
    budget: LineBudget,
}

impl OutputLog {
    pub(super) fn new(container: String, function: Option<Arc<str>>) -> Self {
        Self {
            container,
            function,
            budget: LineBudget::default(),
        }
    }

    /// Logs one line; its text is made only where it is logged (not for a
    /// render's server with debug off, nor for a line over the budget).
    fn line(&mut self, line: &[u8]) {
        let text = || String::from_utf8_lossy(line);
        let Some(function) = &self.function else {
            tracing::debug!(container = %self.container, "function: {}", text().trim_end());
            return;
        };
        let (admitted, dropped) = self.budget.admit(Instant::now());
        say_dropped(function, dropped);
        if admitted {
            tracing::info!(function = %function, container = %self.container, "server: {}", text().trim_end());
        }
    }

    /// Says what the last window dropped, at the stream's end.
    fn flush(&mut self) {
        if let Some(function) = &self.function {
            say_dropped(function, self.budget.dropped);
        }
    }
}

/// Logs how many lines of `function`'s server a window left out, if any.
fn say_dropped(function: &str, dropped: u64) {
    if dropped > 0 {
        tracing::info!(function = %function, dropped, "lines of the server's output not logged (over {LOG_LINES_PER_SECOND} a second)");
    }
}

/// A fixed one-second window of [`LOG_LINES_PER_SECOND`] lines.
#[derive(Default)]
struct LineBudget {
    window: Option<Instant>,
    used: u32,
    dropped: u64,
}

impl LineBudget {
    /// Whether a line at `now` may be logged; when a new window opens, the
    /// lines dropped in the last one are returned to be said.
    fn admit(&mut self, now: Instant) -> (bool, u64) {
        let mut dropped = 0;
        if self
            .window
            .is_none_or(|start| now.duration_since(start) >= Duration::from_secs(1))
        {
            self.window = Some(now);
            self.used = 0;
            dropped = std::mem::take(&mut self.dropped);
        }
        if self.used < LOG_LINES_PER_SECOND {
            self.used += 1;
            (true, dropped)
        } else {
            self.dropped += 1;
            (false, dropped)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_keeps_the_last_bytes_of_the_last_lines() {
        let mut tail = Tail::default();
        for i in 0..10_000 {
            tail.push(format!("line {i}\n").as_bytes());
        }
        assert_eq!(tail.bytes.len(), STDERR_TAIL_BYTES);
        assert!(tail.bytes.ends_with(b"line 9999\n"));
    }

    #[test]
    fn a_flood_of_lines_is_cut_to_the_budget_per_second_and_the_rest_counted() {
        let mut budget = LineBudget::default();
        let start = Instant::now();
        let admitted = (0..100).filter(|_| budget.admit(start).0).count();
        assert_eq!(admitted, LOG_LINES_PER_SECOND as usize);
        // The next window admits again and says what the last one dropped.
        let (admitted, dropped) = budget.admit(start + Duration::from_secs(1));
        assert!(admitted);
        assert_eq!(dropped, 100 - u64::from(LOG_LINES_PER_SECOND));
        assert_eq!(budget.admit(start + Duration::from_secs(1)).1, 0);
    }

    #[test]
    fn rare_writes_are_read_as_they_wake_and_frequent_ones_on_the_clock() {
        let mut pace = Pace::default();
        let start = Instant::now();
        // A line every second: never on the clock.
        assert!((0..100).all(|i| !pace.woken(start + Duration::from_secs(i), 80)));
        // Two lines a call, a call every 20 ms: on the clock within a second.
        let later = start + Duration::from_secs(200);
        let switched = (0..WAKES_TO_TICK)
            .map(|i| pace.woken(later + Duration::from_millis(u64::from(i / 2) * 20), 80))
            .position(|tick| tick);
        assert_eq!(switched, Some(WAKES_TO_TICK as usize - 1));
        // A tick that finds lines keeps it there; one that finds none ends it.
        assert!(pace.ticked(later, 400));
        assert!(!pace.ticked(later, 0));
    }

    #[test]
    fn a_loud_stream_is_read_as_it_writes_for_a_while_before_its_pace_counts() {
        let mut pace = Pace::default();
        let start = Instant::now();
        assert!(!pace.ticked(start, LOUD));
        let wakes = |pace: &mut Pace, from: Instant| {
            (0..WAKES_TO_TICK).any(|i| pace.woken(from + Duration::from_micros(u64::from(i)), 80))
        };
        assert!(!wakes(&mut pace, start));
        assert!(wakes(&mut pace, start + LOUD_FOR));
        // A loud wake does the same.
        assert!(!pace.woken(start + LOUD_FOR * 2, LOUD));
        assert!(!wakes(&mut pace, start + LOUD_FOR * 2));
    }

    /// A pipe, its read end nonblocking as a served container's is.
    fn pipe() -> (OwnedFd, File) {
        let (read, write) = nix::unistd::pipe().expect("pipe");
        nix::fcntl::fcntl(
            &read,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .expect("nonblocking");
        (read, File::from(write))
    }

    #[tokio::test]
    async fn every_byte_of_a_frequent_writer_reaches_the_tail_and_its_end_is_seen() {
        use std::io::Write;
        let (read, mut write) = pipe();
        let output = Arc::new(Output::default());
        output.forward(read, OutputLog::new("c".into(), Some(Arc::from("f"))));
        // Enough wakes to go on the clock, then lines while it is.
        for i in 0..3 * WAKES_TO_TICK {
            write
                .write_all(format!("line {i}\n").as_bytes())
                .expect("write");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        write.write_all(b"last words, no end").expect("write");
        drop(write);
        output.drained().await;
        assert_eq!(output.open_streams.load(Ordering::SeqCst), 0);
        let tail = String::from_utf8(output.tail()).expect("utf-8");
        assert!(tail.starts_with("line 0\n"), "{tail}");
        assert!(tail.contains(&format!("line {}\n", 3 * WAKES_TO_TICK - 1)));
        assert!(tail.ends_with("last words, no end"), "{tail}");
    }

    #[tokio::test]
    async fn a_flood_is_read_to_its_end() {
        use std::io::Write;
        let (read, mut write) = pipe();
        let output = Arc::new(Output::default());
        output.forward(read, OutputLog::new("c".into(), None));
        // Four pipes' worth, written from a thread that blocks when full.
        let writer = std::thread::spawn(move || {
            let line = [b'x'; 1023];
            for _ in 0..256 {
                write.write_all(&line).expect("write");
                write.write_all(b"\n").expect("write");
            }
        });
        while !writer.is_finished() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        writer.join().expect("writer");
        output.drained().await;
        assert_eq!(output.open_streams.load(Ordering::SeqCst), 0);
        assert_eq!(output.tail().len(), STDERR_TAIL_BYTES);
    }
}
