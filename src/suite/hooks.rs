//! Hooks: a shell command (`sh -c`) run in the directory given (the suite
//! file's), in a process group of its own, killed whole when its timeout
//! passes or when its run is dropped (a signal stopping `xfn test`); its
//! output is kept up to a bound (the rest is read and dropped, so a chatty
//! hook neither blocks nor grows xfn).
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

/// Output kept of each stream of a hook.
const MAX_OUTPUT_BYTES: usize = 64 * 1024;

/// How a hook ended.
#[derive(Debug)]
pub(crate) enum HookEnd {
    /// It exited 0: its output.
    Passed(String),
    /// It exited otherwise: its status and output.
    Failed(String),
    /// It could not run, or ran out of time.
    Error(String),
}

async fn read_bounded(mut stream: impl AsyncRead + Unpin) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buffer = [0u8; 8192];
    loop {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return kept,
            Ok(n) => {
                let room = MAX_OUTPUT_BYTES.saturating_sub(kept.len());
                kept.extend_from_slice(&buffer[..n.min(room)]);
            }
        }
    }
}

/// A hook's process group, killed whole when dropped (unless emptied).
struct Group(Option<i32>);

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Runs `command` in `dir`, for at most `timeout`.
pub(crate) async fn run(command: &str, dir: &Path, timeout: Duration) -> HookEnd {
    let mut child = match tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
    {
        Ok(child) => child,
        Err(e) => return HookEnd::Error(format!("cannot run sh: {e}")),
    };
    let pid = child.id();
    // Until the hook is waited for, dropping this run (a signal stopping
    // `xfn test`) kills its whole group: a shell's children too.
    let mut group = Group(pid.and_then(|p| i32::try_from(p).ok()));
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return HookEnd::Error("its output is not readable".into());
    };
    let work = async {
        let (out, err) = tokio::join!(read_bounded(stdout), read_bounded(stderr));
        (child.wait().await, out, err)
    };
    let ended = tokio::time::timeout(timeout, work).await;
    if ended.is_ok() {
        group.0 = None;
    }
    match ended {
        Ok((Ok(status), out, err)) => {
            if status.success() {
                let mut text = String::from_utf8_lossy(&out).into_owned();
                text.push_str(&String::from_utf8_lossy(&err));
                return HookEnd::Passed(text);
            }
            let mut text = format!("{status}");
            for stream in [out, err] {
                let stream = String::from_utf8_lossy(&stream);
                let stream = stream.trim_end();
                if !stream.is_empty() {
                    text.push('\n');
                    text.push_str(stream);
                }
            }
            HookEnd::Failed(text)
        }
        Ok((Err(e), _, _)) => HookEnd::Error(format!("cannot wait for it: {e}")),
        Err(_) => {
            drop(group);
            HookEnd::Error(format!(
                "did not finish within {timeout:?} (--hook-timeout); killed"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_hook_past_its_timeout_is_killed_with_its_children() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("child-ran");
        let command = format!("(sleep 2; touch {}) & sleep 30", marker.display());
        let end = run(&command, dir.path(), Duration::from_millis(300)).await;
        assert!(
            matches!(&end, HookEnd::Error(m) if m.contains("did not finish")),
            "{end:?}"
        );
        std::thread::sleep(Duration::from_secs(3));
        assert!(!marker.exists(), "the hook's child outlived the kill");
    }

    #[tokio::test]
    async fn a_failing_hook_says_its_status_and_output_and_a_flood_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let end = run(
            "echo out; echo err >&2; exit 3",
            dir.path(),
            Duration::from_secs(10),
        )
        .await;
        assert!(
            matches!(&end, HookEnd::Failed(m) if m.contains("exit status: 3") && m.contains("out") && m.contains("err")),
            "{end:?}"
        );
        let end = run(
            "head -c 10000000 /dev/zero; exit 1",
            dir.path(),
            Duration::from_secs(30),
        )
        .await;
        assert!(
            matches!(&end, HookEnd::Failed(m) if m.len() < 2 * MAX_OUTPUT_BYTES),
            "flood kept whole"
        );
    }
}
