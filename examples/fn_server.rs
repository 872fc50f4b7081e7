//! A composition function server for xfn's tests: the Rust twin of
//! `tests/render/function.py` (written with Crossplane's Python SDK), with
//! the same actions and the same responses, but one static binary that runs
//! in a busybox image with no libc or Python, as the `Docker` runtime of
//! `xfn render` needs.
//!
//! Each pipeline step says what to do in its input's `action`:
//!   create   one ConfigMap per `spec.count` of the XR (bucket-0, bucket-1, ...)
//!   label    add `input.labels` to every desired resource
//!   ready    mark desired resources ready (all, or `input.names`)
//!   results  return a Warning (and a Fatal when `input.fatal` is set)
//!   require  require ConfigMap `input.name`; once given, copy its data into
//!            `from-settings`
//!   context  write `input.write` into the context; copy context key
//!            `input.read` into the XR's desired status
//!   observe, schema, env, mirror, operate: as function.py (what the
//!            reconciler gave the XR, a required schema's properties, an
//!            environment variable, observed composed resources' data in the
//!            XR's status, an Operation's applied resource and output)
//!
//! Run: fn_server --insecure [--address 127.0.0.1:PORT] [--serve v1|v1beta1|both]
//!
//! Where function.py would raise (a missing `labels`, a non-string
//! `warning`), the call fails with gRPC `Unknown` and the Python-style
//! message grpcio sends for an unexpected exception.
use std::net::SocketAddr;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use prost::Message;
use prost_types::value::Kind;
use serde_json::{json, Map, Value};
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status};

use xfn::proto::v1::function_runner_service_server::{
    FunctionRunnerService as V1Service, FunctionRunnerServiceServer as V1Server,
};
use xfn::proto::v1beta1::function_runner_service_server::{
    FunctionRunnerService as V1beta1Service, FunctionRunnerServiceServer as V1beta1Server,
};
use xfn::proto::{from_struct, to_struct};
use xfn::proto::{v1, v1beta1};

/// How long calls in flight may take to finish after SIGTERM, as the
/// Python SDK's `SHUTDOWN_GRACE_PERIOD_SECONDS`.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The TTL `response.to` gives every response (the SDK's `DEFAULT_TTL`).
const RESPONSE_TTL_SECONDS: i64 = 60;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Serve {
    /// Only `apiextensions.fn.proto.v1`.
    V1,
    /// Only `apiextensions.fn.proto.v1beta1`: v1 calls get `Unimplemented`,
    /// as from a function built before v1, so callers must fall back.
    V1beta1,
    /// Both, as the SDKs serve.
    Both,
}

/// Flags as a function built with a Crossplane SDK takes them.
#[derive(Debug, Parser)]
#[command(name = "fn_server", about = "xfn's test composition function (gRPC)")]
struct Args {
    /// Where to listen: an IP address and port (no DNS names).
    #[arg(long, default_value = "0.0.0.0:9443")]
    address: String,
    /// Serve plaintext. Required: this test server has no TLS.
    #[arg(long)]
    insecure: bool,
    /// Which versions of the function service to serve.
    #[arg(long, value_enum, default_value_t = Serve::Both)]
    serve: Serve,
}

