//! The one place a run's or an admission's error becomes a gRPC status
//! (for every daemon), so the mapping is easy to read and to adjust as
//! the engine's error variants grow; and the metric label of each code.
use tonic::{Code, Status};

use super::admission::AdmissionError;
use crate::chain::Chain;
use crate::image::ImageErrorKind;
use crate::runner::RunError;

/// The gRPC code of an image error.
fn image_code(kind: ImageErrorKind) -> Code {
    match kind {
        ImageErrorKind::InvalidArgument => Code::InvalidArgument,
        ImageErrorKind::NotFound => Code::NotFound,
        ImageErrorKind::Unauthorized => Code::PermissionDenied,
        ImageErrorKind::Unavailable => Code::Unavailable,
        // Pull policy Never and not cached: the caller's own precondition.
        ImageErrorKind::NotPresent => Code::FailedPrecondition,
        ImageErrorKind::Corrupt => Code::DataLoss,
        // A property of the image the caller named, not of the daemon's load.
        ImageErrorKind::TooManyLayers => Code::InvalidArgument,
        // Past a bound the daemon sets (size, entries, header sizes).
        ImageErrorKind::TooLarge => Code::ResourceExhausted,
        ImageErrorKind::Timeout => Code::DeadlineExceeded,
        // The cache's disk is full: the daemon's shortage, which a caller
        // may retry after the collector made room.
        ImageErrorKind::NoSpace => Code::ResourceExhausted,
        ImageErrorKind::Extract | ImageErrorKind::Io => Code::Internal,
    }
}

/// The gRPC status a caller gets for a failed run, with a message a user can
/// act on: the error's [`Chain`] (each step and the cause beneath; it names
/// the image, the exit code and the tail of the function's stderr where
/// there is one).
pub(crate) fn status_of(err: &RunError) -> Status {
    let code = match err {
        RunError::Image(image) => image_code(image.kind()),
        RunError::InvalidConfig(_) | RunError::RootfsMode(_) => Code::InvalidArgument,
        RunError::Timeout(_) => Code::DeadlineExceeded,
        // The function ran and failed: Crossplane should not retry blindly.
        RunError::FunctionFailed { .. } => Code::Aborted,
        RunError::OutputTooLarge { .. } => Code::ResourceExhausted,
        RunError::MemoryLimitExceeded { .. } => Code::ResourceExhausted,
        RunError::LimitsUnavailable(_) | RunError::Runtime(_) => Code::FailedPrecondition,
        RunError::NotServing(_) => Code::Unavailable,
        RunError::Sandbox(_)
        | RunError::Rootfs(_)
        | RunError::RootfsPanicked(_)
        | RunError::RunDir { .. } => Code::Internal,
    };
    Status::new(code, Chain(err).to_string())
}

/// The status of a call that was not admitted.
pub(crate) fn admission_status(err: &AdmissionError) -> Status {
    match err {
        AdmissionError::QueueFull { .. } | AdmissionError::WouldMissDeadline { .. } => {
            Status::resource_exhausted(err.to_string())
        }
        AdmissionError::DeadlinePassed { .. } => Status::deadline_exceeded(err.to_string()),
        AdmissionError::Closed => Status::unavailable(err.to_string()),
    }
}

/// A metric label for a status code.
pub(crate) fn outcome_label(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn run_errors_map_to_their_codes() {
        let cases = [
            (
                RunError::InvalidConfig(crate::sandbox::SpecError::NothingToRun),
                Code::InvalidArgument,
            ),
            (
                RunError::Timeout(Duration::from_secs(1)),
                Code::DeadlineExceeded,
            ),
            (
                RunError::OutputTooLarge {
                    stream: "stdout",
                    limit: 10,
                },
                Code::ResourceExhausted,
            ),
            (
                RunError::LimitsUnavailable(crate::runner::LimitsUnavailable {
                    why: "no cgroup".into(),
                }),
                Code::FailedPrecondition,
            ),
            (
                RunError::RunDir {
                    path: "/cache/run".into(),
                    source: std::io::Error::other("read-only file system"),
                },
                Code::Internal,
            ),
        ];
        for (err, code) in cases {
            assert_eq!(status_of(&err).code(), code, "{err}");
        }
    }

    #[test]
    fn a_failed_function_carries_exit_code_and_stderr() {
        let status = status_of(&RunError::FunctionFailed {
            code: 3,
            stderr_tail: b"boom: no such thing\n".to_vec(),
        });
        assert_eq!(status.code(), Code::Aborted);
        assert!(
            status.message().contains("exit code 3"),
            "{}",
            status.message()
        );
        assert!(
            status.message().contains("boom: no such thing"),
            "{}",
            status.message()
        );
    }

    #[test]
    fn an_oom_kill_names_the_memory_limit() {
        let status = status_of(&RunError::MemoryLimitExceeded(
            crate::runner::MemoryLimitExceeded {
                limit_bytes: 32 << 20,
                code: 137,
                stderr_tail: Vec::new(),
            },
        ));
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(
            status.message().contains("memory limit of 32Mi"),
            "{}",
            status.message()
        );
    }

    #[test]
    fn image_kinds_map_to_their_codes() {
        assert_eq!(image_code(ImageErrorKind::NotFound), Code::NotFound);
        assert_eq!(
            image_code(ImageErrorKind::Unauthorized),
            Code::PermissionDenied
        );
        assert_eq!(image_code(ImageErrorKind::Unavailable), Code::Unavailable);
        assert_eq!(
            image_code(ImageErrorKind::InvalidArgument),
            Code::InvalidArgument
        );
        assert_eq!(
            image_code(ImageErrorKind::NotPresent),
            Code::FailedPrecondition
        );
        assert_eq!(image_code(ImageErrorKind::NoSpace), Code::ResourceExhausted);
    }
}
