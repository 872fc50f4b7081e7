//! Hostile registries (`xfn_testkit::registry::hostile`): a manifest far past
//! its bound, blobs longer or shorter than their descriptors, and a
//! registry that drip-feeds a pull past `--pull-timeout`. Each is refused
//! with an error naming the cause, at small memory, leaving nothing in the
//! cache; and while one pull of a reference drips, a call for the cached
//! image of the same reference through `xfn start` (real crun) is served.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::Code;
use xfn_testkit::child::{measure, Measured};
use xfn_testkit::pb;
use xfn_testkit::registry::hostile::{Fault, HostileRegistry, Target};
use xfn_testkit::*;

/// Peak memory a refused pull may reach: xfn's own footprint with room to
/// spare, a fraction of the hostile manifest it is offered.
const PEAK_MAX: u64 = 96 << 20;
const MIB: u64 = 1 << 20;
/// How long a wait for a state may take before the test gives up on xfn
/// (a bound on a hang, not a measurement).
const PATIENCE: Duration = Duration::from_secs(60);

/// An image of two small layers (a pull of it costs a debug build little).
fn small_image() -> ImageBuilder {
    ImageBuilder::new()
        .layer(Layer::new().file("/etc/motd", 0o644, "hello\n"))
        .layer(Layer::new().file("/fn.sh", 0o755, "#!/bin/sh\ncat\n"))
        .entrypoint(["/fn.sh"])
}

/// A function image: busybox and a script that echoes its input.
fn echo_image() -> ImageBuilder {
    ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(Layer::new().file("/fn.sh", 0o755, "#!/bin/sh\ncat\n"))
        .entrypoint(["/fn.sh"])
}

/// A cache dir uid 65532 owns, in a temp dir removed with the guard.
fn cache_dir() -> (tempfile::TempDir, PathBuf) {
    let base = world_traversable_tempdir();
    let cache = base.path().join("cache");
    dir_owned_by(&cache, NONROOT);
    (base, cache)
}

/// `xfn pull IMAGE` as uid 65532 on `cache`, plus `extra` flags, measured.
fn pull(cache: &Path, image: &str, extra: &[&str]) -> Measured {
    let xfn = Path::new(env!("CARGO_BIN_EXE_xfn"));
    measure(
        unprivileged(NONROOT, xfn)
            .args(["pull", "--cache-dir"])
            .arg(cache)
            .args(extra)
            .arg(image),
        xfn,
    )
}

/// Asserts the pull failed naming `cause` in a short error, at small memory.
fn refused(case: &str, m: &Measured, cause: &str) {
    m.assert_refused(case, cause, PEAK_MAX);
    println!("| {case} | refused: {} | {} |", m.stderr.trim(), m.cost());
}

/// What a refused pull must not leave in the cache: any manifest, ref or
/// temp entry (an image half there would be trusted later), and anything
/// stored under the refused blob's digest. Whole, verified layers of the
/// same image may stay: they are content-addressed and correct.
fn leftovers(cache: &Path, refused: Option<&str>) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut look = |dir: &str, only: Option<&str>| {
        if let Ok(entries) = std::fs::read_dir(cache.join(dir)) {
            found.extend(
                entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| only.is_none_or(|hex| p.ends_with(hex))),
            );
        }
    };
    for dir in ["manifests", "refs", "tmp"] {
        look(dir, None);
    }
    if let Some(digest) = refused {
        let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
        for dir in ["layers", "blobs/sha256", "configs"] {
            look(dir, Some(hex));
        }
    }
    found
}

#[test]
fn a_manifest_past_4_mib_is_cut_off_while_it_streams() {
    for announced in [false, true] {
        let registry = HostileRegistry::start();
        let image = registry.serve(&small_image(), "fn:v1");
        registry.fault(
            Target::Manifests,
            Fault::HugeManifest {
                len: 256 * MIB,
                announced,
            },
        );
        let (_base, cache) = cache_dir();
        let m = pull(&cache, &image.reference, &[]);
        let case = if announced {
            "manifest of 256 MiB, Content-Length says so"
        } else {
            "manifest of 256 MiB, chunked (no length up front)"
        };
        refused(case, &m, "is larger than 4194304 bytes; refused");
        // xfn hung up: what left the server is the 4 MiB it read plus
        // what the two sockets' buffers hold, not the 256 MiB offered.
        assert!(
            registry.fault_bytes() < 64 * MIB,
            "{case}: {} MiB were sent",
            registry.fault_bytes() >> 20
        );
        assert_eq!(leftovers(&cache, None), Vec::<PathBuf>::new(), "{case}");
    }
}

