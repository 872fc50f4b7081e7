//! `xfn adapt` end to end: the real binary serving a busybox function image
//! (built here, pushed to a real `docker-registry` on 127.0.0.1) with real
//! crun, called over mTLS with certificates made here by the `openssl` CLI,
//! over plaintext, through v1 and v1beta1, and by the published Python SDK's
//! generated stubs.
//!
//! Needs: crun, docker-registry, busybox-static, openssl, skopeo; python3
//! with `crossplane-function-sdk-python` (and grpcio) for the SDK check.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use xfn::proto::v1::function_runner_service_client::FunctionRunnerServiceClient as V1Client;
use xfn::proto::v1beta1::function_runner_service_client::FunctionRunnerServiceClient as V1beta1Client;
use xfn::proto::{v1, v1beta1};
use xfn_testkit::*;

const FUNCTION: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/adapt/function.sh");
const SDK_CHECK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/adapt/sdk_check.py");

fn function_image(registry: &Registry) -> String {
    ImageBuilder::new()
        .layer(Layer::busybox())
        .layer(Layer::new().file("/fn.sh", 0o755, std::fs::read(FUNCTION).unwrap()))
        .entrypoint(["/bin/sh", "/fn.sh"])
        .push(registry, "adapt-fn:v1")
        .reference
}

/// Who `xfn adapt` runs as.
#[derive(Clone, Copy)]
enum As {
    Root,
    /// [`NONROOT`] without capabilities, its cache dir its own.
    Nonroot,
}

/// Where most tests here start: the function image in a fresh registry,
/// served by `xfn adapt --insecure --image IMAGE FLAGS…` as `user`, its
/// cache in a fresh dir. Bind all three: each lives as long as the test.
fn serve_insecure(user: As, flags: &[&str]) -> (Registry, tempfile::TempDir, Adapt) {
    let registry = Registry::start();
    let image = function_image(&registry);
    let dir = world_traversable_tempdir();
    let command = match user {
        As::Root => xfn_command(),
        As::Nonroot => {
            dir_owned_by(&dir.path().join("cache"), NONROOT);
            unprivileged(NONROOT, Path::new(env!("CARGO_BIN_EXE_xfn")))
        }
    };
    let mut source = vec!["--image", &image];
    source.extend_from_slice(flags);
    let adapt = Adapt::start_as(command, dir.path(), &source, &["--insecure"]);
    (registry, dir, adapt)
}

/// `xfn adapt`, stopped on drop (`xfn_testkit::TcpDaemon`).
struct Adapt(TcpDaemon);

impl std::ops::Deref for Adapt {
    type Target = TcpDaemon;
    fn deref(&self) -> &TcpDaemon {
        &self.0
    }
}

impl std::ops::DerefMut for Adapt {
    fn deref_mut(&mut self) -> &mut TcpDaemon {
        &mut self.0
    }
}

impl Adapt {
    fn start(dir: &Path, source: &[&str], security: &[&str]) -> Adapt {
        Self::start_as(xfn_command(), dir, source, security)
    }

    /// Starts `xfn` (as `command` runs it) with `dir/cache` as cache.
    fn start_as(mut command: Command, dir: &Path, source: &[&str], security: &[&str]) -> Adapt {
        command.arg("adapt").args(source).args(security);
        Adapt(TcpDaemon::start(
            command,
            "adapt",
            dir,
            Duration::from_secs(120),
        ))
    }

    fn sigterm(&self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    }

    /// Waits for xfn adapt to exit (off the async runtime's threads).
    async fn wait(mut self) -> (std::process::ExitStatus, String) {
        tokio::task::spawn_blocking(move || {
            let status = self.child.wait().unwrap();
            (status, self.log_text())
        })
        .await
        .unwrap()
    }

    /// The value of `xfn_runs_total{outcome="OUTCOME"}` (0 when absent).
    fn runs(&self, outcome: &str) -> u64 {
        self.metric(&format!("xfn_runs_total{{outcome=\"{outcome}\"}}"))
    }
}

