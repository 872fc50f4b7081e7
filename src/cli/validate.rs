//! `xfn validate EXTENSIONS RESOURCES`: resources (rendered output, or any
//! Kubernetes objects) against the schemas of CRDs and XRDs, with
//! `crossplane beta validate`'s arguments and report; exit 1 on any error.
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use crate::schema::read::{read_documents, DEFAULT_MAX_INPUT_BYTES};
use crate::schema::{label, Validator};

/// `xfn validate`'s flags. As Crossplane's CLI (kong) takes them: both
/// arguments are comma-separated lists, and a flag given twice is no error
/// (the last value wins; `--old-resources` adds up).
#[derive(Debug, Args)]
pub(crate) struct ValidateArgs {
    /// CRDs and XRDs: files, directories (read recursively) or `-` for
    /// stdin, comma-separated.
    #[arg(value_name = "EXTENSIONS", value_delimiter = ',', action = clap::ArgAction::Set, num_args = 1, required = true)]
    pub(crate) extensions: Vec<PathBuf>,
    /// The resources to validate: files, directories or `-` for stdin,
    /// comma-separated (e.g. `xfn render … | xfn validate crds/ -`).
    #[arg(value_name = "RESOURCES", value_delimiter = ',', action = clap::ArgAction::Set, num_args = 1, required = true)]
    pub(crate) resources: Vec<PathBuf>,
    /// A resource whose kind no CRD or XRD defines is an error, not a warning.
    #[arg(long, overrides_with = "error_on_missing_schemas")]
    pub(crate) error_on_missing_schemas: bool,
    /// Print only errors and warnings, not each valid resource.
    #[arg(long, overrides_with = "skip_success_results")]
    pub(crate) skip_success_results: bool,
    /// Also say which documents among the extensions were skipped (neither
    /// CRDs nor XRDs: a Composition, a Function…).
    #[arg(short, long, overrides_with = "verbose")]
    pub(crate) verbose: bool,
    /// The old versions of the resources (files or directories, repeatable):
    /// a resource with one (same apiVersion, kind, namespace and name) is
    /// validated as an update — its transition rules (`oldSelf`) run, and
    /// an unchanged invalid value is not an error (ratcheting).
    #[arg(long, value_name = "FILE")]
    pub(crate) old_resources: Vec<PathBuf>,
    /// The largest file (or stdin) read, a quantity (`8Mi`): a larger one is
    /// refused before it is parsed (parsed YAML takes ~40 times its size).
    #[arg(long, default_value = DEFAULT_MAX_INPUT_BYTES, value_parser = super::parse_nonzero_size, overrides_with = "max_input_bytes")]
    pub(crate) max_input_bytes: u64,
}

/// Runs `xfn validate`.
pub(crate) fn execute(args: ValidateArgs) -> anyhow::Result<ExitCode> {
    let stdin = Path::new("-");
    let stdins = args
        .extensions
        .iter()
        .chain(&args.resources)
        .filter(|p| p.as_path() == stdin)
        .count();
    if stdins > 1 {
        // Stdin is read once (cmd/crossplane/validate/cmd.go:109–110).
        anyhow::bail!("cannot use stdin for both extensions and resources");
    }
    let (mut extensions, mut extension_places) = (Vec::new(), Vec::new());
    for path in &args.extensions {
        let documents = read_documents(path, args.max_input_bytes)
            .with_context(|| format!("cannot read the CRDs and XRDs in {}", path.display()))?;
        for document in documents {
            extensions.push(document.object);
            extension_places.push(document.place);
        }
    }
    let mut documents = Vec::new();
    for path in &args.resources {
        documents.extend(
            read_documents(path, args.max_input_bytes)
                .with_context(|| format!("cannot read the resources in {}", path.display()))?,
        );
    }
    let labels: Vec<String> = documents
        .iter()
        .map(|d| label(&d.object, &d.place))
        .collect();
    let resources: Vec<serde_json::Value> = documents.into_iter().map(|d| d.object).collect();
    let mut old_resources = Vec::new();
    for path in &args.old_resources {
        let documents = read_documents(path, args.max_input_bytes)
            .with_context(|| format!("cannot read the old resources in {}", path.display()))?;
        old_resources.extend(documents.into_iter().map(|d| d.object));
    }
    let validator = Validator {
        error_on_missing_schemas: args.error_on_missing_schemas,
        old_resources,
    };
    let report = validator.check_placed(&extensions, &extension_places, &resources, &labels);
    let mut out = String::new();
    for error in &report.extension_errors {
        out.push_str(&format!("[x] {error}\n"));
    }
    if args.verbose && !report.skipped_extensions.is_empty() {
        out.push_str(&format!(
            "[!] skipped {} documents among the extensions that are neither CRDs nor XRDs: {}\n",
            report.skipped_extensions.len(),
            report.skipped_extensions.join(", ")
        ));
    }
    let (mut missing, mut failed) = (0, 0);
    for resource in &report.resources {
        for note in &resource.notes {
            out.push_str(&format!("[!] {}: {note}\n", resource.resource));
        }
        if resource.missing_schema {
            missing += 1;
            out.push_str(&format!(
                "[!] could not find a CRD or XRD for {}\n",
                resource.resource
            ));
        } else if resource.findings.is_empty() {
            if !args.skip_success_results {
                out.push_str(&format!(
                    "[✓] {} validated successfully\n",
                    resource.resource
                ));
            }
        } else {
            failed += 1;
            for finding in &resource.findings {
                out.push_str(&format!("[x] {finding}\n"));
            }
        }
    }
    let total = report.resources.len();
    out.push_str(&format!(
        "Total {total} resources: {missing} missing schemas, {} success cases, {failed} failure cases\n",
        total - missing - failed
    ));
    print!("{out}");
    let failing = !report.extension_errors.is_empty()
        || failed > 0
        || (args.error_on_missing_schemas && missing > 0);
    Ok(if failing {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
