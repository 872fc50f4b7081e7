//! The one place a run's error becomes a gRPC status, so the mapping is easy
//! to read and to adjust as the engine's error variants grow.
use tonic::Status;

use crate::runner::RunError;

/// The gRPC status a caller gets for a failed run, with a message a user can
/// act on.
pub fn status_of(err: &RunError) -> Status {
    match err {
        RunError::Image(image) => Status::unavailable(format!("cannot get the image: {image}")),
        RunError::NotBuilt => Status::unimplemented(err.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unbuilt_runner_is_unimplemented() {
        assert_eq!(
            status_of(&RunError::NotBuilt).code(),
            tonic::Code::Unimplemented
        );
    }
}
