//! `xfn render XR COMPOSITION [FUNCTIONS]`: run a Composition's pipeline
//! locally, like `crossplane render` but with no Docker engine. The work is
//! done by `xfn::compose`; this module only maps flags onto it.
use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use serde_json::Value;

use xfn::compose::alpha::run_alpha;
use xfn::compose::alpha::ContainerConfig;
use xfn::compose::inputs::{
    observed_by_name, read_functions, read_objects, Composite, Composition, Pipeline, RuntimeKind,
};
use xfn::compose::output::{objects, to_yaml_stream, OutputOptions};
use xfn::compose::runtimes::{caller_for, daemon_answers, ContainerDefaults, ContainerSteps};
use xfn::compose::v1::{FunctionCaller, V1Pipeline};
use xfn::compose::Observed;
use xfn::image::PullPolicy;
use xfn::runner::Runner;

use super::run::{parse_duration, PullPolicyArg};
use super::UsernsArgs;

/// Flags of `xfn render`, as `crossplane render`'s.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// The composite resource (XR), a YAML file.
    pub composite_resource: PathBuf,
    /// The Composition, a YAML file.
    pub composition: PathBuf,
    /// The Functions (`pkg.crossplane.io` Function objects), a YAML file or a
    /// directory of them; not needed for alpha (`spec.functions`) Compositions.
    pub functions: Option<PathBuf>,
    /// Observed composed resources, a YAML stream or a directory.
    #[arg(short = 'o', long)]
    pub observed_resources: Option<PathBuf>,
    /// Resources functions may require, a YAML stream or a directory.
    #[arg(short = 'e', long, alias = "extra-resources")]
    pub required_resources: Option<PathBuf>,
    /// Context for the first step: `key=file` (JSON or YAML), repeatable or comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub context_files: Vec<String>,
    /// Context for the first step: `key=json`, repeatable.
    #[arg(long)]
    pub context_values: Vec<String>,
    /// Print the results functions returned (also `-r` after `render`).
    #[arg(long = "include-function-results")]
    pub include_function_results: bool,
    /// Print the whole XR, not only its status.
    #[arg(short = 'x', long)]
    pub include_full_xr: bool,
    /// Print the context after the last step.
    #[arg(short = 'c', long)]
    pub include_context: bool,
    /// Secrets steps take credentials from, a YAML stream or a directory.
    #[arg(long)]
    pub function_credentials: Option<PathBuf>,
    /// Give up on the whole render after this long.
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Directory of the image cache (and per-run state).
    #[arg(long, env = "XFN_CACHE_DIR", default_value_os_t = super::default_cache_dir())]
    pub cache_dir: PathBuf,
    /// Registries reached over plain HTTP (loopback registries always are).
    #[arg(long = "insecure-registry")]
    pub insecure_registries: Vec<String>,
    /// A PEM bundle of CAs trusted besides the system roots.
    #[arg(long, env = "CA_BUNDLE_PATH")]
    pub ca_bundle_path: Option<PathBuf>,
    /// User namespace flags.
    #[command(flatten)]
    pub userns: UsernsArgs,
    /// Run engine flags.
    #[command(flatten)]
    pub runner: super::RunnerArgs,
    /// [`RenderArgs::needs_containers`], decided once.
    #[arg(skip)]
    pub containers: std::sync::OnceLock<bool>,
    /// When to pull the images of Exec Functions that set no pull policy
    /// (alpha steps use their own `imagePullPolicy`).
    #[arg(long, value_enum, default_value = "IfNotPresent")]
    pub image_pull_policy: PullPolicyArg,
}

impl RenderArgs {
    /// The store flags in the shape the namespace entry takes.
    pub fn store_args(&self) -> super::StoreArgs {
        super::StoreArgs {
            cache_dir: self.cache_dir.clone(),
            insecure_registries: self.insecure_registries.clone(),
            ca_bundle_path: self.ca_bundle_path.clone(),
        }
    }
}

