//! Load generator for `benches/server.sh`: calls a running `xfn start` over
//! its abstract socket, measures warm RunFunction latency (p50/p99) and
//! throughput at several caller counts, and prints one `key=value` a line.
//!
//! Usage: server_load SOCKET_NAME IMAGE INPUT_FILE [LATENCY_CALLS] [CALLS_PER_LEVEL] [LEVELS]
//! (`cargo bench` adds a `--bench` argument, which is ignored.)
//!
//! Each call's output must be its input (an echo function), or the bytes
//! of the file `EXPECT` (env) names. With SOCKET_NAME `tcp:HOST:PORT` it
//! calls an `xfn adapt` instead: v1 `RunFunction` over plaintext TCP, IMAGE
//! and INPUT_FILE unused, each response checked to carry the request's tag
//! and a desired resource named `EXPECT_RESOURCE` (env, default `bucket`).
//! With `HEALTH` (env) set it calls `grpc.health.v1.Health/Check` instead,
//! either way: a bare gRPC round trip to the same daemon, to set a call
//! beside.
//!
//! Latency is measured three ways, one caller each:
//! - `paced`: LATENCY_CALLS calls, each PACE_MS (env, default 50) after the
//!   last one's answer: a warm call on an otherwise quiet daemon, as a
//!   sidecar sees a reconciler's steps (and as `hyperfine` runs the bare
//!   floor, one run at a time with nothing else on the machine);
//! - `back to back`: B2B_CALLS (env, default LATENCY_CALLS) calls with no pause: one caller
//!   saturating the daemon, so each call shares the CPUs with the work the
//!   last one left (the next warm container's creation, teardown);
//! - `after idle`: IDLE_CALLS (env, default 3) calls, each after IDLE_GAP_MS
//!   (env, default 6500: past `xfn::resident::IDLE_AFTER`) without calls,
//!   so each is the first after the daemon gave its code pages back.
use std::time::{Duration, Instant};
use xfn_testkit::stats::percentile;

use hyper_util::rt::TokioIo;
use tonic::transport::{Endpoint, Uri};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use xfn::proto::v1;
use xfn::proto::v1::function_runner_service_client::FunctionRunnerServiceClient as V1Client;
use xfn::proto::v1alpha1 as pb;
use xfn::proto::v1alpha1::containerized_function_runner_service_client::ContainerizedFunctionRunnerServiceClient as Client;

type AnyError = Box<dyn std::error::Error + Send + Sync>;

/// Who is called, and what a call sends and expects.
#[derive(Clone)]
enum Caller {
    /// `xfn start`: a FunctionIO on the runner API.
    Runner {
        client: Client<tonic::transport::Channel>,
        image: String,
        input: Vec<u8>,
        expect: Vec<u8>,
    },
    /// `xfn adapt`: the function API.
    Function {
        client: V1Client<tonic::transport::Channel>,
        resource: String,
    },
    /// Either, with `HEALTH` set: `grpc.health.v1.Health/Check`, a bare
    /// gRPC round trip to the same daemon over the same kind of connection.
    Health {
        client: HealthClient<tonic::transport::Channel>,
    },
}

impl Caller {
    async fn call(&mut self) -> Result<Duration, AnyError> {
        match self {
            Caller::Runner {
                client,
                image,
                input,
                expect,
            } => call(client, image, input, expect).await,
            Caller::Function { client, resource } => {
                let started = Instant::now();
                let out = client
                    .run_function(v1::RunFunctionRequest {
                        meta: Some(v1::RequestMeta {
                            tag: "bench".to_string(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                let elapsed = started.elapsed();
                let tagged = out.meta.is_some_and(|m| m.tag == "bench");
                let has = out
                    .desired
                    .is_some_and(|d| d.resources.contains_key(resource.as_str()));
                if !tagged || !has {
                    return Err(format!("the response lacks the tag or the {resource}").into());
                }
                Ok(elapsed)
            }
            Caller::Health { client } => {
                let started = Instant::now();
                let status = client
                    .check(HealthCheckRequest::default())
                    .await?
                    .into_inner()
                    .status;
                let elapsed = started.elapsed();
                if status != ServingStatus::Serving as i32 {
                    return Err(format!("the daemon is not serving: {status}").into());
                }
                Ok(elapsed)
            }
        }
    }
}

async fn connect(name: String) -> Result<tonic::transport::Channel, AnyError> {
    let channel = Endpoint::try_from("http://xfn.invalid")?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let name = name.clone();
            async move {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
                let stream = std::os::unix::net::UnixStream::connect_addr(&addr)?;
                stream.set_nonblocking(true)?;
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::from_std(stream)?))
            }
        }))
        .await?;
    Ok(channel)
}