fn main() -> ExitCode {
    // clap exits with status 2 on unknown or malformed flags.
    let args = Args::parse();
    if !args.insecure {
        eprintln!(
            "fn_server: TLS is not supported by this test server; it serves plaintext only: pass --insecure"
        );
        return ExitCode::from(2);
    }
    // Parsed, never resolved: the static binary must not reach glibc's
    // getaddrinfo, which needs NSS modules a busybox image does not have.
    let address = match SocketAddr::from_str(&args.address) {
        Ok(address) => address,
        Err(e) => {
            eprintln!(
                "fn_server: --address {:?} is not IP:PORT: {e}",
                args.address
            );
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("fn_server: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(address, args.serve)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fn_server: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(address: SocketAddr, versions: Serve) -> Result<(), String> {
    use tokio::signal::unix::{signal, SignalKind};
    // Handlers first: as PID 1 of a container, a process without one never
    // sees SIGTERM at all.
    let mut terminate =
        signal(SignalKind::terminate()).map_err(|e| format!("cannot handle SIGTERM: {e}"))?;
    let mut interrupt =
        signal(SignalKind::interrupt()).map_err(|e| format!("cannot handle SIGINT: {e}"))?;
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| format!("cannot listen on {address}: {e}"))?;
    let local = listener
        .local_addr()
        .map_err(|e| format!("cannot read the listening address: {e}"))?;

    let v1 = matches!(versions, Serve::V1 | Serve::Both).then(|| V1Server::new(Function));
    let v1beta1 =
        matches!(versions, Serve::V1beta1 | Serve::Both).then(|| V1beta1Server::new(Function));
    // Reflection, as the SDK serves, so grpcurl can call it by hand.
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(xfn::proto::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| format!("cannot build the reflection service: {e}"))?;

    // gRPC calls are small request/response pairs: no Nagle delay.
    let incoming = TcpListenerStream::new(listener).map(|stream| {
        let stream = stream?;
        stream.set_nodelay(true)?;
        Ok::<_, std::io::Error>(stream)
    });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tonic::transport::Server::builder()
        .add_service(reflection)
        .add_optional_service(v1)
        .add_optional_service(v1beta1)
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = stopped.await;
        });
    eprintln!("fn_server: serving {versions:?} (plaintext) on {local}");
    tokio::pin!(server);
    let signal = tokio::select! {
        result = &mut server => return result.map_err(|e| format!("serving failed: {e}")),
        _ = terminate.recv() => "SIGTERM",
        _ = interrupt.recv() => "SIGINT",
    };
    eprintln!("fn_server: {signal}: finishing calls in flight, then exiting");
    let _ = stop.send(());
    match tokio::time::timeout(SHUTDOWN_GRACE, server).await {
        Ok(result) => result.map_err(|e| format!("serving failed: {e}")),
        Err(_) => {
            eprintln!("fn_server: calls still in flight after {SHUTDOWN_GRACE:?}; exiting anyway");
            Ok(())
        }
    }
}

/// The function; stateless, so every call runs concurrently.
#[derive(Debug, Clone, Copy)]
struct Function;

#[tonic::async_trait]
impl V1Service for Function {
    async fn run_function(
        &self,
        request: Request<v1::RunFunctionRequest>,
    ) -> Result<Response<v1::RunFunctionResponse>, Status> {
        run_logged("v1", request.get_ref()).map(Response::new)
    }
}

#[tonic::async_trait]
impl V1beta1Service for Function {
    async fn run_function(
        &self,
        request: Request<v1beta1::RunFunctionRequest>,
    ) -> Result<Response<v1beta1::RunFunctionResponse>, Status> {
        // The two packages define the same messages field for field: convert
        // through the wire format, as the Python SDK's BetaFunctionRunner does.
        let request: v1::RunFunctionRequest = convert(request.get_ref())?;
        let response = run_logged("v1beta1", &request)?;
        convert(&response).map(Response::new)
    }
}

fn convert<A: Message, B: Message + Default>(message: &A) -> Result<B, Status> {
    B::decode(message.encode_to_vec().as_slice())
        .map_err(|e| Status::internal(format!("cannot convert between v1beta1 and v1: {e}")))
}

/// Runs one call and logs one line about it to stderr (which ends up in
/// xfn's logs when it runs this server in a container).
fn run_logged(
    version: &str,
    req: &v1::RunFunctionRequest,
) -> Result<v1::RunFunctionResponse, Status> {
    let tag = req.meta.as_ref().map_or("", |m| m.tag.as_str());
    let input = input(req);
    let action = py_repr(input.get("action").unwrap_or(&Value::Null));
    let result = run(req, &input);
    match &result {
        Ok(rsp) => eprintln!(
            "fn_server: {version} RunFunction action={action} tag={tag:?}: {} result(s)",
            rsp.results.len()
        ),
        Err(status) => eprintln!(
            "fn_server: {version} RunFunction action={action} tag={tag:?}: failed: {}",
            status.message()
        ),
    }
    result
}

/// `resource.struct_to_dict(req.input)`: `{}` when there is none.
fn input(req: &v1::RunFunctionRequest) -> Map<String, Value> {
    match req.input.as_ref().map(from_struct) {
        Some(Value::Object(map)) => map,
        _ => Map::new(),
    }
}