fn request(mode: &str, tag: &str) -> v1::RunFunctionRequest {
    v1::RunFunctionRequest {
        meta: Some(v1::RequestMeta {
            tag: tag.into(),
            ..Default::default()
        }),
        input: Some(prost_types::Struct {
            fields: [(
                "mode".to_string(),
                prost_types::Value {
                    kind: Some(prost_types::value::Kind::StringValue(mode.into())),
                },
            )]
            .into(),
        }),
        ..Default::default()
    }
}

async fn tls_channel(port: u16, certs: &Path, client: Option<&str>) -> Result<Channel, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(
            std::fs::read(certs.join("ca.crt")).unwrap(),
        ))
        .domain_name("localhost");
    if let Some(name) = client {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(certs.join(format!("{name}.crt"))).unwrap(),
            std::fs::read(certs.join(format!("{name}.key"))).unwrap(),
        ));
    }
    Channel::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))
}

async fn plain_channel(port: u16) -> Channel {
    Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn mtls_calls_succeed_and_clients_without_a_valid_certificate_are_refused() {
    let registry = Registry::start();
    let image = function_image(&registry);
    let dir = world_traversable_tempdir();
    let server_certs = xfn_testkit::tls::mtls_certs(dir.path());
    let adapt = Adapt::start(
        dir.path(),
        &["--image", &image],
        &["--tls-certs-dir", server_certs.to_str().unwrap()],
    );

    // A client with a certificate the CA signed: the call succeeds, and the
    // tag the function left out is copied into the response.
    let channel = tls_channel(adapt.port, dir.path(), Some("client"))
        .await
        .unwrap();
    let response = V1Client::new(channel)
        .run_function(request("ok", "tag-1"))
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", adapt.log_text()))
        .into_inner();
    assert_eq!(response.results[0].message, "hello from the container");
    assert_eq!(response.meta.unwrap().tag, "tag-1");

    // No client certificate, or one from another CA: no call gets through.
    for client in [None, Some("stranger")] {
        let refused = match tls_channel(adapt.port, dir.path(), client).await {
            Err(connect_error) => connect_error,
            Ok(channel) => match V1Client::new(channel)
                .run_function(request("ok", "tag-2"))
                .await
            {
                Ok(response) => panic!("{client:?} was served: {response:?}"),
                Err(status) => format!("{status:?}"),
            },
        };
        assert!(!refused.is_empty(), "{client:?}");
    }
    // TLS 1.2 clients are served (Crossplane's minimum); TLS 1.1 is not.
    let handshake = |version: &str| {
        Command::new("openssl")
            .args(["s_client", "-connect", &format!("127.0.0.1:{}", adapt.port)])
            .args([version, "-cipher", "DEFAULT@SECLEVEL=0"])
            .args([
                "-cert",
                "client.crt",
                "-key",
                "client.key",
                "-CAfile",
                "ca.crt",
            ])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .output()
            .expect("run openssl s_client")
    };
    let tls12 = handshake("-tls1_2");
    let text = String::from_utf8_lossy(&tls12.stdout);
    assert!(
        text.contains("Protocol  : TLSv1.2") || text.contains("TLSv1.2, Cipher"),
        "{text}\n{}",
        String::from_utf8_lossy(&tls12.stderr)
    );
    let tls11 = handshake("-tls1_1");
    assert!(
        !String::from_utf8_lossy(&tls11.stdout).contains("TLSv1.1, Cipher"),
        "a TLS 1.1 handshake succeeded"
    );
    assert!(!tls11.status.success());

    // Only the one authorised call ran.
    assert_eq!(adapt.runs("ok"), 1, "{}", adapt.log_text());
}

#[tokio::test(flavor = "multi_thread")]
async fn adapt_refuses_to_start_without_tls_or_insecure() {
    let dir = world_traversable_tempdir();
    let out = xfn_command()
        .args(["adapt", "--image", "127.0.0.1:1/nothing:v1", "--cache-dir"])
        .arg(dir.path().join("cache"))
        .env_remove("TLS_SERVER_CERTS_DIR")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--tls-certs-dir"), "{stderr}");
    assert!(stderr.contains("--insecure"), "{stderr}");

    // A TLS directory it cannot use is refused, naming the file and why.
    let tls = dir.path().join("tls");
    std::fs::create_dir(&tls).unwrap();
    let refused = || {
        let out = xfn_command()
            .args(["adapt", "--image", "127.0.0.1:1/nothing:v1", "--cache-dir"])
            .arg(dir.path().join("cache"))
            .arg("--tls-certs-dir")
            .arg(&tls)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = refused();
    let crt = tls.join("tls.crt");
    assert!(
        stderr.contains(&format!(
            "cannot load the TLS certificates: cannot read the PEM certificate in {}: No such file",
            crt.display()
        )),
        "{stderr}"
    );
    std::fs::write(&crt, "not a certificate\n").unwrap();
    let stderr = refused();
    assert!(
        stderr.contains(&format!("{} holds no PEM certificate", crt.display())),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn insecure_v1_and_v1beta1_calls_errors_and_the_response_cache() {
    let (_registry, _dir, adapt) = serve_insecure(As::Root, &[]);
    let mut v1 = V1Client::new(plain_channel(adapt.port).await);

    let ok = v1
        .run_function(request("ok", ""))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.results[0].message, "hello from the container");

    // v1beta1: same function, beta messages.
    let mut beta = V1beta1Client::new(plain_channel(adapt.port).await);
    let beta_request = v1beta1::RunFunctionRequest {
        meta: Some(v1beta1::RequestMeta {
            tag: "beta-tag".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let beta_response = beta.run_function(beta_request).await.unwrap().into_inner();
    assert_eq!(beta_response.results[0].message, "hello from the container");
    assert_eq!(beta_response.meta.unwrap().tag, "beta-tag");

    // Output that is not a RunFunctionResponse: Internal, with the stderr.
    let garbage = v1.run_function(request("garbage", "")).await.unwrap_err();
    assert_eq!(garbage.code(), tonic::Code::Internal, "{garbage:?}");
    assert!(
        garbage.message().contains("not a RunFunctionResponse")
            && garbage
                .message()
                .contains("garbage-mode: wrote text instead"),
        "{}",
        garbage.message()
    );

    // A crashing function: its exit code and stderr, readable in an event.
    let crash = v1.run_function(request("crash", "")).await.unwrap_err();
    assert!(
        crash.message().contains("exit code 3")
            && crash
                .message()
                .contains("boom: cannot frobnicate the widget"),
        "{crash:?}"
    );

    // meta.ttl: the second identical call is answered from memory (the
    // nonce only one run can know comes back, and no second run is counted);
    // another tag runs the container again.
    let runs_before = adapt.runs("ok");
    let first = v1
        .run_function(request("ttl", "ttl-tag"))
        .await
        .unwrap()
        .into_inner();
    let second = v1
        .run_function(request("ttl", "ttl-tag"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.results[0].message, second.results[0].message);
    assert_eq!(second.meta.as_ref().unwrap().tag, "ttl-tag");
    assert_eq!(adapt.runs("ok"), runs_before + 1, "{}", adapt.log_text());
    assert_eq!(adapt.runs("cache_hit"), 1);
    let other = v1
        .run_function(request("ttl", "other-tag"))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(other.results[0].message, first.results[0].message);
    assert_eq!(adapt.runs("ok"), runs_before + 2);

    // The published Python SDK's generated v1 stubs, a client no one here wrote.
    let out = Command::new("python3")
        .arg(SDK_CHECK)
        .arg(format!("127.0.0.1:{}", adapt.port))
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("sdk-check-ok"));
}

#[tokio::test(flavor = "multi_thread")]
async fn no_response_cache_timeout_message_size_and_health() {
    let (_registry, _dir, adapt) = serve_insecure(
        As::Root,
        &[
            "--no-response-cache",
            "--timeout",
            "2s",
            "--max-recv-message-size",
            "65536",
        ],
    );

    // Health reports both services serving.
    let mut health =
        tonic_health::pb::health_client::HealthClient::new(plain_channel(adapt.port).await);
    for service in [
        "apiextensions.fn.proto.v1.FunctionRunnerService",
        "apiextensions.fn.proto.v1beta1.FunctionRunnerService",
    ] {
        let status = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(
            status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "{service}"
        );
    }

    let mut v1 = V1Client::new(plain_channel(adapt.port).await);
    // --timeout: the function is killed and the caller told so.
    let slow = v1.run_function(request("sleep", "")).await.unwrap_err();
    assert_eq!(slow.code(), tonic::Code::DeadlineExceeded, "{slow:?}");
    assert!(slow.message().contains("timed out"), "{slow:?}");

    // --max-recv-message-size: a request over it is refused before any run.
    let mut big = request("ok", "");
    big.meta.as_mut().unwrap().tag = "x".repeat(100_000);
    let refused = v1.run_function(big).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::OutOfRange, "{refused:?}");

    let mut v1 = V1Client::new(plain_channel(adapt.port).await);
    let first = v1
        .run_function(request("ttl", "t"))
        .await
        .unwrap()
        .into_inner();
    let second = v1
        .run_function(request("ttl", "t"))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(first.results[0].message, second.results[0].message);
    assert_eq!(adapt.runs("ok"), 2);
    assert_eq!(adapt.runs("cache_hit"), 0);
    assert_eq!(adapt.runs("deadline_exceeded"), 1);
}

/// `skopeo copy` of the pushed image to `destination` (a transport:path).
fn skopeo_copy(image: &str, destination: &str) {
    let out = Command::new("skopeo")
        .args(["copy", "--src-tls-verify=false"])
        .arg(format!("docker://{image}"))
        .arg(destination)
        .output()
        .expect("run skopeo");
    assert!(
        out.status.success(),
        "skopeo copy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn call_ok(adapt: &Adapt) {
    let mut v1 = V1Client::new(plain_channel(adapt.port).await);
    let response = v1
        .run_function(request("ok", "x"))
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", adapt.log_text()))
        .into_inner();
    assert_eq!(response.results[0].message, "hello from the container");
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_save_tarballs_and_oci_layouts_are_served() {
    let registry = Registry::start();
    let image = function_image(&registry);
    let dir = world_traversable_tempdir();

    // What `docker save` writes (skopeo's docker-archive transport), plain
    // and gzipped.
    let tarball = dir.path().join("fn.tar");
    skopeo_copy(&image, &format!("docker-archive:{}", tarball.display()));
    let gzipped = dir.path().join("fn.tar.gz");
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "gzip -c {} > {}",
            tarball.display(),
            gzipped.display()
        ))
        .status()
        .unwrap();
    assert!(status.success());
    for file in [&tarball, &gzipped] {
        let cache_dir = tempfile::Builder::new()
            .prefix("tarball-")
            .tempdir_in(dir.path())
            .unwrap();
        std::fs::set_permissions(
            cache_dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let adapt = Adapt::start(
            cache_dir.path(),
            &["--image-tarball", file.to_str().unwrap()],
            &["--insecure"],
        );
        call_ok(&adapt).await;
    }

    // A tarball whose layers are not the ones its config names (listed in
    // the wrong order) is refused at start, naming the mismatch.
    let tampered = dir.path().join("tampered.tar");
    reorder_layers(&tarball, &tampered);
    let out = xfn_command()
        .args(["adapt", "--insecure", "--image-tarball"])
        .arg(&tampered)
        .arg("--cache-dir")
        .arg(dir.path().join("tampered-cache"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("diff id"), "{stderr}");

    // An OCI image layout directory.
    let layout = dir.path().join("layout");
    skopeo_copy(&image, &format!("oci:{}:v1", layout.display()));
    let adapt = Adapt::start(
        dir.path(),
        &["--image-layout", layout.to_str().unwrap()],
        &["--insecure"],
    );
    call_ok(&adapt).await;
}

/// Copies a `docker save` tarball with its manifest.json's layer list reversed.
fn reorder_layers(from: &Path, to: &Path) {
    let mut input = tar::Archive::new(std::fs::File::open(from).unwrap());
    let mut output = tar::Builder::new(std::fs::File::create(to).unwrap());
    for entry in input.entries().unwrap() {
        let mut entry = entry.unwrap();
        let mut header = entry.header().clone();
        let path = entry.path().unwrap().into_owned();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
        if path == Path::new("manifest.json") {
            let mut manifest: serde_json::Value = serde_json::from_slice(&data).unwrap();
            let layers = manifest[0]["Layers"].as_array_mut().unwrap();
            assert!(layers.len() > 1, "{manifest}");
            layers.reverse();
            data = serde_json::to_vec(&manifest).unwrap();
            header.set_size(data.len() as u64);
            header.set_cksum();
        }
        output
            .append_data(&mut header, &path, data.as_slice())
            .unwrap();
    }
    output.finish().unwrap();
}

/// Polls until `condition` holds; fails after a minute (a hang, not a
/// performance threshold).
fn wait_for(what: &str, adapt: &Adapt, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "never: {what}\n{}",
            adapt.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// With one run slot: starts a call of `mode` tagged `tags[0]`, waits until
/// it runs, then a second tagged `tags[1]`, and waits until that one queues
/// behind it. Returns both calls, running first.
async fn one_running_one_queued(
    adapt: &Adapt,
    channel: &Channel,
    mode: &'static str,
    tags: [&'static str; 2],
) -> [tokio::task::JoinHandle<Result<tonic::Response<v1::RunFunctionResponse>, tonic::Status>>; 2] {
    let call = |tag: &'static str| {
        let mut client = V1Client::new(channel.clone());
        tokio::spawn(async move { client.run_function(request(mode, tag)).await })
    };
    let running = call(tags[0]);
    wait_for("one run in flight", adapt, || {
        adapt.metric("xfn_runs_in_flight") == 1
    });
    let queued = call(tags[1]);
    wait_for("the second call queued", adapt, || {
        adapt.metric("xfn_runs_queued") == 1
    });
    [running, queued]
}

#[tokio::test(flavor = "multi_thread")]
async fn max_concurrent_runs_makes_later_calls_wait() {
    let (_registry, _dir, adapt) =
        serve_insecure(As::Root, &["--max-concurrent-runs", "1", "--timeout", "3s"]);
    let channel = plain_channel(adapt.port).await;
    let [first, second] =
        one_running_one_queued(&adapt, &channel, "sleep", ["first", "second"]).await;
    // Still one run: the second waits for the first's slot.
    assert_eq!(adapt.metric("xfn_runs_in_flight"), 1);
    for call in [first, second] {
        let status = call.await.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    }
    assert_eq!(adapt.metric("xfn_runs_queued"), 0);
    assert_eq!(adapt.metric("xfn_runs_in_flight"), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unprivileged_user_without_capabilities_serves_calls() {
    let (_registry, _dir, adapt) = serve_insecure(As::Nonroot, &[]);
    call_ok(&adapt).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn thirty_two_concurrent_callers_with_default_flags_are_all_served() {
    let (_registry, _dir, adapt) = serve_insecure(As::Root, &[]);
    // A connection per caller, as many reconcilers would dial; far more
    // callers than the CPUs the adaptor runs at once by default.
    let mut calls = Vec::new();
    for i in 0..32 {
        let mut client = V1Client::new(plain_channel(adapt.port).await);
        let tag = format!("caller-{i}");
        let mut req = tonic::Request::new(request("ok", &tag));
        req.set_timeout(Duration::from_secs(120));
        calls.push(tokio::spawn(async move {
            (tag, client.run_function(req).await)
        }));
    }
    for call in calls {
        let (tag, result) = call.await.unwrap();
        let response = result
            .unwrap_or_else(|s| panic!("{tag}: {s:?}\n{}", adapt.log_text()))
            .into_inner();
        assert_eq!(response.results[0].message, "hello from the container");
        assert_eq!(response.meta.unwrap().tag, tag);
    }
    assert_eq!(adapt.runs("ok"), 32, "{}", adapt.log_text());
    assert_eq!(adapt.metric("xfn_runs_queued"), 0);
    // Under load the pool serves: callers beyond the first runs found
    // containers started ahead of them, and every call was counted.
    let (cold, warm) = pool_calls(&adapt);
    assert_eq!(cold + warm, 32, "{}", adapt.log_text());
    assert!(
        warm > 0,
        "no call found a warm container\n{}",
        adapt.log_text()
    );
}

/// The adaptor's calls as its warm pool counted them: (cold, warm).
fn pool_calls(adapt: &Adapt) -> (u64, u64) {
    let calls = |path| format!("xfn_warm_pool_calls_total{{path=\"{path}\"}}");
    (adapt.metric(&calls("cold")), adapt.metric(&calls("warm")))
}

#[tokio::test(flavor = "multi_thread")]
async fn by_default_the_adaptor_keeps_a_container_started_ahead_for_the_next_call() {
    let (_registry, _dir, adapt) = serve_insecure(As::Root, &[]);
    call_ok(&adapt).await;
    wait_for("a warm container ready", &adapt, || {
        adapt.metric("xfn_warm_containers_ready") == 1
    });
    call_ok(&adapt).await;
    assert_eq!(pool_calls(&adapt), (1, 1), "{}", adapt.log_text());
    // Same flags and defaults as `xfn start`: two per CPU.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    assert_eq!(adapt.metric("xfn_warm_pool_size"), 2 * cpus);
    // SIGTERM removes the container waiting for the next call.
    wait_for("the next warm container ready", &adapt, || {
        adapt.metric("xfn_warm_containers_ready") == 1
    });
    adapt.sigterm();
    let (status, log) = adapt.wait().await;
    assert!(status.success(), "{status}\n{log}");
    assert!(log.contains("removing warm containers"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn callers_beyond_the_runs_queue_up_to_the_cap_and_sigterm_drains_them() {
    let (_registry, _dir, adapt) = serve_insecure(
        As::Root,
        &["--max-concurrent-runs", "1", "--max-queued-runs", "1"],
    );
    let channel = plain_channel(adapt.port).await;
    let [running, queued] =
        one_running_one_queued(&adapt, &channel, "slow", ["running", "queued"]).await;
    // The queue is bounded: past its cap, the caller is told at once.
    let refused = V1Client::new(channel.clone())
        .run_function(request("slow", "refused"))
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("--max-queued-runs"),
        "{refused:?}"
    );

    // SIGTERM: no new calls, but the run in flight and the queued call both
    // finish within the grace period, and the adaptor exits 0.
    adapt.sigterm();
    for (call, tag) in [(running, "running"), (queued, "queued")] {
        let response = call
            .await
            .unwrap()
            .unwrap_or_else(|s| panic!("{tag}: {s:?}\n{}", adapt.log_text()))
            .into_inner();
        assert_eq!(response.meta.unwrap().tag, tag);
    }
    let (status, log) = adapt.wait().await;
    assert!(status.success(), "{status}\n{log}");
    assert!(log.contains("every run finished"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sigkilled_adaptor_takes_its_run_in_flight_with_it() {
    use xfn_testkit::child::{descendants, still_running_after_grace};
    let (_registry, _dir, mut adapt) = serve_insecure(As::Nonroot, &[]);
    let mut client = V1Client::new(plain_channel(adapt.port).await);
    let call = tokio::spawn(async move { client.run_function(request("sleep", "killed")).await });
    // Everything below the adaptor once the function itself runs: its
    // supervisor's init and xfn (`xfn::pidns`), crun run, the function.
    let pid = adapt.child.id();
    let mut tree = Vec::new();
    wait_for("the function running", &adapt, || {
        tree = descendants(pid);
        tree.iter().any(|(_, cmdline)| cmdline == "sleep 60")
    });
    // SIGKILL to the adaptor alone: xfn gets no chance to kill its run.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    adapt.child.wait().unwrap();
    let left = still_running_after_grace(&tree);
    assert_eq!(left, Vec::new(), "left running after SIGKILL to xfn adapt");
    assert!(call.await.unwrap().is_err(), "the call in flight fails");
}

/// A request whose `input` nests `depth` list values, padded with a string
/// field to about `size` bytes.
fn deep_request(depth: usize, size: usize) -> v1::RunFunctionRequest {
    use prost_types::value::Kind;
    let mut value = prost_types::Value {
        kind: Some(Kind::NullValue(0)),
    };
    for _ in 0..depth {
        value = prost_types::Value {
            kind: Some(Kind::ListValue(prost_types::ListValue {
                values: vec![value],
            })),
        };
    }
    let mut req = request("ok", "deep");
    let padding = prost_types::Value {
        kind: Some(Kind::StringValue("x".repeat(size))),
    };
    req.input = Some(prost_types::Struct {
        fields: [
            ("deep".to_string(), value),
            ("padding".to_string(), padding),
        ]
        .into(),
    });
    req
}

#[tokio::test(flavor = "multi_thread")]
async fn deep_requests_and_deep_output_are_refused_while_other_calls_are_served() {
    let (_registry, _dir, adapt) = serve_insecure(As::Nonroot, &[]);
    call_ok(&adapt).await;
    // Protobuf nests no deeper than prost decodes (100 messages), refused
    // while the request is decoded: tonic's INTERNAL, gRPC's code for a
    // message that does not decode. Padded to just under the 4 MiB cap.
    let mut calls = Vec::new();
    for _ in 0..4 {
        let mut v1 = V1Client::new(plain_channel(adapt.port).await);
        calls.push(tokio::spawn(async move {
            let started = Instant::now();
            let answer = v1
                .run_function(deep_request(500, (4 << 20) - 200_000))
                .await;
            (answer, started.elapsed())
        }));
    }
    for _ in 0..4 {
        call_ok(&adapt).await;
    }
    for call in calls {
        let (answer, took) = call.await.unwrap();
        let status = answer.expect_err("a deep request is refused");
        assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");
        assert!(status.message().contains("recursion limit"), "{status:?}");
        eprintln!("deep request refused after {took:?}");
    }
    // A function's output nests no deeper than the inputs' bound.
    let mut v1 = V1Client::new(plain_channel(adapt.port).await);
    let status = v1.run_function(request("deep", "d")).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");
    assert!(
        status.message().contains("nested more than 64 levels deep"),
        "{status:?}"
    );
    call_ok(&adapt).await;
}

/// h2spec's cases xfn's HTTP/2 server does not pass, by title, each with
/// why: what h2spec expects there is an HTTP server's answer, not gRPC's.
const H2SPEC_KNOWN: &[(&str, &str)] = &[
    (
        "Sends a WINDOW_UPDATE frame on half-closed (remote) stream",
        "h2spec waits for a DATA frame; a gRPC call it makes (no message) is \
         answered with an error status alone (HEADERS, END_STREAM: trailers-only)",
    ),
    (
        "Sends a PRIORITY frame on half-closed (remote) stream",
        "as above: an error status is answered without DATA",
    ),
    (
        "Sends HEADERS frames that causes their advertised concurrent stream limit to be exceeded",
        "each of its streams is answered (and so closed) as it arrives, so the \
         limit is never reached; the limit itself is checked by \
         grpc::http2's streams_past_the_announced_maximum_are_refused",
    ),
];

#[tokio::test(flavor = "multi_thread")]
async fn every_h2spec_conformance_case_passes_against_the_adaptors_http2_server_but_the_known() {
    // The peer: h2spec (scripts/peers.sh), strict, over plaintext HTTP/2
    // with prior knowledge as Crossplane calls an `--insecure` Function,
    // on the method's path (whose answer waits for the request's end, as
    // an HTTP server's does).
    let h2spec = xfn_testkit::peers::binary("h2spec");
    let (_registry, _dir, adapt) = serve_insecure(As::Root, &[]);
    let port = adapt.port.to_string();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(h2spec)
            .args(["-S", "-h", "127.0.0.1", "-p", &port, "-o", "5"])
            .args([
                "-P",
                "/apiextensions.fn.proto.v1.FunctionRunnerService/RunFunction",
            ])
            .output()
    })
    .await
    .expect("h2spec's thread")
    .expect("h2spec runs");
    let report = String::from_utf8_lossy(&output.stdout);
    eprintln!("{report}");
    let summary = report
        .lines()
        .find(|l| l.contains(" tests, ") && l.contains(" failed"))
        .unwrap_or_else(|| panic!("no h2spec summary in its report: {report}"));
    let count = |what: &str| -> usize {
        summary
            .split(", ")
            .find_map(|part| part.trim().strip_suffix(what))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no `{what}` in {summary:?}"))
    };
    let (tests, failed) = (count(" tests"), count(" failed"));
    assert!(tests > 140, "h2spec ran only {tests} cases: {summary}");
    // Its failures, listed again after "Failures:", each "× N: title".
    let failures: Vec<&str> = report
        .split("Failures:")
        .nth(1)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.trim_start().starts_with('×'))
        .collect();
    let unknown: Vec<&&str> = failures
        .iter()
        .filter(|f| !H2SPEC_KNOWN.iter().any(|(title, _)| f.ends_with(title)))
        .collect();
    assert!(
        unknown.is_empty() && failed == failures.len(),
        "h2spec: {summary}; failing: {unknown:#?}"
    );
}
