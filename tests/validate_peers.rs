//! `xfn validate` side by side with `crossplane resource validate` (the
//! CLI v2.5.0 that scripts/peers.sh builds; `crossplane beta validate`
//! before 2.5) on the same files: every set of the corpus (corpus.rs), with
//! and without `--error-on-missing-schemas` — the same verdict for every
//! resource and the same exit code. A missing CLI fails the test, naming
//! scripts/peers.sh. The differences that remain are in docs/validate.md,
//! each with the crossplane/cli source line it follows.
use xfn_testkit::peers;

use super::validate_corpus::{sets, xfn_validate};

#[test]
fn xfn_validate_gives_crossplane_resource_validates_verdict_and_exit_code_on_the_corpus() {
    let mut differences = Vec::new();
    let mut resources = 0;
    for (extensions, cases) in sets() {
        for flags in [&[][..], &["--error-on-missing-schemas"][..]] {
            let what = format!("{} {} {flags:?}", extensions.display(), cases.display());
            let (cli_code, cli) =
                peers::crossplane_validate(&extensions.display().to_string(), &cases, flags);
            let (code, stdout, xfn) = xfn_validate(&extensions, &cases, flags);
            assert!(!cli.is_empty(), "{what}: the CLI judged nothing");
            if cli_code != code {
                differences.push(format!("{what}: exit {cli_code:?} (CLI) vs {code:?} (xfn)"));
            }
            if cli.len() != xfn.len() {
                differences.push(format!(
                    "{what}: {} resources (CLI) vs {} (xfn)\n{stdout}",
                    cli.len(),
                    xfn.len()
                ));
                continue;
            }
            resources += cli.len();
            for (c, x) in cli.iter().zip(&xfn) {
                if c != x {
                    differences.push(format!("{what}: {c:?} (CLI) vs {x:?} (xfn)"));
                }
            }
        }
    }
    assert!(resources > 700, "only {resources} verdicts compared");
    assert!(differences.is_empty(), "{}", differences.join("\n"));
}

#[test]
fn a_missing_crossplane_cli_fails_naming_the_script_that_builds_it() {
    let panic = std::panic::catch_unwind(|| peers::binary("crossplane-nobody-built"))
        .expect_err("a missing peer must panic");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("scripts/peers.sh"), "{message}");
}
