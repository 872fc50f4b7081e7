//! Checking a `RunFunctionRequest` before any work is done, and turning it
//! into the engine's [`RunConfig`].
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::echo::Echo;
use crate::image::{PullPolicy, RegistryAuth};
use crate::nesting::{check_until, off_thread, NestingError};
use crate::proto::v1alpha1 as pb;
use crate::quantity::QuantityError;
use crate::runner::{Limits, NetworkPolicy, RunConfig};

/// The apiVersions a FunctionIO may carry (the alpha and its renamed group).
pub(crate) const FUNCTION_IO_API_VERSIONS: [&str; 2] = [
    "apiextensions.crossplane.io/v1alpha1",
    "fn.apiextensions.crossplane.io/v1alpha1",
];

/// Why a request is refused before it runs; each becomes InvalidArgument
/// (`super::service::invalid_request_status`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum InvalidRequest {
    /// No image.
    #[error("image is empty")]
    EmptyImage,
    /// The input is over the daemon's limit.
    #[error("input is {size} bytes, over the limit of {limit} bytes (--max-input-bytes)")]
    InputTooLarge {
        /// Input size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The input nests too deep, or its aliases expand too far, to be
    /// parsed.
    #[error("input is not a FunctionIO")]
    OutOfBounds(#[from] NestingError),
    /// The check of the input panicked (a parser bug): nothing ran.
    #[error("input could not be checked: its parser failed")]
    Unchecked,
    /// The input is not YAML.
    #[error("input is not a FunctionIO: not YAML")]
    NotYaml(#[source] yaml_serde::Error),
    /// The input holds no document at all (nothing, or only blanks and
    /// comments): a forgotten pipe, most often.
    #[error("input is empty: a FunctionIO is required")]
    Empty,
    /// The input is YAML but no mapping.
    #[error("input is not a FunctionIO: not a YAML mapping")]
    NotMapping,
    /// apiVersion/kind name another type.
    #[error("input is not a FunctionIO: {0}")]
    WrongType(String),
    /// A negative timeout.
    #[error("run_function_config.timeout is negative")]
    NegativeTimeout,
    /// A timeout that is no protobuf Duration: its nanos outside
    /// ±999,999,999, or of the other sign than its seconds.
    #[error(
        "run_function_config.timeout is not a protobuf Duration: nanos {nanos} {why} (seconds {seconds})"
    )]
    MalformedTimeout {
        /// Its seconds.
        seconds: i64,
        /// Its nanos.
        nanos: i32,
        /// What is wrong with them.
        why: &'static str,
    },
    /// A cpu or memory limit that is no Kubernetes quantity.
    #[error("run_function_config.resources.limits")]
    Quantity(#[from] QuantityError),
    /// An enum value this server does not know.
    #[error("unknown {field} value {value}")]
    UnknownEnum {
        /// The field.
        field: &'static str,
        /// Its numeric value.
        value: i32,
    },
}

/// Checks that `input` is a FunctionIO: a YAML mapping whose apiVersion and
/// kind, where present, name FunctionIO (Crossplane's runner sent them; older
/// hand-written inputs omit them). `xfn run` checks its input with it.
pub(crate) fn check_function_io(input: &[u8], limit: usize) -> Result<(), InvalidRequest> {
    check_function_io_until(input, limit, &AtomicBool::new(false))
}

/// [`check_function_io`], its nesting bounded before the parser runs
/// ([`crate::nesting`]) and that check stopped once `stop` is set.
fn check_function_io_until(
    input: &[u8],
    limit: usize,
    stop: &AtomicBool,
) -> Result<(), InvalidRequest> {
    if input.len() > limit {
        return Err(InvalidRequest::InputTooLarge {
            size: input.len(),
            limit,
        });
    }
    check_until(input, stop)?;
    let value: yaml_serde::Value =
        yaml_serde::from_slice(input).map_err(InvalidRequest::NotYaml)?;
    if value.is_null() && is_blank(input) {
        return Err(InvalidRequest::Empty);
    }
    let map = value.as_mapping().ok_or(InvalidRequest::NotMapping)?;
    if let Some(api_version) = map.get("apiVersion") {
        let api_version = api_version
            .as_str()
            .ok_or_else(|| InvalidRequest::WrongType("apiVersion is not a string".into()))?;
        if !FUNCTION_IO_API_VERSIONS.contains(&api_version) {
            return Err(InvalidRequest::WrongType(format!(
                "apiVersion {:?} is not one of {FUNCTION_IO_API_VERSIONS:?}",
                Echo(api_version)
            )));
        }
    }
    if let Some(kind) = map.get("kind") {
        match kind.as_str() {
            Some("FunctionIO") => {}
            Some(kind) => {
                return Err(InvalidRequest::WrongType(format!(
                    "kind is {:?}, not FunctionIO",
                    Echo(kind)
                )))
            }
            None => return Err(InvalidRequest::WrongType("kind is not a string".into())),
        }
    }
    Ok(())
}

/// Whether `input` holds no YAML document: only blanks and comments (a
/// document of a literal `null` or `~` is no mapping, said as such).
fn is_blank(input: &[u8]) -> bool {
    input.split(|b| *b == b'\n').all(|line| {
        let line = line.trim_ascii();
        line.is_empty() || line.starts_with(b"#")
    })
}

/// Inputs up to this size are checked on the calling async thread: their
/// whole check (nesting bound, parse) takes less than handing them to a
/// blocking thread and back, which costs two thread wake-ups on every call
/// (about 50 µs of a started call's latency, benches/PROFILE.md, sixth
/// pass), and holds that thread no longer than a call's own gRPC work.
/// Crossplane's inputs are mostly this small; larger ones go to a blocking
/// thread within the parse budget ([`off_thread`]).
pub(crate) const INLINE_CHECK_BYTES: usize = 8 << 10;

/// The request validated and its run configuration (what `run_config_of`
/// gives tests), and with it the input's check: up to
/// [`INLINE_CHECK_BYTES`] here, past it on a blocking thread, as the input
/// is up to `--max-input-bytes` of YAML, and parsing it must hold none of
/// the async threads every other call needs. Dropping the future (the
/// caller went away) stops the input's nesting check; what could run
/// after it is bounded by it. The request comes back with its
/// configuration; a check that panicked (a parser bug) is
/// [`InvalidRequest::Unchecked`] either way.
pub(crate) async fn checked(
    request: pb::RunFunctionRequest,
    default_timeout: Duration,
    max_input_bytes: usize,
) -> Result<(pb::RunFunctionRequest, RunConfig), InvalidRequest> {
    if request.input.len() <= INLINE_CHECK_BYTES {
        let check = || {
            run_config_until(
                &request,
                default_timeout,
                max_input_bytes,
                &AtomicBool::new(false),
            )
        };
        return match std::panic::catch_unwind(std::panic::AssertUnwindSafe(check)) {
            Ok(config) => config.map(|config| (request, config)),
            Err(_) => Err(InvalidRequest::Unchecked),
        };
    }
    off_thread(request.input.len(), move |abandoned| {
        run_config_until(&request, default_timeout, max_input_bytes, abandoned.flag())
            .map(|config| (request, config))
    })
    .await
    .unwrap_or(Err(InvalidRequest::Unchecked))
}

/// Validates `request` and returns the image and run configuration; the
/// timeout is the request's, else `default_timeout` (before the caller's
/// deadline caps it).
#[cfg(test)]
pub(crate) fn run_config_of(
    request: &pb::RunFunctionRequest,
    default_timeout: Duration,
    max_input_bytes: usize,
) -> Result<RunConfig, InvalidRequest> {
    run_config_until(
        request,
        default_timeout,
        max_input_bytes,
        &AtomicBool::new(false),
    )
}

fn run_config_until(
    request: &pb::RunFunctionRequest,
    default_timeout: Duration,
    max_input_bytes: usize,
    stop: &AtomicBool,
) -> Result<RunConfig, InvalidRequest> {
    if request.image.trim().is_empty() {
        return Err(InvalidRequest::EmptyImage);
    }
    check_function_io_until(&request.input, max_input_bytes, stop)?;

    let mut config = RunConfig {
        timeout: default_timeout,
        ..RunConfig::default()
    };
    if let Some(pull) = &request.image_pull_config {
        config.pull_policy = proto_enum::<pb::ImagePullPolicy, PullPolicy>(
            "image_pull_config.pull_policy",
            pull.pull_policy,
        )?;
        if let Some(auth) = &pull.auth {
            config.auth = RegistryAuth {
                username: auth.username.clone(),
                password: auth.password.clone(),
                auth: auth.auth.clone(),
                identity_token: auth.identity_token.clone(),
                registry_token: auth.registry_token.clone(),
            };
        }
    }
    if let Some(run) = &request.run_function_config {
        if let Some(timeout) = &run.timeout {
            let timeout = timeout_of(timeout)?;
            // Zero means "not set" in proto3; Crossplane's runner fell back too.
            if !timeout.is_zero() {
                config.timeout = timeout;
            }
        }
        if let Some(network) = &run.network {
            config.network = proto_enum::<pb::NetworkPolicy, NetworkPolicy>(
                "run_function_config.network.policy",
                network.policy,
            )?;
        }
        if let Some(limits) = run.resources.as_ref().and_then(|r| r.limits.as_ref()) {
            config.limits = Limits::parse(set(&limits.cpu), set(&limits.memory))?;
        }
    }
    Ok(config)
}

/// A request's timeout as a [`Duration`]; refused when it is no valid
/// protobuf Duration (which `Duration::new` would silently carry: nanos of
/// 2e9 read as 2 s more) or when it is negative.
fn timeout_of(timeout: &prost_types::Duration) -> Result<Duration, InvalidRequest> {
    const NANOS_PER_SECOND: i32 = 1_000_000_000;
    let (seconds, nanos) = (timeout.seconds, timeout.nanos);
    let malformed = |why| InvalidRequest::MalformedTimeout {
        seconds,
        nanos,
        why,
    };
    if nanos <= -NANOS_PER_SECOND || nanos >= NANOS_PER_SECOND {
        return Err(malformed("is outside -999999999..=999999999"));
    }
    if (seconds < 0 && nanos > 0) || (seconds > 0 && nanos < 0) {
        return Err(malformed("has the other sign than seconds"));
    }
    match (u64::try_from(seconds), u32::try_from(nanos)) {
        (Ok(seconds), Ok(nanos)) => Ok(Duration::new(seconds, nanos)),
        _ => Err(InvalidRequest::NegativeTimeout),
    }
}

/// A protobuf enum field as the engine's type (its `From`, next to that
/// type); a value this server does not know is refused naming the field.
fn proto_enum<P: TryFrom<i32>, T: From<P>>(
    field: &'static str,
    value: i32,
) -> Result<T, InvalidRequest> {
    P::try_from(value)
        .map(T::from)
        .map_err(|_| InvalidRequest::UnknownEnum { field, value })
}

/// A proto3 string field, `None` when empty ("not set").
fn set(field: &str) -> Option<&str> {
    Some(field).filter(|f| !f.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    const IO: &[u8] =
        b"apiVersion: apiextensions.crossplane.io/v1alpha1\nkind: FunctionIO\nobserved: {}\n";

    fn request(input: &[u8]) -> pb::RunFunctionRequest {
        pb::RunFunctionRequest {
            image: "registry.test/fn:v1".into(),
            input: input.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn accepts_function_io_of_both_groups_and_bare_mappings() {
        check_function_io(IO, 1 << 20).unwrap();
        check_function_io(
            b"apiVersion: fn.apiextensions.crossplane.io/v1alpha1\nkind: FunctionIO\n",
            1 << 20,
        )
        .unwrap();
        check_function_io(b"observed: {}\n", 1 << 20).unwrap();
    }

    #[test]
    fn refuses_what_is_no_function_io() {
        assert!(matches!(
            check_function_io(b"{ unclosed", 1 << 20),
            Err(InvalidRequest::NotYaml(_))
        ));
        assert!(matches!(
            check_function_io(b"- a\n- b\n", 1 << 20),
            Err(InvalidRequest::NotMapping)
        ));
        for nothing in [&b""[..], b"\n  \n", b"# only a comment\n"] {
            assert!(matches!(
                check_function_io(nothing, 1 << 20),
                Err(InvalidRequest::Empty)
            ));
        }
        assert!(matches!(
            check_function_io(b"~\n", 1 << 20),
            Err(InvalidRequest::NotMapping)
        ));
        let err = check_function_io(b"apiVersion: v1\nkind: ConfigMap\n", 1 << 20).unwrap_err();
        assert_eq!(
            err.to_string(),
            "input is not a FunctionIO: apiVersion \"v1\" is not one of \
             [\"apiextensions.crossplane.io/v1alpha1\", \"fn.apiextensions.crossplane.io/v1alpha1\"]"
        );
        assert_eq!(
            check_function_io(b"kind: ConfigMap\n", 1 << 20)
                .unwrap_err()
                .to_string(),
            "input is not a FunctionIO: kind is \"ConfigMap\", not FunctionIO"
        );
        assert!(matches!(
            check_function_io(b"apiVersion: v1\nkind: ConfigMap\n", 1 << 20),
            Err(InvalidRequest::WrongType(_))
        ));
        assert!(matches!(
            check_function_io(
                b"apiVersion: apiextensions.crossplane.io/v1alpha1\nkind: Composition\n",
                1 << 20
            ),
            Err(InvalidRequest::WrongType(_))
        ));
    }

    #[test]
    fn refuses_deep_input_before_parsing() {
        let deep = format!("observed: {}", "[".repeat(4 << 20));
        let err = check_function_io(deep.as_bytes(), 8 << 20).unwrap_err();
        assert!(matches!(err, InvalidRequest::OutOfBounds(_)), "{err:?}");
        let text = crate::chain::one_line(&err);
        assert!(
            text.starts_with("input is not a FunctionIO: ")
                && text.contains("nested more than 64 levels deep"),
            "{text}"
        );
        // Deep block nesting too.
        let deep = format!("observed:\n{}x", "- ".repeat(100));
        let err = check_function_io(deep.as_bytes(), 8 << 20).unwrap_err();
        assert!(matches!(err, InvalidRequest::OutOfBounds(_)), "{err:?}");
    }

    #[tokio::test]
    async fn alias_bombs_are_refused_before_parsing_in_place_and_on_a_blocking_thread() {
        use crate::nesting::bombs;
        for (name, bomb) in [
            ("wide", bombs::wide()),
            ("listed", bombs::listed()),
            ("laughs", bombs::laughs()),
        ] {
            let input = format!("{}config: {bomb}\n", std::str::from_utf8(IO).unwrap());
            let err = checked(request(input.as_bytes()), Duration::from_secs(1), 1 << 20)
                .await
                .unwrap_err();
            assert!(
                matches!(err, InvalidRequest::OutOfBounds(_)),
                "{name}: {err:?}"
            );
            let text = crate::chain::one_line(&err);
            assert!(
                text.starts_with("input is not a FunctionIO: its aliases expand too far")
                    && text.contains("refused before parsing"),
                "{name}: {text}"
            );
        }
    }

    #[tokio::test]
    async fn checked_gives_the_request_back_with_its_config() {
        let (back, config) = checked(request(IO), Duration::from_secs(7), 1 << 20)
            .await
            .unwrap();
        assert_eq!(back.input, IO);
        assert_eq!(config.timeout, Duration::from_secs(7));
        let deep = format!("observed: {}", "{a: ".repeat(1000));
        let err = checked(request(deep.as_bytes()), Duration::from_secs(1), 1 << 20)
            .await
            .unwrap_err();
        assert!(matches!(err, InvalidRequest::OutOfBounds(_)), "{err:?}");
    }

    #[tokio::test]
    async fn inputs_checked_in_place_and_on_a_blocking_thread_are_judged_alike() {
        // A FunctionIO padded with a comment to either side of the size
        // checked in place, and the same nesting too deep to parse.
        let padded = |size: usize, body: &str| {
            let mut input = format!("{body}\n#");
            input.push_str(&"x".repeat(size.saturating_sub(input.len())));
            input.into_bytes()
        };
        let deep = format!("observed: {}", "{a: ".repeat(1000));
        let io = std::str::from_utf8(IO).unwrap();
        for size in [INLINE_CHECK_BYTES, INLINE_CHECK_BYTES + 1] {
            let input = padded(size, io);
            assert_eq!(input.len(), size);
            let (back, _) = checked(request(&input), Duration::from_secs(7), 1 << 20)
                .await
                .unwrap();
            assert_eq!(back.input, input);
            let input = padded(size, &deep);
            let err = checked(request(&input), Duration::from_secs(7), 1 << 20)
                .await
                .unwrap_err();
            assert!(
                matches!(err, InvalidRequest::OutOfBounds(_)),
                "{size}: {err:?}"
            );
            let err = checked(request(&input[..size - 2]), Duration::from_secs(7), 16)
                .await
                .unwrap_err();
            assert!(
                matches!(err, InvalidRequest::InputTooLarge { .. }),
                "{size}: {err:?}"
            );
        }
    }

    #[test]
    fn refuses_oversized_input_before_parsing() {
        assert!(matches!(
            check_function_io(IO, 10),
            Err(InvalidRequest::InputTooLarge { size, limit: 10 }) if size == IO.len()
        ));
    }

    #[test]
    fn empty_image_is_refused() {
        let mut req = request(IO);
        req.image = " ".into();
        assert!(matches!(
            run_config_of(&req, Duration::from_secs(25), 1 << 20).unwrap_err(),
            InvalidRequest::EmptyImage
        ));
    }

    #[test]
    fn defaults_apply_when_the_request_sets_nothing() {
        let config = run_config_of(&request(IO), Duration::from_secs(25), 1 << 20).unwrap();
        assert_eq!(config.timeout, Duration::from_secs(25));
        assert_eq!(config.pull_policy, PullPolicy::IfNotPresent);
        assert_eq!(config.network, NetworkPolicy::Isolated);
        assert_eq!(config.limits, Limits::default());
    }

    #[test]
    fn request_fields_become_the_run_config() {
        let mut req = request(IO);
        req.image_pull_config = Some(pb::ImagePullConfig {
            pull_policy: pb::ImagePullPolicy::Never as i32,
            auth: Some(pb::ImagePullAuth {
                username: "u".into(),
                password: "p".into(),
                ..Default::default()
            }),
        });
        req.run_function_config = Some(pb::RunFunctionConfig {
            resources: Some(pb::ResourceConfig {
                limits: Some(pb::ResourceLimits {
                    memory: "128Mi".into(),
                    cpu: "".into(),
                }),
            }),
            network: Some(pb::NetworkConfig {
                policy: pb::NetworkPolicy::Runner as i32,
            }),
            timeout: Some(prost_types::Duration {
                seconds: 3,
                nanos: 0,
            }),
        });
        let config = run_config_of(&req, Duration::from_secs(25), 1 << 20).unwrap();
        assert_eq!(config.pull_policy, PullPolicy::Never);
        assert_eq!(config.auth.username, "u");
        assert_eq!(config.network, NetworkPolicy::Runner);
        assert_eq!(config.timeout, Duration::from_secs(3));
        assert_eq!(config.limits.memory_bytes, Some(128 << 20));
        assert_eq!(config.limits.cpu_millis, None);
    }

    #[test]
    fn limits_that_are_no_quantities_are_refused_naming_the_field() {
        let mut req = request(IO);
        req.run_function_config = Some(pb::RunFunctionConfig {
            resources: Some(pb::ResourceConfig {
                limits: Some(pb::ResourceLimits {
                    memory: "".into(),
                    cpu: "1x".into(),
                }),
            }),
            ..Default::default()
        });
        let err = run_config_of(&req, Duration::from_secs(1), 1 << 20).unwrap_err();
        assert!(matches!(err, InvalidRequest::Quantity(_)), "{err:?}");
        let text = crate::chain::one_line(&err);
        assert!(
            text.starts_with(
                "run_function_config.resources.limits: \"1x\" is not a Kubernetes quantity"
            ),
            "{text}"
        );
    }

    #[test]
    fn unknown_enums_and_negative_timeouts_are_refused() {
        let mut req = request(IO);
        req.image_pull_config = Some(pb::ImagePullConfig {
            pull_policy: 42,
            auth: None,
        });
        assert!(matches!(
            run_config_of(&req, Duration::from_secs(1), 1 << 20),
            Err(InvalidRequest::UnknownEnum { .. })
        ));
        let mut req = request(IO);
        req.run_function_config = Some(pb::RunFunctionConfig {
            timeout: Some(prost_types::Duration {
                seconds: -1,
                nanos: 0,
            }),
            ..Default::default()
        });
        assert!(matches!(
            run_config_of(&req, Duration::from_secs(1), 1 << 20).unwrap_err(),
            InvalidRequest::NegativeTimeout
        ));
    }

    fn with_timeout(seconds: i64, nanos: i32) -> pb::RunFunctionRequest {
        let mut req = request(IO);
        req.run_function_config = Some(pb::RunFunctionConfig {
            timeout: Some(prost_types::Duration { seconds, nanos }),
            ..Default::default()
        });
        req
    }

    #[test]
    fn a_timeout_whose_nanos_are_no_protobuf_duration_is_refused_naming_the_field() {
        for (seconds, nanos) in [
            (1, 2_000_000_000),
            (0, 1_000_000_000),
            (0, i32::MAX),
            (0, -1_000_000_000),
            (1, -1),
            (-1, 1),
        ] {
            let err = run_config_of(
                &with_timeout(seconds, nanos),
                Duration::from_secs(1),
                1 << 20,
            )
            .unwrap_err();
            assert!(
                matches!(err, InvalidRequest::MalformedTimeout { .. }),
                "({seconds}, {nanos}): {err:?}"
            );
            let text = crate::chain::one_line(&err);
            assert!(
                text.starts_with("run_function_config.timeout is not a protobuf Duration: nanos"),
                "{text}"
            );
            assert_eq!(
                crate::sidecar::service::invalid_request_status(&err).code(),
                tonic::Code::InvalidArgument
            );
        }
        for (seconds, nanos) in [(-1, 0), (0, -1), (-1, -999_999_999)] {
            let err = run_config_of(
                &with_timeout(seconds, nanos),
                Duration::from_secs(1),
                1 << 20,
            )
            .unwrap_err();
            assert!(
                matches!(err, InvalidRequest::NegativeTimeout),
                "({seconds}, {nanos}): {err:?}"
            );
        }
    }

    #[test]
    fn a_timeout_at_the_edges_of_a_protobuf_duration_is_read_exactly() {
        let config = run_config_of(
            &with_timeout(2, 999_999_999),
            Duration::from_secs(1),
            1 << 20,
        )
        .unwrap();
        assert_eq!(config.timeout, Duration::new(2, 999_999_999));
        let config = run_config_of(
            &with_timeout(0, 500_000_000),
            Duration::from_secs(1),
            1 << 20,
        )
        .unwrap();
        assert_eq!(config.timeout, Duration::from_millis(500));
    }
}
