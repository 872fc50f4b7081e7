//! The gRPC clients against in-test servers: a function serving only
//! v1beta1 (the fallback), and a runner daemon on an abstract socket.
use std::sync::Mutex;

use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::{Request, Response, Status};

use super::*;
use crate::compose::run::alpha::{AlphaStep, ContainerConfig};
use crate::proto::{v1, v1alpha1, v1beta1};

/// Defaults as `xfn render`'s, with no keeper.
fn defaults() -> ContainerDefaults {
    ContainerDefaults {
        default_registry: "index.docker.io".into(),
        timeout: Duration::from_secs(60),
        pull_policy: crate::image::PullPolicy::IfNotPresent,
        keeper: None,
        development_wait: Duration::from_secs(5),
    }
}

/// A Function of `runtime` and `package`.
fn function(runtime: RuntimeKind, package: &str) -> Function {
    Function {
        name: "fn-a".into(),
        package: package.into(),
        runtime,
        pull_policy: None,
        image_override: None,
        env: Vec::new(),
        host_network: false,
        keep: None,
    }
}

/// The Development runtime of a Function served at `target`.
fn development(target: &str, wait: Duration) -> Development {
    let kind = RuntimeKind::Development {
        target: target.into(),
    };
    Development::new(&function(kind, "fn:v1"), target, wait)
}

/// Serves only the v1beta1 function service; echoes the request's tag.
struct BetaOnly;

#[tonic::async_trait]
impl v1beta1::function_runner_service_server::FunctionRunnerService for BetaOnly {
    async fn run_function(
        &self,
        request: Request<v1beta1::RunFunctionRequest>,
    ) -> Result<Response<v1beta1::RunFunctionResponse>, Status> {
        let tag = request.into_inner().meta.unwrap_or_default().tag;
        Ok(Response::new(v1beta1::RunFunctionResponse {
            meta: Some(v1beta1::ResponseMeta { tag, ttl: None }),
            results: vec![v1beta1::Result {
                severity: v1beta1::Severity::Normal as i32,
                message: "served by v1beta1".into(),
                ..Default::default()
            }],
            ..Default::default()
        }))
    }
}

#[tokio::test]
async fn development_falls_back_to_v1beta1_on_unimplemented() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(
                v1beta1::function_runner_service_server::FunctionRunnerServiceServer::new(BetaOnly),
            )
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let runtime = development(&address.to_string(), Duration::ZERO);
    let request = v1::RunFunctionRequest {
        meta: Some(v1::RequestMeta {
            tag: "abc".into(),
            capabilities: vec![],
        }),
        ..Default::default()
    };
    let response = answer(&runtime, &request).await.unwrap();
    assert_eq!(response.meta.unwrap().tag, "abc");
    assert_eq!(response.results[0].message, "served by v1beta1");
}

#[tokio::test]
async fn development_waits_for_a_server_that_starts_listening_after_the_render() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let listener = tokio::net::TcpListener::bind(address).await.unwrap();
        tonic::transport::Server::builder()
            .add_service(
                v1beta1::function_runner_service_server::FunctionRunnerServiceServer::new(BetaOnly),
            )
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
    });
    let runtime = development(&address.to_string(), defaults().development_wait);
    let response = answer(&runtime, &v1::RunFunctionRequest::default())
        .await
        .unwrap();
    assert_eq!(response.results[0].message, "served by v1beta1");
}

#[tokio::test]
async fn development_names_the_target_it_cannot_reach() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    drop(listener);
    let runtime = development(&address, Duration::from_millis(200));
    let err = answer(&runtime, &v1::RunFunctionRequest::default())
        .await
        .unwrap_err();
    let text = crate::chain::one_line(&err);
    assert!(
        text.contains(&address)
            && text.contains("cannot connect after waiting 0.")
            && text.contains("check that the function is running at that address"),
        "{text}"
    );
}

/// A runner daemon that records requests and returns a fixed output.
#[derive(Default)]
struct Daemon {
    seen: Arc<Mutex<Vec<v1alpha1::RunFunctionRequest>>>,
}

#[tonic::async_trait]
impl v1alpha1::containerized_function_runner_service_server::ContainerizedFunctionRunnerService
    for Daemon
{
    async fn run_function(
        &self,
        request: Request<v1alpha1::RunFunctionRequest>,
    ) -> Result<Response<v1alpha1::RunFunctionResponse>, Status> {
        self.seen.lock().unwrap().push(request.into_inner());
        Ok(Response::new(v1alpha1::RunFunctionResponse {
            output: b"results: [{severity: Normal, message: from the daemon}]".to_vec(),
        }))
    }
}