/// Pulls with `fault` on each blob of the image in turn (the config, then
/// each layer), checks the refusal, then pulls again honestly: a refused
/// blob leaves nothing behind that a later pull would trust.
fn each_blob_refused(fault: Fault, describe: &str, cause: impl Fn(u64) -> String) {
    let registry = HostileRegistry::start();
    let image = registry.serve(&small_image(), "fn:v1");
    let mut blobs = vec![(
        "config",
        image.image.config_digest.clone(),
        image.image.config.len(),
    )];
    for layer in &image.image.layers {
        blobs.push(("layer", layer.digest.clone(), layer.data.len()));
    }
    for (what, digest, size) in blobs {
        registry.heal();
        registry.fault(Target::Blob(digest.clone()), fault.clone());
        let (_base, cache) = cache_dir();
        let m = pull(&cache, &image.reference, &[]);
        let case = format!("{what} blob of {size} bytes {describe}");
        refused(&case, &m, &cause(size as u64));
        assert!(m.stderr.contains(&digest), "{case}: {}", m.stderr);
        assert_eq!(
            leftovers(&cache, Some(&digest)),
            Vec::<PathBuf>::new(),
            "{case}"
        );
        registry.heal();
        let again = pull(&cache, &image.reference, &[]);
        assert!(
            again.status.success(),
            "{case}, then honest: {}",
            again.stderr
        );
    }
}

#[test]
fn a_blob_longer_than_its_descriptor_is_refused_and_leaves_nothing() {
    each_blob_refused(
        Fault::LongerBlob { extra: 1 << 20 },
        "with 1 MiB more than its descriptor says",
        |size| format!("the registry sent more than {size} bytes, its descriptor says {size}"),
    );
}

#[test]
fn a_blob_shorter_than_its_descriptor_is_refused_and_leaves_nothing() {
    each_blob_refused(
        Fault::ShorterBlob { missing: 10 },
        "with its last 10 bytes missing",
        |size| {
            format!(
                "the registry sent {} bytes, its descriptor says {size}",
                size - 10
            )
        },
    );
}

#[test]
fn a_drip_fed_pull_stops_at_the_pull_timeout() {
    let registry = HostileRegistry::start();
    let image = registry.serve(&small_image(), "fn:v1");
    let layer = image.image.layers[0].digest.clone();
    registry.fault(
        Target::Blob(layer.clone()),
        Fault::Drip {
            every: Duration::from_secs(1),
        },
    );
    let (_base, cache) = cache_dir();
    let m = pull(&cache, &image.reference, &["--pull-timeout", "5s"]);
    refused(
        "a layer dripped one byte per second (--pull-timeout 5s)",
        &m,
        "took longer than 5s (the --pull-timeout bound)",
    );
    assert_eq!(registry.drips_started(), 1);
    // The timed-out pull let go of the connection: the drip ends because
    // nobody listens, not because it was all sent.
    registry.wait_until("the drip's client hung up", PATIENCE, |r| {
        r.drips_abandoned() == 1
    });
    assert_eq!(leftovers(&cache, Some(&layer)), Vec::<PathBuf>::new());
}

fn with_policy(image: &str, policy: pb::ImagePullPolicy) -> pb::RunFunctionRequest {
    let mut req = request(image, FUNCTION_IO);
    req.image_pull_config = Some(pb::ImagePullConfig {
        pull_policy: policy as i32,
        auth: None,
    });
    req
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cached_call_is_served_while_a_pull_of_the_same_reference_drips() {
    let registry = HostileRegistry::start();
    let image = registry.serve(&echo_image(), "fn:v1");
    // Cached honestly first (by `xfn pull`, under its default deadline:
    // a debug build on a busy machine may take seconds to unpack).
    let (_base, cache) = cache_dir();
    let cached = pull(&cache, &image.reference, &[]);
    assert!(cached.status.success(), "{}", cached.stderr);
    // The deadline outlasts a cached run on a busy machine by far, so the
    // order checked below (cached call done, pull still dripping) is the
    // daemon's doing, not the scheduler's.
    let daemon = Daemon::start_with_cache(Some(&cache), &["--pull-timeout", "20s"]).await;
    let mut client = daemon.client().await;

    // Now every manifest drips: a call with Always resolves the tag again
    // and holds the reference's pull lock while it drips.
    registry.fault(
        Target::Manifests,
        Fault::Drip {
            every: Duration::from_millis(200),
        },
    );
    let mut always = daemon.client().await;
    let slow = {
        let req = with_policy(&image.reference, pb::ImagePullPolicy::Always);
        tokio::spawn(async move { always.run_function(req).await })
    };
    let r = &registry;
    tokio::task::block_in_place(|| {
        r.wait_until("the Always call's manifest drips", PATIENCE, |r| {
            r.drips_open() == 1
        })
    });

    // A call that only needs the cached image is answered meanwhile.
    let cached = client
        .run_function(with_policy(
            &image.reference,
            pb::ImagePullPolicy::IfNotPresent,
        ))
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", daemon.log()));
    assert_eq!(cached.into_inner().output, FUNCTION_IO.as_bytes());
    assert!(
        !slow.is_finished() && registry.drips_open() == 1,
        "the cached call must not wait for the dripping pull"
    );

    // The dripping pull ends at --pull-timeout, as DeadlineExceeded, and
    // lets go of the connection.
    let status = slow.await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().contains("--pull-timeout"), "{status:?}");
    tokio::task::block_in_place(|| {
        r.wait_until("the drip's client hung up", PATIENCE, |r| {
            r.drips_abandoned() == 1
        })
    });
    assert_eq!(registry.drips_started(), 1);
}
