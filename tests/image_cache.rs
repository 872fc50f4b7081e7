//! The cache on disk, with the real binary and a real registry: private to
//! xfn's user (so no local user reaches an image's setuid binaries), every
//! entry durable before it is published, a torn entry fetched again
//! instead of failing forever.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;

use xfn_testkit::*;

/// The store's own directories (see `xfn::image::store`).
const STORE_DIRS: &[&str] = &[
    "refs",
    "manifests",
    "configs",
    "blobs",
    "blobs/sha256",
    "layers",
    "rootfs",
    "locks",
    "tmp",
    "pins",
];
/// A local user who is neither root, xfn's user nor in xfn's range.
const OTHER_USER: u32 = 4242;
/// Host uid of the namespace's root in the range mapping (`--map-root-uid`'s default).
const MAPPED_ROOT: u32 = 100_000;

fn pull(cache: &Path, image: &str, extra: &[&str]) -> Output {
    xfn_command()
        .arg("pull")
        .args(extra)
        .arg("--cache-dir")
        .arg(cache)
        .arg(image)
        .output()
        .unwrap()
}

/// An image whose second layer holds a setuid-root copy of busybox.
fn setuid_image(registry: &Registry) -> PushedImage {
    let busybox = std::fs::read("/bin/busybox").unwrap();
    ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(Layer::new().file("/bin/suid-busybox", 0o4755, busybox))
        .entrypoint(["/bin/cat"])
        .push(registry, "suid:v1")
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// The extracted copy of `file` in some layer of the cache.
fn in_some_layer(cache: &Path, file: &str) -> PathBuf {
    std::fs::read_dir(cache.join("layers"))
        .unwrap()
        .map(|e| e.unwrap().path().join(file))
        .find(|p| p.symlink_metadata().is_ok())
        .unwrap_or_else(|| panic!("no layer holds {file}"))
}

/// Every store dir is `owner`'s, mode 0700; the root `root_mode` (0710
/// where its group is the functions' root's: `xfn::image::store::owners`).
fn assert_private(cache: &Path, owner: u32, root_mode: u32) {
    for dir in std::iter::once("").chain(STORE_DIRS.iter().copied()) {
        let path = cache.join(dir);
        let want = if dir.is_empty() { root_mode } else { 0o700 };
        assert_eq!(mode(&path), want, "{} is not private", path.display());
        let uid = std::fs::metadata(&path).unwrap().uid();
        assert_eq!(uid, owner, "{} is owned by {uid}", path.display());
    }
}

/// What another local user gets trying to run `binary` and to list `dir`.
fn assert_unreachable_by_another_user(binary: &Path, dir: &Path) {
    // Through a shell: setpriv itself still holds root's capabilities when
    // it calls execve, so the path it is given is looked up as root.
    let out = unprivileged(OTHER_USER, Path::new("/bin/sh"))
        .arg("-c")
        .arg(format!("exec {} id", binary.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("Permission denied"),
        "uid {OTHER_USER} ran the image's setuid binary: status {}, stdout {:?}, stderr {err}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    let out = unprivileged(OTHER_USER, Path::new("/bin/sh"))
        .arg("-c")
        .arg(format!("exec ls {}", dir.display()))
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "uid {OTHER_USER} listed {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_cache_pulled_as_root_is_owned_by_the_mapped_root_and_no_other_user_reaches_its_setuid_binaries(
) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test pulls in the range mapping, which needs root"
    );
    let registry = Registry::start();
    let image = setuid_image(&registry);
    // Parents anyone may traverse: only the cache itself may stop them.
    let base = world_traversable_tempdir();
    let cache = base.path().join("cache");
    stdout(&pull(&cache, &image.reference, &[]));

    // The root's group is the functions' root's (the id after xfn's), which
    // alone may search it, for crun to set their containers up.
    assert_private(&cache, MAPPED_ROOT, 0o710);
    assert_eq!(std::fs::metadata(&cache).unwrap().gid(), MAPPED_ROOT + 1);
    let suid = in_some_layer(&cache, "bin/suid-busybox");
    // The bit is kept (functions run with no_new_privs, where it is inert):
    // what keeps it from other users is that they cannot reach it. Its
    // owner is the image's root: the functions' first id, not xfn's.
    assert_eq!(mode(&suid), 0o4755);
    assert_eq!(std::fs::metadata(&suid).unwrap().uid(), MAPPED_ROOT + 1);
    assert_unreachable_by_another_user(&suid, &cache.join("layers"));
}

#[test]
fn a_cache_pulled_by_an_unprivileged_user_is_private_to_that_user() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test sets up a cache dir owned by uid {NONROOT} and needs root to do so"
    );
    let registry = Registry::start();
    let image = setuid_image(&registry);
    let base = world_traversable_tempdir();
    let cache = base.path().join("cache");
    // An existing cache dir, as a volume would be: world-readable.
    dir_owned_by(&cache, NONROOT);
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = unprivileged(NONROOT, Path::new(env!("CARGO_BIN_EXE_xfn")))
        .args(["pull", "--cache-dir"])
        .arg(&cache)
        .arg(&image.reference)
        .output()
        .unwrap();
    stdout(&out);

    assert_private(&cache, NONROOT, 0o700);
    let suid = in_some_layer(&cache, "bin/suid-busybox");
    assert_eq!(std::fs::metadata(&suid).unwrap().uid(), NONROOT);
    assert_unreachable_by_another_user(&suid, &cache.join("layers"));
}