/// What grpcio answers when a Python servicer raises.
fn raised(exception: &str, detail: &str) -> Status {
    Status::unknown(format!("Unexpected <class '{exception}'>: {detail}"))
}

fn key_error(key: &str) -> Status {
    raised("KeyError", &py_repr(&Value::String(key.into())))
}

/// function.py's `RunFunction`, action by action.
fn run(
    req: &v1::RunFunctionRequest,
    inp: &Map<String, Value>,
) -> Result<v1::RunFunctionResponse, Status> {
    // `response.to(req)`: the tag, a TTL, and the request's desired state and
    // context, both always set (even when empty), as the SDK sets them.
    let mut rsp = v1::RunFunctionResponse {
        meta: Some(v1::ResponseMeta {
            tag: req.meta.as_ref().map(|m| m.tag.clone()).unwrap_or_default(),
            ttl: Some(prost_types::Duration {
                seconds: RESPONSE_TTL_SECONDS,
                nanos: 0,
            }),
        }),
        desired: Some(req.desired.clone().unwrap_or_default()),
        context: Some(req.context.clone().unwrap_or_default()),
        ..Default::default()
    };
    let desired = rsp.desired.get_or_insert_default();
    match inp.get("action").and_then(Value::as_str) {
        Some("create") => {
            let xr = req
                .observed
                .as_ref()
                .and_then(|o| o.composite.as_ref())
                .and_then(|c| c.resource.as_ref())
                .map_or_else(|| json!({}), from_struct);
            // int(xr.get("spec", {}).get("count", 0))
            let count = match xr.get("spec") {
                None => 0,
                Some(Value::Object(spec)) => py_int(spec.get("count").unwrap_or(&json!(0)))?,
                Some(other) => return Err(no_attribute(other, "get")),
            };
            for i in 0..count.max(0) {
                update(
                    desired.resources.entry(format!("bucket-{i}")).or_default(),
                    json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"index": i.to_string()}}),
                );
            }
            normal(&mut rsp, format!("created {count} buckets"));
        }
        Some("compose") => {
            // resource.update(rsp.desired.resources[inp["name"]], inp["resource"])
            let name = inp
                .get("name")
                .ok_or_else(|| key_error("name"))?
                .as_str()
                .ok_or_else(|| Status::invalid_argument("name is not a string"))?;
            let object = inp.get("resource").ok_or_else(|| key_error("resource"))?;
            update(
                desired.resources.entry(name.to_string()).or_default(),
                object.clone(),
            );
        }
        Some("label") => {
            for resource in desired.resources.values_mut() {
                let mut obj = match resource.resource.as_ref().map(from_struct) {
                    Some(Value::Object(obj)) => obj,
                    _ => Map::new(),
                };
                // obj.setdefault("metadata", {}).setdefault("labels", {}).update(inp["labels"])
                let metadata = setdefault_object(&mut obj, "metadata", "setdefault")?;
                let labels = setdefault_object(metadata, "labels", "update")?;
                labels.extend(py_dict_items(
                    inp.get("labels").ok_or_else(|| key_error("labels"))?,
                )?);
                update(resource, Value::Object(obj));
            }
        }
        Some("ready") => {
            let names = inp.get("names").filter(|names| truthy(names));
            for (name, resource) in desired.resources.iter_mut() {
                if names.map_or(Ok(true), |names| py_contains(names, name))? {
                    resource.ready = v1::Ready::True as i32;
                }
            }
        }
        Some("results") => {
            let warning = match inp.get("warning") {
                None => "careful".to_string(),
                Some(message) => py_message(message)?,
            };
            warning_result(&mut rsp, warning);
            if let Some(fatal) = inp.get("fatal").filter(|f| truthy(f)) {
                let message = py_message(fatal)?;
                fatal_result(&mut rsp, message);
            }
        }
        Some("require") => {
            // Ask every time: the caller re-runs the step until the
            // requirements stop changing, as Crossplane does.
            let name = match inp.get("name") {
                Some(Value::String(name)) => name.clone(),
                Some(_) => return Err(bad_argument_type()),
                None => return Err(key_error("name")),
            };
            // `response.require_resources` (SDK 0.15) writes `resources`,
            // not the deprecated `extra_resources`.
            rsp.requirements.get_or_insert_default().resources.insert(
                "settings".into(),
                v1::ResourceSelector {
                    api_version: "v1".into(),
                    kind: "ConfigMap".into(),
                    r#match: Some(v1::resource_selector::Match::MatchName(name)),
                    namespace: None,
                },
            );
            // `request.get_required_resource`: the first of
            // `required_resources["settings"]`, if any.
            let found = req
                .required_resources
                .get("settings")
                .and_then(|r| r.items.first())
                .map(|item| {
                    item.resource
                        .as_ref()
                        .map_or_else(|| json!({}), from_struct)
                });
            if let Some(found) = found {
                let data = found.get("data").cloned().unwrap_or_else(|| json!({}));
                update(
                    desired.resources.entry("from-settings".into()).or_default(),
                    json!({"apiVersion": "v1", "kind": "ConfigMap", "data": data}),
                );
            }
        }
        Some("context") => {
            // ctx.update(inp.get("write", {}))
            let write = match inp.get("write") {
                None => Map::new(),
                Some(write) => py_dict_items(write)?,
            };
            // Start from the request's context rather than a JSON copy of
            // it, so values JSON cannot hold (NaN) pass through untouched.
            let mut context = req.context.clone().unwrap_or_default();
            if let Some(write) = to_struct(&Value::Object(write)) {
                context.fields.extend(write.fields);
            }
            if let Some(read) = inp.get("read") {
                // `ctx.get(key)`: None (null) for a missing or non-string key.
                let value = read
                    .as_str()
                    .and_then(|key| context.fields.get(key))
                    .cloned()
                    .unwrap_or(prost_types::Value {
                        kind: Some(Kind::NullValue(0)),
                    });
                let status = prost_types::Struct {
                    fields: [("fromContext".to_string(), value)].into(),
                };
                // `resource.update(rsp.desired.composite, {"status": ...})`:
                // the whole `status` key is replaced.
                desired
                    .composite
                    .get_or_insert_default()
                    .resource
                    .get_or_insert_default()
                    .fields
                    .insert(
                        "status".into(),
                        prost_types::Value {
                            kind: Some(Kind::StructValue(status)),
                        },
                    );
            }
            rsp.context = Some(context);
        }
        Some("mirror") => {
            // `resource.update(rsp.desired.composite, {"status": {"mirrored":
            // {name: data}}})`: the whole `status` key is replaced.
            let mirrored: Map<String, Value> = req
                .observed
                .as_ref()
                .map(|o| {
                    o.resources
                        .iter()
                        .map(|(name, r)| {
                            let object = r.resource.as_ref().map_or_else(|| json!({}), from_struct);
                            (
                                name.clone(),
                                object.get("data").cloned().unwrap_or_else(|| json!({})),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            let status = to_struct(&json!({"mirrored": mirrored})).unwrap_or_default();
            desired
                .composite
                .get_or_insert_default()
                .resource
                .get_or_insert_default()
                .fields
                .insert(
                    "status".into(),
                    prost_types::Value {
                        kind: Some(Kind::StructValue(status)),
                    },
                );
        }
        Some("observe") => {
            let xr = req
                .observed
                .as_ref()
                .and_then(|o| o.composite.as_ref())
                .and_then(|c| c.resource.as_ref())
                .map_or_else(|| json!({}), from_struct);
            let observed = json!({
                "uid": xr.pointer("/metadata/uid").cloned().unwrap_or(Value::Null),
                "labels": xr.pointer("/metadata/labels").cloned().unwrap_or_else(|| json!({})),
                "spec": xr.get("spec").cloned().unwrap_or_else(|| json!({})),
            });
            context_insert(&mut rsp, "observed", observed);
        }
        Some("schema") => {
            let field = |key: &str| match inp.get(key) {
                Some(Value::String(v)) => Ok(v.clone()),
                Some(_) => Err(bad_argument_type()),
                None => Err(key_error(key)),
            };
            rsp.requirements.get_or_insert_default().schemas.insert(
                "schema".into(),
                v1::SchemaSelector {
                    api_version: field("apiVersion")?,
                    kind: field("kind")?,
                },
            );
            if let Some(schema) = req.required_schemas.get("schema") {
                let names =
                    schema
                        .openapi_v3
                        .as_ref()
                        .map(from_struct)
                        .map_or(Value::Null, |schema| {
                            let mut names: Vec<String> = schema
                                .get("properties")
                                .and_then(Value::as_object)
                                .map(|p| p.keys().cloned().collect())
                                .unwrap_or_default();
                            names.sort();
                            json!(names)
                        });
                context_insert(&mut rsp, "schemaProperties", names);
            }
        }
        Some("operate") => {
            let name = match inp.get("name") {
                Some(Value::String(name)) => name.clone(),
                Some(_) => return Err(bad_argument_type()),
                None => return Err(key_error("name")),
            };
            rsp.requirements.get_or_insert_default().resources.insert(
                "settings".into(),
                v1::ResourceSelector {
                    api_version: "v1".into(),
                    kind: "ConfigMap".into(),
                    r#match: Some(v1::resource_selector::Match::MatchName("settings".into())),
                    namespace: None,
                },
            );
            let first = |key: &str| {
                req.required_resources
                    .get(key)
                    .and_then(|r| r.items.first())
                    .and_then(|item| item.resource.as_ref())
                    .map(from_struct)
            };
            let watched = first("ops.crossplane.io/watched-resource")
                .and_then(|w| w.pointer("/metadata/name").cloned())
                .unwrap_or_else(|| json!(""));
            let mut data = Map::new();
            data.insert("watched".into(), watched);
            if let Some(Value::Object(settings)) =
                first("settings").and_then(|s| s.get("data").cloned())
            {
                data.extend(settings);
            }
            let mut keys: Vec<String> = data.keys().cloned().collect();
            keys.sort();
            let desired = rsp.desired.get_or_insert_default();
            update(
                desired.resources.entry(name.clone()).or_default(),
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": name, "namespace": "default"}, "data": data}),
            );
            rsp.output = to_struct(&json!({"applied": name, "keys": keys}));
            normal(&mut rsp, format!("applied {name}"));
        }
        Some("env") => {
            let value = inp
                .get("name")
                .and_then(Value::as_str)
                .and_then(|name| std::env::var(name).ok())
                .map_or(Value::Null, Value::String);
            context_insert(&mut rsp, "env", value);
        }
        _ => {
            let action = py_repr(inp.get("action").unwrap_or(&Value::Null));
            fatal_result(&mut rsp, format!("unknown action {action}"));
        }
    }
    Ok(rsp)
}

/// `resource.update(r, dict)`: each top-level key of `source` replaces the
/// resource's (Struct.update semantics); other keys stay.
/// `rsp.context.update({key: value})`.
fn context_insert(rsp: &mut v1::RunFunctionResponse, key: &str, value: Value) {
    if let Some(s) = to_struct(&json!({ key: value })) {
        rsp.context.get_or_insert_default().fields.extend(s.fields);
    }
}

fn update(resource: &mut v1::Resource, source: Value) {
    if let Some(source) = to_struct(&source) {
        resource
            .resource
            .get_or_insert_default()
            .fields
            .extend(source.fields);
    }
}

fn result(rsp: &mut v1::RunFunctionResponse, severity: v1::Severity, message: String) {
    // The SDK sets only severity and message (no reason, no target).
    rsp.results.push(v1::Result {
        severity: severity as i32,
        message,
        ..Default::default()
    });
}

fn normal(rsp: &mut v1::RunFunctionResponse, message: String) {
    result(rsp, v1::Severity::Normal, message);
}

fn warning_result(rsp: &mut v1::RunFunctionResponse, message: String) {
    result(rsp, v1::Severity::Warning, message);
}

fn fatal_result(rsp: &mut v1::RunFunctionResponse, message: String) {
    result(rsp, v1::Severity::Fatal, message);
}

/// `map.setdefault(key, {})` followed by a call of dict method `next`,
/// which fails unless the value is a dict.
fn setdefault_object<'a>(
    map: &'a mut Map<String, Value>,
    key: &str,
    next: &str,
) -> Result<&'a mut Map<String, Value>, Status> {
    match map.entry(key).or_insert_with(|| json!({})) {
        Value::Object(inner) => Ok(inner),
        other => Err(no_attribute(other, next)),
    }
}

fn no_attribute(value: &Value, attribute: &str) -> Status {
    raised(
        "AttributeError",
        &format!("'{}' object has no attribute '{attribute}'", py_type(value)),
    )
}

/// What the (upb) protobuf runtime raises for a non-string string field.
fn bad_argument_type() -> Status {
    raised("TypeError", "bad argument type for built-in operation")
}

/// The entries `dict.update(value)` adds: a dict's; none for an empty
/// string or list. (A list of pairs, which Python also takes, is refused
/// with Python's message about its first element: no test needs it.)
fn py_dict_items(value: &Value) -> Result<Map<String, Value>, Status> {
    match value {
        Value::Object(map) => Ok(map.clone()),
        Value::String(s) if s.is_empty() => Ok(Map::new()),
        Value::Array(items) if items.is_empty() => Ok(Map::new()),
        Value::String(_) => Err(raised(
            "ValueError",
            "dictionary update sequence element #0 has length 1; 2 is required",
        )),
        Value::Array(_) => Err(raised(
            "TypeError",
            "cannot convert dictionary update sequence element #0 to a sequence",
        )),
        other => Err(raised(
            "TypeError",
            &format!("'{}' object is not iterable", py_type(other)),
        )),
    }
}

/// Python's `int(value)` of a JSON value (numbers are floats, as
/// `struct_to_dict` gives them).
fn py_int(value: &Value) -> Result<i64, Status> {
    match value {
        Value::Bool(b) => Ok(i64::from(*b)),
        // `int(2.7)` truncates; `as` saturates where Python would not.
        Value::Number(n) => n
            .as_i64()
            .or_else(|| {
                n.as_f64()
                    .filter(|f| f.is_finite())
                    .map(|f| f.trunc() as i64)
            })
            .ok_or_else(|| raised("ValueError", "cannot convert float to integer")),
        Value::String(s) => s.trim().replace('_', "").parse::<i64>().map_err(|_| {
            raised(
                "ValueError",
                &format!("invalid literal for int() with base 10: {}", py_repr(value)),
            )
        }),
        other => Err(raised(
            "TypeError",
            &format!(
                "int() argument must be a string, a bytes-like object or a real number, not '{}'",
                py_type(other)
            ),
        )),
    }
}

/// A Result message: a string, or None (an unset field) for null.
fn py_message(value: &Value) -> Result<String, Status> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        _ => Err(bad_argument_type()),
    }
}

