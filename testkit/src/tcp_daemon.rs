//! An xfn daemon a test starts on loopback TCP (`xfn adapt`, `xfn host`):
//! its gRPC port and metrics port, its log, and a stop on drop.
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A loopback port free now (the kernel's pick).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A daemon serving on `127.0.0.1:port`, its metrics on `metrics_port`,
/// its stderr in a log file; stopped on drop (`child::stop`).
pub struct TcpDaemon {
    /// The daemon's process.
    pub child: Child,
    /// Its gRPC port.
    pub port: u16,
    /// Its metrics (and health) port.
    pub metrics_port: u16,
    log: PathBuf,
}

impl TcpDaemon {
    /// Spawns `command` (`xfn SUBCOMMAND` and its own flags) with
    /// `dir/cache` as cache, `--address` and `--metrics-address` on free
    /// loopback ports, and its stderr in `dir/NAME-PORT.log`; returns once
    /// it accepts connections on both ports (the metrics endpoint binds
    /// after the gRPC listener), failing the test if it exits first or
    /// does not listen within `patience`.
    pub fn start(mut command: Command, name: &str, dir: &Path, patience: Duration) -> TcpDaemon {
        let (port, metrics_port) = (free_port(), free_port());
        let log = dir.join(format!("{name}-{port}.log"));
        let child = command
            .arg("--cache-dir")
            .arg(dir.join("cache"))
            .args(["--address", &format!("127.0.0.1:{port}")])
            .args(["--metrics-address", &format!("127.0.0.1:{metrics_port}")])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("start xfn {name}: {e}"));
        let mut daemon = TcpDaemon {
            child,
            port,
            metrics_port,
            log,
        };
        let started = Instant::now();
        let listening = |port| std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
        while !(listening(port) && listening(metrics_port)) {
            if let Some(status) = daemon.child.try_wait().unwrap() {
                panic!("xfn {name} exited: {status}\n{}", daemon.log_text());
            }
            assert!(
                started.elapsed() < patience,
                "xfn {name} never listened\n{}",
                daemon.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        daemon
    }

    /// What the daemon logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The whole HTTP/1.0 answer to `GET path` on the metrics port.
    pub fn http(&self, path: &str) -> String {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.metrics_port))
            .unwrap_or_else(|e| panic!("GET {path} on the metrics port: {e}\n{}", self.log_text()));
        write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        text
    }

    /// The value of the metrics line starting with `series` (0 when absent).
    pub fn metric(&self, series: &str) -> u64 {
        let prefix = format!("{series} ");
        self.http("/metrics")
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map_or(0, |v| v.trim().parse().unwrap())
    }
}

impl Drop for TcpDaemon {
    fn drop(&mut self) {
        crate::child::stop(&mut self.child);
    }
}
