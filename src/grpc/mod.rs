//! The gRPC layer under both gRPC front ends: `xfn start` ([`crate::server`],
//! Crossplane's alpha `ContainerizedFunctionRunnerService` on an abstract
//! socket behind the gatekeeper) and `xfn adapt` ([`crate::adaptor`], the
//! v1/v1beta1 `FunctionRunnerService` on TCP). A front end brings its
//! service and its listener; everything between the socket and the service,
//! and between the service and the run engine, is here.
//!
//! Why one layer: the two front ends face the same caller (Crossplane,
//! calling from many reconcilers at once, with deadlines, retrying every
//! error with backoff) in the same place (a pod that is SIGTERMed on every
//! rollout). A second copy of admission, draining or status mapping is a
//! second set of defaults to get wrong — the adaptor's own copy had an
//! unbounded queue and no drain.
//!
//! # Layout
//!
//! ```text
//! daemon    a runner behind all of the below: what `xfn start` and
//!           `xfn adapt` build in a few lines
//! listen    bind a Unix (abstract or path) or TCP address; accept TCP
//! serve     tonic server: the front end's services + health + reflection,
//!           deadline stamping, mTLS when given; drain on SIGTERM/SIGINT
//! sni       TLS with the certificate chosen by the name dialled (`xfn host`)
//! authority a Unix client's `:authority` that h2 would refuse, read as localhost
//! connections  each connection's bounds: handshake and idle timeouts, a
//!           cap where the longest idle connection makes room
//! deadline  grpc-timeout counted from the request's arrival
//! calls     one call: admission ─► run under the slot ─► outcome metrics
//! function_runner  the trait a service runs functions through (and its layers wrap)
//! admission FIFO run slots, queue caps in calls and bytes, caller deadline
//! wait      recent run times and the least wait they predict
//! status    run and admission errors ─► gRPC status; metric labels
//! metrics   Prometheus registry and the /metrics endpoint
//! refusals  callers a front end refused, counted across its processes
//! ```
//!
//! # Invariants
//!
//! - A call waits for a run slot in arrival order (tokio's semaphore is
//!   FIFO). It is refused with `RESOURCE_EXHAUSTED` only when the queue is
//!   at a cap (`--max-queued-runs` calls, default 1024; `--max-queued-bytes`
//!   of waiting input, default 256 MiB), or when its deadline cannot be met
//!   (next point). Otherwise it waits, and time waited counts against its
//!   deadline: still queued when the deadline passes, it is answered
//!   `DEADLINE_EXCEEDED` and never runs; admitted, its run gets only what
//!   is left. A caller that goes away leaves the queue at once.
//! - **An impossible wait is refused up front.** A call that must queue
//!   behind `q` waiting calls for `s` slots needs at least `floor(q / s)`
//!   whole runs to finish on some slot before its own starts (the runs now
//!   in flight may be nearly done, so they count for nothing). With `t` the
//!   median time a slot was held over the last 64 runs, when
//!   `floor(q / s) × t` exceeds the time left before the caller's deadline,
//!   the call is answered `RESOURCE_EXHAUSTED` at once, naming the queue, the
//!   estimate and the deadline, rather than queued to time out. The rule
//!   errs towards serving: it ignores the runs in flight and the call's own
//!   run, the median is not moved by a few slow (cold-pull, timed-out) runs,
//!   a run cut short lowers it, and it refuses nothing before 8 runs were
//!   seen or when the caller set no deadline.
//! - Every admitted run ends when the drain's grace period does: on
//!   SIGTERM/SIGINT the listener stops accepting and health turns
//!   `NOT_SERVING`; calls in flight and queued get `--grace-period` (25 s)
//!   to finish; then the runs still going are cancelled (their callers get
//!   `UNAVAILABLE`) and the process exits 0.
//! - Gauges (`xfn_runs_in_flight`, `xfn_runs_queued`) are held by guards, so
//!   a call whose future is dropped at any point leaves them right; such a
//!   call is counted with outcome `cancelled`.
//! - Errors become statuses in one place ([`status`]), so both front ends
//!   answer the same failure with the same code.
pub(crate) mod admission;
pub(crate) mod authority;
pub(crate) mod calls;
pub(crate) mod connections;
pub(crate) mod daemon;
pub(crate) mod deadline;
pub(crate) mod function_runner;
pub(crate) mod listen;
pub(crate) mod metrics;
pub(crate) mod refusals;
pub(crate) mod serve;
pub(crate) mod sni;
pub(crate) mod status;
pub(crate) mod wait;

pub(crate) use calls::Calls;
pub(crate) use function_runner::FunctionRunner;
pub(crate) use status::status_of;
