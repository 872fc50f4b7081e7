//! `xfn pull` and `xfn cache ls`, the real binary end to end, as root and as
//! an unprivileged user without capabilities.

use std::process::Output;

use xfn_testkit::*;

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn function_image() -> ImageBuilder {
    ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(Layer::new().file("/fn.sh", 0o755, "#!/bin/sh\ncat\n"))
        .entrypoint(["/fn.sh"])
}

#[test]
fn pull_then_cache_ls() {
    let registry = Registry::start();
    let pushed = function_image().push(&registry, "fn:v1");
    let cache = tempfile::tempdir().unwrap();

    // Short name + -r: the registry flag completes it.
    let out = xfn_command()
        .args(["-r", &registry.host(), "pull", "--cache-dir"])
        .arg(cache.path())
        .arg("fn:v1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let line = stdout(&out);
    assert!(line.starts_with("pulled fn:v1 "), "{line}");
    assert!(line.contains(&pushed.digest), "{line}");
    assert!(line.contains("2 layers"), "{line}");

    // Again: served from the cache.
    let out = xfn_command()
        .args(["pull", "--image-pull-policy", "Never", "--cache-dir"])
        .arg(cache.path())
        .arg(&pushed.reference)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("cached "), "{}", stdout(&out));

    let out = xfn_command()
        .args(["cache", "ls", "--cache-dir"])
        .arg(cache.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let listing = stdout(&out);
    let row = listing
        .lines()
        .find(|l| l.starts_with(&pushed.reference))
        .unwrap_or_else(|| panic!("no row for {} in:\n{listing}", pushed.reference));
    assert!(row.contains(&pushed.digest), "{row}");
    assert!(row.contains("MB"), "{row}");

    // For scripts: the same listing as JSON.
    let out = xfn_command()
        .args(["cache", "ls", "--format", "json", "--cache-dir"])
        .arg(cache.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let image = rows
        .as_array()
        .and_then(|rows| {
            rows.iter()
                .find(|r| r["reference"] == pushed.reference.as_str())
        })
        .unwrap_or_else(|| panic!("no {} in {rows}", pushed.reference));
    assert_eq!(image["digest"], pushed.digest.as_str(), "{image}");
    for size in ["disk_bytes", "unique_disk_bytes", "compressed_bytes"] {
        assert!(
            image[size].as_u64().is_some_and(|size| size > 0),
            "{size}: {image}"
        );
    }
    assert_eq!(image["complete"], true, "{image}");
}

/// `xfn cache ARGS --cache-dir CACHE`, which must succeed: its stdout.
fn cache(cache: &std::path::Path, args: &[&str]) -> String {
    let out = xfn_command()
        .arg("cache")
        .args(args)
        .arg("--cache-dir")
        .arg(cache)
        .output()
        .unwrap();
    assert!(out.status.success(), "cache {args:?}: {}", stderr(&out));
    stdout(&out)
}

/// `xfn cache ls --format json`: each image's row by reference.
fn listed(dir: &std::path::Path) -> std::collections::HashMap<String, serde_json::Value> {
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(&cache(dir, &["ls", "--format", "json"])).unwrap();
    rows.into_iter()
        .map(|row| (row["reference"].as_str().unwrap().to_string(), row))
        .collect()
}

/// A column of `xfn cache ls`'s text row for `reference`, by header.
fn column(listing: &str, reference: &str, header: &str) -> String {
    // Sizes are `12.3 MB`: two words each, under a header of one.
    let headers: Vec<&str> = listing.lines().next().unwrap().split_whitespace().collect();
    let at = headers.iter().position(|h| *h == header).unwrap();
    let row = listing
        .lines()
        .find(|l| l.starts_with(&format!("{reference} ")))
        .unwrap_or_else(|| panic!("no row for {reference}:\n{listing}"));
    let words: Vec<&str> = row.split_whitespace().collect();
    let word = 2 + (at - 2) * 2;
    format!("{} {}", words[word], words[word + 1])
}

/// The `12.3 MB` after `what ` in `text`.
fn amount_after(text: &str, what: &str) -> String {
    let rest = &text[text
        .find(what)
        .unwrap_or_else(|| panic!("no {what:?} in {text}"))
        + what.len()..];
    rest.split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
        .trim_end_matches([';', ','])
        .to_string()
}

/// What `cache ls` says an image holds on disk is what `rm` and `gc` free:
/// the unpacked layers and kept blobs, not the compressed download. Two
/// images share busybox: each holds it, neither alone; removing one frees
/// its own layer only, and the other then holds everything it uses alone.
#[test]
fn cache_ls_says_the_disk_each_image_holds_as_rm_and_gc_count_it() {
    let registry = Registry::start();
    let with_payload = |name: &str, seed| {
        ImageBuilder::new()
            .layer(Layer::busybox())
            .layer(Layer::new().file("/payload", 0o644, pseudo_random_bytes(seed, 256 << 10)))
            .entrypoint(["/bin/cat"])
            .push(&registry, name)
            .reference
    };
    let (one, two) = (with_payload("one:v1", 1), with_payload("two:v1", 2));
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    for image in [&one, &two] {
        xfn_command()
            .args(["pull", "--cache-dir"])
            .arg(dir)
            .arg(image)
            .output()
            .map(|out| assert!(out.status.success(), "{}", stderr(&out)))
            .unwrap();
    }

    let rows = listed(dir);
    let bytes = |image: &str, size: &str| rows[image][size].as_u64().unwrap();
    for image in [&one, &two] {
        // Unpacked busybox alone is more than the whole compressed image.
        assert!(
            bytes(image, "disk_bytes") > bytes(image, "compressed_bytes"),
            "{:?}",
            rows[image.as_str()]
        );
        // The shared busybox layer is not its own; its payload (256 KiB,
        // unpacked and as a kept blob) is.
        assert!(bytes(image, "unique_disk_bytes") >= 2 * (256 << 10));
        assert!(bytes(image, "unique_disk_bytes") < bytes(image, "disk_bytes") / 2);
    }
    // Both hold the same shared part.
    let shared = |image: &str| bytes(image, "disk_bytes") - bytes(image, "unique_disk_bytes");
    assert_eq!(shared(&one), shared(&two));

    let listing = cache(dir, &["ls"]);
    let removed = cache(dir, &["rm", &one]);
    assert_eq!(
        amount_after(&removed, "freed "),
        column(&listing, &one, "UNIQUE"),
        "{listing}\n{removed}"
    );
    assert_eq!(
        amount_after(&removed, "the cache takes "),
        column(&listing, &two, "DISK"),
        "{listing}\n{removed}"
    );

    // Alone, the other holds everything it uses; gc of it frees that.
    let listing = cache(dir, &["ls"]);
    assert_eq!(
        column(&listing, &two, "UNIQUE"),
        column(&listing, &two, "DISK")
    );
    assert_eq!(
        amount_after(&listing, "take "),
        column(&listing, &two, "DISK"),
        "{listing}"
    );
    let collected = cache(dir, &["gc", "--max-size", "0"]);
    assert_eq!(
        amount_after(&collected, "freed "),
        column(&listing, &two, "DISK"),
        "{listing}\n{collected}"
    );
    assert!(collected.contains("the cache takes 0 B"), "{collected}");
}

#[test]
fn xfn_alone_prints_its_help_instead_of_starting_a_daemon() {
    let out = xfn_command().output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let help = stderr(&out);
    assert!(help.contains("Usage: xfn"), "{help}");
    assert!(help.contains("start"), "{help}");
}

#[test]
fn never_with_an_absent_image_fails_naming_it() {
    let cache = tempfile::tempdir().unwrap();
    let out = xfn_command()
        .args(["pull", "--image-pull-policy", "Never", "--cache-dir"])
        .arg(cache.path())
        .arg("127.0.0.1:9/absent:v9")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("127.0.0.1:9/absent:v9"), "{err}");
    assert!(err.contains("Never"), "{err}");
}

#[test]
fn an_invalid_reference_is_a_clear_error() {
    let cache = tempfile::tempdir().unwrap();
    let out = xfn_command()
        .args(["pull", "--cache-dir"])
        .arg(cache.path())
        .arg("Bad/UPPER:x")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("invalid image reference"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn docker_config_credentials_are_used() {
    let registry = Registry::start_with_auth("bob", "pw");
    let pushed = function_image().push(&registry, "private/fn:v1");
    let cache = tempfile::tempdir().unwrap();
    let docker = tempfile::tempdir().unwrap();
    let run = || {
        xfn_command()
            .env("DOCKER_CONFIG", docker.path())
            .args(["pull", "--cache-dir"])
            .arg(cache.path())
            .arg(&pushed.reference)
            .output()
            .unwrap()
    };
    // No config: an auth error.
    let out = run();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("credentials"), "{}", stderr(&out));
    std::fs::write(
        docker.path().join("config.json"),
        format!(
            r#"{{"auths":{{"{}":{{"auth":"{}"}}}}}}"#,
            registry.host(),
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, "bob:pw")
        ),
    )
    .unwrap();
    let out = run();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains(&pushed.digest));
}

