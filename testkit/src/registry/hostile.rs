//! A hostile registry: a tiny HTTP/1.1 server on 127.0.0.1 that serves the
//! OCI distribution endpoints xfn pulls through (`GET /v2/`, manifests by
//! tag or digest, blobs) from memory, with the faults a real
//! `docker-registry` never has: a manifest far past any bound (with or
//! without a `Content-Length` saying so), a blob longer or shorter than its
//! descriptor, and a response that drips one byte at a time for as long as
//! the client listens. Faults can be switched while a client is connected,
//! and the server reports what it sent, so tests check states ("the drip
//! is still open", "16 MiB of a 256 MiB manifest went out"), never
//! durations. One thread per connection, `Connection: close`; stopped
//! when dropped.
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::image::{ImageBuilder, PushedImage};

/// What a hostile registry does instead of answering honestly.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Serves a manifest of `len` bytes (JSON that never ends): with a
    /// `Content-Length` saying so when `announced`, else chunked, so only
    /// counting while reading can stop it.
    HugeManifest {
        /// Bytes offered.
        len: u64,
        /// Whether `Content-Length` gives the size up front.
        announced: bool,
    },
    /// The blob, then `extra` more bytes (the descriptor's digest still
    /// matches its first `size` bytes).
    LongerBlob {
        /// Bytes appended.
        extra: usize,
    },
    /// The blob without its last `missing` bytes (an honest
    /// `Content-Length` for what is sent).
    ShorterBlob {
        /// Bytes left out.
        missing: usize,
    },
    /// The honest response, one byte per `every`, until it is whole or the
    /// client hangs up.
    Drip {
        /// Time between bytes.
        every: Duration,
    },
}

/// Where a fault applies.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// Every manifest request.
    Manifests,
    /// Requests for this blob digest.
    Blob(String),
}

#[derive(Default)]
struct State {
    /// `repo/manifests/ref` → (media type, bytes).
    manifests: HashMap<String, (String, Vec<u8>)>,
    /// digest → bytes.
    blobs: HashMap<String, Vec<u8>>,
    faults: HashMap<Target, Fault>,
}

/// What the server saw and sent, for assertions.
#[derive(Default)]
struct Counters {
    /// Every request read, the `/v2/` ping and HEADs too.
    requests: AtomicUsize,
    manifest_gets: AtomicUsize,
    blob_gets: AtomicUsize,
    /// Body bytes sent on faulted responses.
    fault_bytes: AtomicU64,
    drips_started: AtomicUsize,
    drips_open: AtomicUsize,
    /// Drips that ended because the client went away.
    drips_abandoned: AtomicUsize,
}

/// A running hostile registry.
pub struct HostileRegistry {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
}

impl HostileRegistry {
    /// Starts serving on a free port of 127.0.0.1 (loopback: xfn talks
    /// plain HTTP to it).
    pub fn start() -> HostileRegistry {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(Mutex::new(State::default()));
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        {
            let (state, counters, stop) = (state.clone(), counters.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((conn, _)) => {
                            let (state, counters, stop) =
                                (state.clone(), counters.clone(), stop.clone());
                            std::thread::spawn(move || {
                                let _ = serve(conn, &state, &counters, &stop);
                            });
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            });
        }
        HostileRegistry {
            addr,
            state,
            counters,
            stop,
        }
    }

    /// `IP:PORT/NAME` for `name` like `fn:v1`.
    pub fn reference(&self, name: &str) -> String {
        format!("{}/{name}", self.addr)
    }

    /// Serves `image` as `name` (`repo:tag`), honestly until a fault says
    /// otherwise.
    pub fn serve(&self, image: &ImageBuilder, name: &str) -> PushedImage {
        let built = image.build();
        let (repo, tag) = name.rsplit_once(':').expect("name is repo:tag");
        let media_type = serde_json::from_slice::<serde_json::Value>(&built.manifest)
            .expect("manifest json")["mediaType"]
            .as_str()
            .expect("manifest mediaType")
            .to_string();
        let mut state = self.state.lock().unwrap();
        for key in [tag, built.digest.as_str()] {
            state.manifests.insert(
                format!("{repo}/manifests/{key}"),
                (media_type.clone(), built.manifest.clone()),
            );
        }
        state
            .blobs
            .insert(built.config_digest.clone(), built.config.clone());
        for layer in &built.layers {
            state.blobs.insert(layer.digest.clone(), layer.data.clone());
        }
        PushedImage {
            reference: self.reference(name),
            digest: built.digest.clone(),
            image: built,
        }
    }

