//! `xfn render` refuses input files nested past the bound before it parses
//! them, naming the file, however deep they go up to the 4 MiB an input may
//! have on `xfn start`; the same render with sane files runs its pipeline.
use crate::support;

use std::time::Instant;

use support::render::*;
use support::*;

const FOUR_MIB: usize = 4 << 20;

#[test]
fn deep_files_are_refused_naming_them_and_sane_ones_render() {
    let fx = Fixture::new();
    fx.write(
        "functions.yaml",
        &exec_function("create", &fx.exec_image("create.sh")),
    );
    fx.write(
        "composition.yaml",
        &pipeline_composition("  - step: create-buckets\n    functionRef: {name: create}\n"),
    );
    fx.write("xr.yaml", XR);
    let deep_flow = format!("spec: {}", "[".repeat(FOUR_MIB - 6));
    let deep_block = format!("items:\n{}x", "- ".repeat((FOUR_MIB - 8) / 2));
    let deep_json = "{\"a\":".repeat(FOUR_MIB / 5);
    let cases: [(&str, &str, &[&str]); 3] = [
        (
            "deep-xr.yaml",
            &deep_flow,
            &["deep-xr.yaml", "composition.yaml", "functions.yaml"],
        ),
        (
            "required.yaml",
            &deep_block,
            &[
                "xr.yaml",
                "composition.yaml",
                "functions.yaml",
                "-e",
                "required.yaml",
            ],
        ),
        (
            "ctx.json",
            &deep_json,
            &[
                "xr.yaml",
                "composition.yaml",
                "functions.yaml",
                "--context-files",
                "k=ctx.json",
            ],
        ),
    ];
    for (file, text, args) in cases {
        fx.write(file, text);
        let started = Instant::now();
        let out = fx.render_unprivileged(args);
        let took = started.elapsed();
        let stderr = failure(&out);
        assert!(
            stderr.contains(file) && stderr.contains("nested more than 64 levels deep"),
            "{file}: {stderr}"
        );
        eprintln!("{file}: refused after {took:?}");
    }
    let out = fx.render_unprivileged(&["xr.yaml", "composition.yaml", "functions.yaml"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