/// `<cache>/<dir>/<hex of digest>`.
fn entry(cache: &Path, dir: &str, digest: &str) -> PathBuf {
    cache.join(dir).join(digest.trim_start_matches("sha256:"))
}

/// Cuts a file to half its length, as a power loss can leave it.
fn tear(path: &Path) {
    let len = std::fs::metadata(path).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.set_len(len / 2).unwrap();
}

fn assert_whole(path: &Path, digest: &str) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(
        sha256_digest(&bytes),
        digest,
        "{} is not whole",
        path.display()
    );
}

#[test]
fn torn_configs_manifests_refs_and_blobs_are_fetched_again_never_a_lasting_error() {
    let registry = Registry::start();
    let image = ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(Layer::new().file("/fn.sh", 0o755, "#!/bin/sh\necho ran; cat\n"))
        .entrypoint(["/fn.sh"])
        .push(&registry, "torn:v1");
    let config_digest = image.image.config_digest.clone();
    let cache = tempfile::tempdir().unwrap();
    let cache = cache.path();
    stdout(&pull(cache, &image.reference, &[]));

    // A torn config: the cache does not have the image (Never says so, not
    // "corrupt"), and the next pull fetches the config again.
    let config = entry(cache, "configs", &config_digest);
    tear(&config);
    let err = failure(&pull(
        cache,
        &image.reference,
        &["--image-pull-policy", "Never"],
    ));
    assert!(err.contains("not in the cache"), "{err}");
    stdout(&pull(cache, &image.reference, &[]));
    assert_whole(&config, &config_digest);

    // A torn manifest, then a torn ref: each pull repairs it.
    let manifest = entry(cache, "manifests", &image.digest);
    tear(&manifest);
    stdout(&pull(cache, &image.reference, &[]));
    assert_whole(&manifest, &image.digest);
    let refs: Vec<PathBuf> = std::fs::read_dir(cache.join("refs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    for r in &refs {
        tear(r);
    }
    stdout(&pull(cache, &image.reference, &[]));
    for r in &refs {
        let text = std::fs::read_to_string(r).unwrap();
        assert!(text.contains(&image.digest), "{}: {text}", r.display());
    }

    // A torn blob under a lost layer dir: downloaded again, not a diff id
    // mismatch forever.
    let top = image.image.layers.last().unwrap().digest.clone();
    let blob = entry(cache, "blobs/sha256", &top);
    tear(&blob);
    std::fs::remove_dir_all(entry(cache, "layers", &top)).unwrap();
    stdout(&pull(cache, &image.reference, &[]));
    assert_whole(&blob, &top);

    // A run repairs a torn config too, and runs the function.
    tear(&config);
    let out = run_with_input(
        {
            let mut cmd = xfn_command();
            cmd.arg("run")
                .arg("--cache-dir")
                .arg(cache)
                .arg(&image.reference)
                .arg("-");
            cmd
        },
        FUNCTION_IO.as_bytes(),
    );
    assert_eq!(stdout(&out), format!("ran\n{FUNCTION_IO}"));
    assert_whole(&config, &config_digest);
}

/// One traced system call: the thread, the call and its text.
struct Call {
    name: String,
    text: String,
}

/// `strace -f -y` lines of the calls that make entries durable and publish them.
fn traced_calls(log: &str) -> Vec<Call> {
    log.lines()
        .filter_map(|line| {
            // "<pid> <name>(<args>) = <result>" or "<pid> <name>(<args> <unfinished ...>"
            let rest = line.split_once(' ')?.1.trim_start();
            let name = rest.split_once('(')?.0;
            matches!(
                name,
                "fsync" | "fdatasync" | "syncfs" | "rename" | "renameat" | "renameat2"
            )
            .then(|| Call {
                name: name.to_string(),
                text: rest.to_string(),
            })
        })
        .collect()
}

#[test]
fn every_entry_is_on_disk_before_the_rename_that_publishes_it_and_the_rename_after() {
    let registry = Registry::start();
    let image = ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(Layer::new().file("/fn.sh", 0o755, "#!/bin/sh\ncat\n"))
        .entrypoint(["/fn.sh"])
        .push(&registry, "durable:v1");
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let log = dir.path().join("strace.log");
    let out = std::process::Command::new("strace")
        .args(["-f", "-y", "-s", "256", "-e"])
        .arg("trace=fsync,fdatasync,syncfs,rename,renameat,renameat2")
        .arg("-o")
        .arg(&log)
        .arg(env!("CARGO_BIN_EXE_xfn"))
        .arg("pull")
        .arg("--cache-dir")
        .arg(&cache)
        .arg(&image.reference)
        .output()
        .expect("strace (Debian package strace)");
    stdout(&out);
    let calls = traced_calls(&std::fs::read_to_string(&log).unwrap());
    let cache = cache.display().to_string();
    let mut published = 0;
    for (i, call) in calls.iter().enumerate() {
        if !call.name.starts_with("rename") {
            continue;
        }
        let into = [
            "manifests/",
            "configs/",
            "blobs/sha256/",
            "layers/",
            "refs/",
        ]
        .iter()
        .find(|dir| call.text.contains(&format!("{cache}/{dir}")));
        let Some(into) = into else { continue };
        published += 1;
        // The temp entry it renames: the first quoted path.
        let tmp = call.text.split('"').nth(1).unwrap();
        let synced_before = calls[..i].iter().any(|c| {
            (c.name == "fsync" && c.text.contains(&format!("<{tmp}>")))
                || (c.name == "syncfs" && c.text.contains(&format!("<{tmp}>")))
        });
        assert!(synced_before, "nothing synced {tmp} before: {}", call.text);
        let parent = format!("<{cache}/{}>", into.trim_end_matches('/'));
        let dir_synced_after = calls[i + 1..]
            .iter()
            .any(|c| c.name == "fsync" && c.text.contains(&parent));
        assert!(dir_synced_after, "{parent} not synced after: {}", call.text);
    }
    // config, manifest, ref, two blobs and two layers.
    assert_eq!(published, 7, "renames seen: {published}");
}

#[test]
fn a_copy_mode_run_killed_while_it_flattens_its_image_leaves_no_rootfs_and_the_next_run_builds_it_whole(
) {
    let registry = Registry::start();
    // 16 MiB in a plain tar layer: flattening (writing it, then syncfs)
    // takes long enough to be caught at it, however fast the disk.
    let mut data = Layer::new().compression(Compression::None);
    for i in 0..4 {
        data = data.file(
            &format!("/data/{i}"),
            0o644,
            pseudo_random_bytes(i, 4 << 20),
        );
    }
    let image = ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(data)
        .layer(Layer::new().file("/fn.sh", 0o755, "#!/bin/sh\ncat\n"))
        .entrypoint(["/fn.sh"])
        .push(&registry, "flat:v1");
    let cache = tempfile::tempdir().unwrap();
    let cache = cache.path();
    stdout(&pull(cache, &image.reference, &[]));
    let copy_run = || {
        let mut cmd = xfn_command();
        cmd.args(["run", "--rootfs", "copy", "--cache-dir"])
            .arg(cache)
            .args([&image.reference, "-"]);
        xfn_testkit::child::ChildGuard::spawn_with_input(&mut cmd, FUNCTION_IO.as_bytes())
    };
    let flattening = || {
        std::fs::read_dir(cache.join("tmp")).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .contains(".rootfs.")
        })
    };

    // Killed (SIGKILL, as a crash) while its flattened rootfs is being built.
    let mut run = copy_run();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !flattening() {
        assert!(
            run.child().try_wait().unwrap().is_none(),
            "the run ended before it was seen flattening"
        );
        assert!(std::time::Instant::now() < deadline, "never flattening");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    run.child().kill().unwrap();
    let _ = run.output_within("the killed run", std::time::Duration::from_secs(60));
    let published: Vec<_> = std::fs::read_dir(cache.join("rootfs")).unwrap().collect();
    assert!(
        published.is_empty(),
        "a partial rootfs was published: {published:?}"
    );

    // The next run builds it whole, runs, and sweeps the dead one's work.
    let out = copy_run().output_within("the next run", std::time::Duration::from_secs(300));
    assert_eq!(stdout(&out), FUNCTION_IO);
    assert!(entry(cache, "rootfs", &image.digest)
        .join("data/3")
        .is_file());
    assert!(!flattening(), "the killed run's work is left in tmp/");
}
