//! The run stage of a render: a pipeline's steps called in order, [`v1`]
//! (`mode: Pipeline`, one `RunFunctionRequest` per step through a
//! [`v1::FunctionCaller`]) and [`alpha`] (`spec.functions[]`, one FunctionIO
//! per step), over [`runtimes`]: the real runner, a running function server
//! or the runner daemon. It takes what the read stage made and never the
//! plan.
pub(crate) mod alpha;
pub(crate) mod runtimes;
pub(crate) mod v1;