    /// From now on, requests for `target` get `fault`.
    pub fn fault(&self, target: Target, fault: Fault) {
        self.state.lock().unwrap().faults.insert(target, fault);
    }

    /// From now on, every request is answered honestly, and a drip in
    /// progress sends the rest of its response at once.
    pub fn heal(&self) {
        self.state.lock().unwrap().faults.clear();
    }

    /// Requests of any kind read so far (the `/v2/` ping and HEADs too).
    pub fn requests(&self) -> usize {
        self.counters.requests.load(Ordering::SeqCst)
    }

    /// Manifest GETs served so far.
    pub fn manifest_gets(&self) -> usize {
        self.counters.manifest_gets.load(Ordering::SeqCst)
    }

    /// Blob GETs served so far.
    pub fn blob_gets(&self) -> usize {
        self.counters.blob_gets.load(Ordering::SeqCst)
    }

    /// Body bytes written on faulted responses so far (what got past the
    /// kernel's socket buffers towards the client).
    pub fn fault_bytes(&self) -> u64 {
        self.counters.fault_bytes.load(Ordering::SeqCst)
    }

    /// Dripping responses begun so far.
    pub fn drips_started(&self) -> usize {
        self.counters.drips_started.load(Ordering::SeqCst)
    }

    /// Dripping responses still being sent.
    pub fn drips_open(&self) -> usize {
        self.counters.drips_open.load(Ordering::SeqCst)
    }

    /// Dripping responses the client hung up on.
    pub fn drips_abandoned(&self) -> usize {
        self.counters.drips_abandoned.load(Ordering::SeqCst)
    }

    /// Polls (every 10 ms, up to `limit`) until `done` holds; panics
    /// naming `what` otherwise. A wait for a state, bounded so a broken
    /// xfn fails the test instead of hanging it.
    pub fn wait_until(&self, what: &str, limit: Duration, done: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + limit;
        while !done(self) {
            assert!(Instant::now() < deadline, "never happened: {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for HostileRegistry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The request line's method and path (headers read and ignored: GETs
/// and HEADs carry no body).
fn read_request(conn: &mut TcpStream) -> std::io::Result<(String, String)> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte)? == 0 || head.len() > 64 << 10 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    let mut words = head.split_whitespace();
    let method = words.next().unwrap_or_default().to_string();
    let path = words.next().unwrap_or_default().to_string();
    Ok((method, path))
}

fn serve(
    mut conn: TcpStream,
    state: &Mutex<State>,
    counters: &Counters,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    let (method, path) = read_request(&mut conn)?;
    counters.requests.fetch_add(1, Ordering::SeqCst);
    let head_only = method == "HEAD";
    let path = path.split('?').next().unwrap_or_default();
    if path == "/v2/" || path == "/v2" {
        return respond(&mut conn, 200, "application/json", &[], b"{}", head_only);
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return not_found(&mut conn, head_only);
    };
    let (target, found) = {
        let state = state.lock().unwrap();
        if rest.contains("/manifests/") {
            let found = state.manifests.get(rest).cloned();
            (Target::Manifests, found)
        } else if let Some((_, digest)) = rest.split_once("/blobs/") {
            let found = state
                .blobs
                .get(digest)
                .map(|b| ("application/octet-stream".to_string(), b.clone()));
            (Target::Blob(digest.to_string()), found)
        } else {
            (Target::Manifests, None)
        }
    };
    let Some((media_type, body)) = found else {
        return not_found(&mut conn, head_only);
    };
    let is_manifest = target == Target::Manifests;
    if !head_only {
        let counter = if is_manifest {
            &counters.manifest_gets
        } else {
            &counters.blob_gets
        };
        counter.fetch_add(1, Ordering::SeqCst);
    }
    let digest = crate::layer::sha256_digest(&body);
    let mut headers = vec![("Docker-Content-Digest", digest.as_str())];
    let fault = state.lock().unwrap().faults.get(&target).cloned();
    let fault = fault.filter(|_| !head_only);
    match fault {
        None => respond(&mut conn, 200, &media_type, &headers, &body, head_only),
        Some(Fault::LongerBlob { extra }) => {
            let mut longer = body.clone();
            longer.extend(std::iter::repeat_n(0u8, extra));
            counters
                .fault_bytes
                .fetch_add(longer.len() as u64, Ordering::SeqCst);
            respond(&mut conn, 200, &media_type, &headers, &longer, false)
        }
        Some(Fault::ShorterBlob { missing }) => {
            let shorter = &body[..body.len().saturating_sub(missing)];
            counters
                .fault_bytes
                .fetch_add(shorter.len() as u64, Ordering::SeqCst);
            respond(&mut conn, 200, &media_type, &headers, shorter, false)
        }
        Some(Fault::HugeManifest { len, announced }) => {
            headers.clear();
            huge(&mut conn, &media_type, len, announced, counters, stop)
        }
        Some(Fault::Drip { every }) => {
            counters.drips_started.fetch_add(1, Ordering::SeqCst);
            counters.drips_open.fetch_add(1, Ordering::SeqCst);
            let healed = || !state.lock().unwrap().faults.contains_key(&target);
            let result = drip(
                &mut conn,
                &media_type,
                &headers,
                &body,
                every,
                &healed,
                counters,
                stop,
            );
            if result.is_err() {
                counters.drips_abandoned.fetch_add(1, Ordering::SeqCst);
            }
            counters.drips_open.fetch_sub(1, Ordering::SeqCst);
            result
        }
    }
}

fn write_head(
    conn: &mut TcpStream,
    status: u16,
    media_type: &str,
    headers: &[(&str, &str)],
    length: Option<u64>,
) -> std::io::Result<()> {
    let mut head =
        format!("HTTP/1.1 {status} X\r\nContent-Type: {media_type}\r\nConnection: close\r\n");
    match length {
        Some(n) => head.push_str(&format!("Content-Length: {n}\r\n")),
        None => head.push_str("Transfer-Encoding: chunked\r\n"),
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes())
}

fn respond(
    conn: &mut TcpStream,
    status: u16,
    media_type: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    head_only: bool,
) -> std::io::Result<()> {
    write_head(conn, status, media_type, headers, Some(body.len() as u64))?;
    if !head_only {
        conn.write_all(body)?;
    }
    conn.flush()
}

fn not_found(conn: &mut TcpStream, head_only: bool) -> std::io::Result<()> {
    let body =
        br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"unknown to the hostile registry"}]}"#;
    respond(conn, 404, "application/json", &[], body, head_only)
}