impl RenderArgs {
    /// Whether this render runs containers in-process (Functions with the
    /// Exec runtime, or alpha steps whose runner daemon does not answer), and
    /// so needs xfn's user namespace. A render of Development Functions only
    /// does not: it works wherever a namespace cannot be entered. Nor does
    /// one whose alpha steps all go to a daemon, which must then see xfn's
    /// own uid, not the one a namespace would map it to. Unreadable inputs
    /// answer false; the render itself then reports them, naming the file.
    /// Decided once, before the async runtime starts.
    pub fn needs_containers(&self) -> bool {
        *self.containers.get_or_init(|| self.decide_containers())
    }

    fn decide_containers(&self) -> bool {
        let Ok(xr) = Composite::read(&self.composite_resource) else {
            return false;
        };
        let Ok(composition) = Composition::read(&self.composition, &xr) else {
            return false;
        };
        let steps = match composition.pipeline {
            Pipeline::Alpha(functions) => {
                return functions.iter().any(|f| {
                    let spec = f.container.clone().unwrap_or_default();
                    ContainerConfig::from_spec(&spec).is_ok_and(|c| !daemon_answers(&c.endpoint))
                })
            }
            Pipeline::V1(steps) => steps,
        };
        let Some(Ok(functions)) = self.functions.as_deref().map(read_functions) else {
            return false;
        };
        functions.iter().any(|f| {
            runs_containers(&f.runtime) && steps.iter().any(|s| s.function_ref.name == f.name)
        })
    }
}

/// Whether Functions of `runtime` run containers (in xfn's user namespace).
fn runs_containers(runtime: &RuntimeKind) -> bool {
    matches!(runtime, RuntimeKind::Exec | RuntimeKind::Docker)
}

/// `-r` means `--include-function-results` after `render`, as in
/// `crossplane render`, but it is xfn's global `--registry` everywhere else;
/// clap cannot have both, so it is rewritten before parsing.
pub fn rewrite_short_flags(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut seen_render = false;
    args.into_iter()
        .map(|arg| {
            if seen_render && arg == "-r" {
                return OsString::from("--include-function-results");
            }
            if arg == "render" {
                seen_render = true;
            }
            arg
        })
        .collect()
}

/// Runs `xfn render`.
pub async fn execute(args: RenderArgs, global: &super::Global) -> anyhow::Result<ExitCode> {
    let timeout = args.timeout;
    let stream = tokio::time::timeout(timeout, render(&args, global))
        .await
        .map_err(|_| {
            anyhow::anyhow!("the render did not finish within {timeout:?} (--timeout)")
        })??;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(stream.as_bytes())?;
    stdout.flush()?;
    Ok(ExitCode::SUCCESS)
}