#[test]
fn pull_works_as_an_unprivileged_user() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test sets up a cache dir owned by uid {NONROOT} and needs root to do so"
    );
    let registry = Registry::start();
    let pushed = function_image().push(&registry, "fn:v1");
    let base = world_traversable_tempdir();
    let cache = base.path().join("cache");
    dir_owned_by(&cache, NONROOT);
    let out = unprivileged(NONROOT, std::path::Path::new(env!("CARGO_BIN_EXE_xfn")))
        .args(["pull", "--cache-dir"])
        .arg(&cache)
        .arg(&pushed.reference)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains(&pushed.digest), "{}", stdout(&out));
    let out = unprivileged(NONROOT, std::path::Path::new(env!("CARGO_BIN_EXE_xfn")))
        .args(["cache", "ls", "--cache-dir"])
        .arg(&cache)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains(&pushed.digest));
    // Everything the store wrote belongs to the unprivileged user.
    use std::os::unix::fs::MetadataExt;
    for sub in ["refs", "manifests", "layers", "blobs/sha256"] {
        for entry in std::fs::read_dir(cache.join(sub)).unwrap() {
            let meta = entry.unwrap().metadata().unwrap();
            assert_eq!(meta.uid(), NONROOT, "{sub}");
        }
    }
}