/// `len` bytes of a JSON object that never closes, in 64 KiB writes,
/// until all are sent or the client hangs up.
fn huge(
    conn: &mut TcpStream,
    media_type: &str,
    len: u64,
    announced: bool,
    counters: &Counters,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    write_head(conn, 200, media_type, &[], announced.then_some(len))?;
    let opening = br#"{"schemaVersion":2,"annotations":{"padding":""#;
    let filler = vec![b'a'; 64 << 10];
    let mut sent = 0u64;
    let mut first = true;
    while sent < len && !stop.load(Ordering::Relaxed) {
        let mut chunk: Vec<u8> = if first { opening.to_vec() } else { Vec::new() };
        first = false;
        let room = (len - sent).min(filler.len() as u64) as usize;
        chunk.extend_from_slice(&filler[..room.saturating_sub(chunk.len())]);
        if announced {
            conn.write_all(&chunk)?;
        } else {
            conn.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())?;
            conn.write_all(&chunk)?;
            conn.write_all(b"\r\n")?;
        }
        sent += chunk.len() as u64;
        counters
            .fault_bytes
            .fetch_add(chunk.len() as u64, Ordering::SeqCst);
    }
    if !announced {
        conn.write_all(b"0\r\n\r\n")?;
    }
    conn.flush()
}

/// The honest response, one byte per `every` until `healed` (then the
/// rest at once); an error once the client has gone (a write to a closed
/// connection fails).
#[allow(clippy::too_many_arguments)]
fn drip(
    conn: &mut TcpStream,
    media_type: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    every: Duration,
    healed: &dyn Fn() -> bool,
    counters: &Counters,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    write_head(conn, 200, media_type, headers, Some(body.len() as u64))?;
    for (sent, byte) in body.iter().enumerate() {
        if stop.load(Ordering::Relaxed) {
            return Err(std::io::ErrorKind::Interrupted.into());
        }
        if healed() {
            conn.write_all(&body[sent..])?;
            return conn.flush();
        }
        conn.write_all(std::slice::from_ref(byte))?;
        conn.flush()?;
        counters.fault_bytes.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(every);
    }
    Ok(())
}
