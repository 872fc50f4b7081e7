//! The run stage of a render: a pipeline's steps called in order, [`v1`]
//! (`mode: Pipeline`, one `RunFunctionRequest` per step through the
//! Function's [`runtimes::Runtime`], a backend of the one call seam) and
//! [`alpha`] (`spec.functions[]`, one FunctionIO per step), over
//! [`runtimes`]: the real runner, a function server (started here, kept,
//! or already running) or the runner daemon. It takes what the read stage
//! made and never the plan.
pub(crate) mod alpha;
pub(crate) mod runtimes;
pub(crate) mod v1;