async fn render(args: &RenderArgs, global: &super::Global) -> anyhow::Result<String> {
    let xr = Composite::read(&args.composite_resource)?;
    let composition = Composition::read(&args.composition, &xr)?;
    let observed_resources = match &args.observed_resources {
        Some(path) => observed_by_name(path, read_objects(path)?)?,
        None => Vec::new(),
    };
    let observed = Observed {
        composite: xr.object.clone(),
        resources: observed_resources,
    };
    let defaults = ContainerDefaults {
        default_registry: global.registry.clone(),
        timeout: args.timeout,
        pull_policy: match args.image_pull_policy {
            PullPolicyArg::IfNotPresent => PullPolicy::IfNotPresent,
            PullPolicyArg::Always => PullPolicy::Always,
            PullPolicyArg::Never => PullPolicy::Never,
        },
    };
    let outcome = match &composition.pipeline {
        Pipeline::V1(steps) => {
            let Some(functions_path) = &args.functions else {
                bail!(
                    "{}: a mode Pipeline Composition needs FUNCTIONS (a file or directory of Functions)",
                    args.composition.display()
                );
            };
            let functions = read_functions(functions_path)?;
            let needs_runner = functions.iter().any(|f| runs_containers(&f.runtime));
            let runner = if needs_runner {
                Some(make_runner(args, global)?)
            } else {
                None
            };
            let mut callers: HashMap<String, Arc<dyn FunctionCaller>> = HashMap::new();
            // Only the Functions a step uses must be runnable.
            for function in &functions {
                if steps.iter().any(|s| s.function_ref.name == function.name) {
                    callers.insert(
                        function.name.clone(),
                        caller_for(function, runner.as_ref(), &defaults)?,
                    );
                } else if !callers.contains_key(&function.name) {
                    tracing::debug!(function = %function.name, "not used by any step");
                }
            }
            let required = match &args.required_resources {
                Some(path) => read_objects(path)?,
                None => Vec::new(),
            };
            let credentials = match &args.function_credentials {
                Some(path) => read_objects(path)?,
                None => Vec::new(),
            };
            let pipeline = V1Pipeline {
                steps,
                callers: &callers,
                observed: &observed,
                required: &required,
                credentials: &credentials,
                context: initial_context(args)?,
            };
            // Servers (Docker runtime) start all at once, pulls included,
            // rather than one per step as the pipeline reaches them; they
            // are stopped on every path, the render's errors included.
            pipeline.check_function_refs()?;
            let started = futures::future::try_join_all(callers.values().map(|c| c.start())).await;
            let outcome = match started {
                Ok(_) => pipeline.run().await,
                Err(err) => Err(err),
            };
            futures::future::join_all(callers.values().map(|c| c.stop())).await;
            outcome?
        }
        Pipeline::Alpha(functions) => {
            let runner = if args.needs_containers() {
                Some(make_runner(args, global)?)
            } else {
                None
            };
            let steps = ContainerSteps { runner, defaults };
            run_alpha(functions, &steps, &observed).await?
        }
    };
    let objects = objects(
        &observed,
        &outcome,
        OutputOptions {
            include_full_xr: args.include_full_xr,
            include_results: args.include_function_results,
            include_context: args.include_context,
        },
    );
    Ok(to_yaml_stream(&objects)?)
}

fn make_runner(args: &RenderArgs, global: &super::Global) -> anyhow::Result<Arc<Runner>> {
    let store = args.store_args().open_store(&global.registry)?;
    let runner = Runner::new(store, args.runner.options())?;
    Ok(Arc::new(runner))
}

/// The context from `--context-files` and `--context-values`.
fn initial_context(args: &RenderArgs) -> anyhow::Result<Option<Value>> {
    if args.context_files.is_empty() && args.context_values.is_empty() {
        return Ok(None);
    }
    let mut fields = serde_json::Map::new();
    for entry in &args.context_files {
        let (key, file) = entry
            .split_once('=')
            .with_context(|| format!("--context-files {entry:?}: expected key=file"))?;
        let text = std::fs::read_to_string(Path::new(file))
            .with_context(|| format!("--context-files: cannot read {file}"))?;
        let value: Value = yaml_serde::from_str(&text)
            .with_context(|| format!("--context-files: {file} is not JSON or YAML"))?;
        fields.insert(key.to_string(), value);
    }
    for entry in &args.context_values {
        let (key, json) = entry
            .split_once('=')
            .with_context(|| format!("--context-values {entry:?}: expected key=json"))?;
        let value: Value = serde_json::from_str(json)
            .with_context(|| format!("--context-values {key}: not JSON: {json}"))?;
        fields.insert(key.to_string(), value);
    }
    Ok(Some(Value::Object(fields)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_r_after_render_means_include_results() {
        let args: Vec<OsString> = ["xfn", "-r", "reg", "render", "-r", "a"]
            .into_iter()
            .map(OsString::from)
            .collect();
        let rewritten = rewrite_short_flags(args);
        assert_eq!(rewritten[1], "-r");
        assert_eq!(rewritten[4], "--include-function-results");
    }
}