fn config(endpoint: &str) -> ContainerConfig {
    ContainerConfig {
        image: "example.org/fn:v1".into(),
        pull_policy: "Always".into(),
        timeout: Duration::from_secs(7),
        network: "Runner".into(),
        cpu: "250m".into(),
        memory: "64Mi".into(),
        endpoint: endpoint.into(),
    }
}

#[tokio::test]
async fn alpha_steps_go_to_the_daemon_on_an_abstract_socket_when_it_answers() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("xfn-test/compose-{}.sock", std::process::id());
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = std::os::unix::net::UnixListener::bind_addr(&address).unwrap();
    listener.set_nonblocking(true).unwrap();
    let listener = tokio::net::UnixListener::from_std(listener).unwrap();
    let daemon = Daemon::default();
    let seen = Arc::clone(&daemon.seen);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(
                v1alpha1::containerized_function_runner_service_server::ContainerizedFunctionRunnerServiceServer::new(daemon),
            )
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    let steps = ContainerSteps {
        runner: None,
        defaults: defaults(),
    };
    let output = steps
        .run(b"observed: {}", &config(&format!("unix-abstract:{name}")))
        .await
        .unwrap();
    assert_eq!(
        output,
        b"results: [{severity: Normal, message: from the daemon}]"
    );
    let seen = seen.lock().unwrap();
    let request = &seen[0];
    assert_eq!(request.image, "example.org/fn:v1");
    assert_eq!(request.input, b"observed: {}");
    assert_eq!(
        request.image_pull_config.as_ref().unwrap().pull_policy,
        v1alpha1::ImagePullPolicy::Always as i32
    );
    let run = request.run_function_config.as_ref().unwrap();
    assert_eq!(run.timeout.unwrap().seconds, 7);
    assert_eq!(
        run.network.unwrap().policy,
        v1alpha1::NetworkPolicy::Runner as i32
    );
    let limits = run.resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert_eq!(
        (limits.cpu.as_str(), limits.memory.as_str()),
        ("250m", "64Mi")
    );
}

#[tokio::test]
async fn without_a_daemon_or_a_runner_an_alpha_step_says_so() {
    let steps = ContainerSteps {
        runner: None,
        defaults: defaults(),
    };
    let name = format!("xfn-test/nobody-{}.sock", std::process::id());
    let err = steps
        .run(b"{}", &config(&format!("unix-abstract:{name}")))
        .await
        .unwrap_err();
    let text = crate::chain::one_line(&err);
    assert!(text.contains("no runner daemon answers"), "{text}");
}

#[test]
fn container_functions_name_what_is_wrong_with_them() {
    let defaults = defaults();
    let function = |runtime: RuntimeKind, package: &str, pull_policy: Option<&str>| Function {
        pull_policy: pull_policy.map(str::to_string),
        ..function(runtime, package)
    };
    for runtime in [RuntimeKind::Docker, RuntimeKind::Exec] {
        let no_runner = runtime_for(&function(runtime.clone(), "img", None), None, &defaults);
        let err = no_runner.err().unwrap().to_string();
        assert!(
            err.starts_with("Function \"fn-a\": ") && err.contains("runner"),
            "{err}"
        );
    }
    let no_package = runtime_for(&function(RuntimeKind::Docker, "", None), None, &defaults);
    let err = no_package.err().unwrap().to_string();
    assert_eq!(err, "Function \"fn-a\": it has no spec.package");
    let bad_policy = function(RuntimeKind::Exec, "img", Some("Sometimes"));
    let err = crate::chain::one_line(&runtime_for(&bad_policy, None, &defaults).err().unwrap());
    assert!(
        err.starts_with("Function \"fn-a\": ") && err.contains("unknown pull policy \"Sometimes\""),
        "{err}"
    );
    // The image a Docker Function runs is the annotation's when it is set.
    let mut overridden = function(RuntimeKind::Docker, "xpkg.example.org/fn:v1", None);
    assert_eq!(overridden.image(), "xpkg.example.org/fn:v1");
    overridden.image_override = Some("127.0.0.1:5000/fn:dev".into());
    assert_eq!(overridden.image(), "127.0.0.1:5000/fn:dev");
}