async fn call(
    client: &mut Client<tonic::transport::Channel>,
    image: &str,
    input: &[u8],
    expect: &[u8],
) -> Result<Duration, AnyError> {
    let started = Instant::now();
    let out = client
        .run_function(pb::RunFunctionRequest {
            image: image.to_string(),
            input: input.to_vec(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let elapsed = started.elapsed();
    if out.output != expect {
        return Err(format!(
            "unexpected output: {}",
            String::from_utf8_lossy(&out.output)
        )
        .into());
    }
    Ok(elapsed)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() -> Result<(), AnyError> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let [socket, image, input_file, rest @ ..] = args.as_slice() else {
        return Err(
            "usage: server_load SOCKET IMAGE INPUT [LATENCY_CALLS] [CALLS_PER_LEVEL] [LEVELS]"
                .into(),
        );
    };
    let latency_calls: usize = rest.first().map_or(Ok(300), |s| s.parse())?;
    let calls_per_level: usize = rest.get(1).map_or(Ok(200), |s| s.parse())?;
    let levels: Vec<usize> = rest
        .get(2)
        .map_or("1,4,16", String::as_str)
        .split(',')
        .filter(|level| !level.is_empty())
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let health = std::env::var_os("HEALTH").is_some();
    let mut caller = match socket.strip_prefix("tcp:") {
        Some(address) if health => Caller::Health {
            client: HealthClient::new(
                Endpoint::try_from(format!("http://{address}"))?
                    .connect()
                    .await?,
            ),
        },
        Some(address) => Caller::Function {
            client: V1Client::connect(format!("http://{address}")).await?,
            resource: std::env::var("EXPECT_RESOURCE").unwrap_or_else(|_| "bucket".into()),
        },
        None if health => Caller::Health {
            client: HealthClient::new(connect(socket.clone()).await?),
        },
        None => {
            let input = std::fs::read(input_file)?;
            let expect = match std::env::var_os("EXPECT") {
                Some(file) => std::fs::read(file)?,
                None => input.clone(),
            };
            Caller::Runner {
                client: Client::new(connect(socket.clone()).await?),
                image: image.clone(),
                input,
                expect,
            }
        }
    };

    for _ in 0..10 {
        caller.call().await?;
    }
    let env_ms = |name: &str, default: u64| -> Result<Duration, AnyError> {
        Ok(Duration::from_millis(
            std::env::var(name).map_or(Ok(default), |v| v.parse())?,
        ))
    };
    let pace = env_ms("PACE_MS", 50)?;
    let idle_gap = env_ms("IDLE_GAP_MS", 6500)?;
    let idle_calls: usize = std::env::var("IDLE_CALLS").map_or(Ok(3), |v| v.parse())?;
    let b2b_calls: usize = std::env::var("B2B_CALLS").map_or(Ok(latency_calls), |v| v.parse())?;
    for (name, calls, gap) in [
        ("paced", latency_calls, pace),
        ("b2b", b2b_calls, Duration::ZERO),
        ("idle", idle_calls, idle_gap),
    ] {
        let mut latencies = Vec::with_capacity(calls);
        for _ in 0..calls {
            tokio::time::sleep(gap).await;
            latencies.push(caller.call().await?);
        }
        if latencies.is_empty() {
            continue;
        }
        latencies.sort();
        let mean = latencies.iter().sum::<Duration>() / latencies.len() as u32;
        println!("{name}_calls={calls}");
        println!("{name}_p50_ms={:.3}", ms(percentile(&latencies, 0.50)));
        println!("{name}_p99_ms={:.3}", ms(percentile(&latencies, 0.99)));
        println!("{name}_mean_ms={:.3}", ms(mean));
    }

    for callers in levels {
        let started = Instant::now();
        let tasks: Vec<_> = (0..callers)
            .map(|i| {
                let mut caller = caller.clone();
                let share = calls_per_level / callers + usize::from(i < calls_per_level % callers);
                tokio::spawn(async move {
                    for _ in 0..share {
                        caller.call().await?;
                    }
                    Ok::<_, AnyError>(())
                })
            })
            .collect();
        for task in tasks {
            task.await??;
        }
        let elapsed = started.elapsed();
        println!(
            "throughput_{callers}_callers_per_s={:.1}",
            calls_per_level as f64 / elapsed.as_secs_f64()
        );
    }
    Ok(())
}