/// Python truthiness.
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// Python's `name in container`.
fn py_contains(container: &Value, name: &str) -> Result<bool, Status> {
    match container {
        Value::Array(items) => Ok(items.iter().any(|item| item.as_str() == Some(name))),
        Value::String(s) => Ok(s.contains(name)),
        Value::Object(map) => Ok(map.contains_key(name)),
        other => Err(raised(
            "TypeError",
            &format!("argument of type '{}' is not iterable", py_type(other)),
        )),
    }
}

fn py_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(_) => "float",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// Python's `repr` of what `struct_to_dict` makes of a value, for
/// function.py's `f"unknown action {action!r}"`.
fn py_repr(value: &Value) -> String {
    match value {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        // Struct numbers are floats: Python prints 3 as `3.0`.
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) if i.unsigned_abs() < 10_u64.pow(16) => format!("{i}.0"),
            (_, Some(f)) => py_float_repr(f),
            _ => n.to_string(),
        },
        Value::String(s) => py_str_repr(s),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(py_repr).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) => {
            let items: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", py_str_repr(k), py_repr(v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
    }
}

/// Python's `repr(float)`: Rust's `{:?}` picks the same digits and the same
/// switch to exponents (below 1e-4, from 1e16); Python writes the exponent
/// signed and with at least two digits.
fn py_float_repr(f: f64) -> String {
    let debug = format!("{f:?}");
    match debug.split_once('e') {
        Some((mantissa, exponent)) => {
            let (sign, digits) = match exponent.strip_prefix('-') {
                Some(digits) => ('-', digits),
                None => ('+', exponent),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => debug,
    }
}

/// Python's `repr(str)`: single quotes unless the text has single quotes
/// and no double ones; backslash escapes for quotes and control characters.
fn py_str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if u32::from(c) < 0x20 || (0x7f..0xa0).contains(&u32::from(c)) => {
                out.push_str(&format!("\\x{:02x}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}
