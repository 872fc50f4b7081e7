//! `xfn render` refuses input files nested past the bound, or whose aliases
//! expand past it, before it parses them, naming the file or flag, however
//! deep they go up to the 4 MiB an input may have on `xfn start`; the same
//! render with sane files runs its pipeline. An alpha function's output
//! meets the same bound.

use std::time::Instant;

use xfn_testkit::render::*;
use xfn_testkit::*;

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

/// Runs `xfn render ARGS` in `fx` as the unprivileged user and measures it.
fn measured_render(fx: &Fixture, args: &[&str]) -> child::Measured {
    child::measure(
        &mut fx.render_unprivileged_command(args),
        std::path::Path::new(env!("CARGO_BIN_EXE_xfn")),
    )
}

/// A Kubernetes object of `kind` carrying `bomb` in a field of its own.
fn object_with(kind: &str, bomb: &str) -> String {
    format!("apiVersion: v1\nkind: {kind}\nmetadata: {{name: bomb, namespace: default}}\nbomb: {bomb}\n")
}

#[test]
fn alias_bombs_in_every_file_and_flag_render_reads_are_refused_naming_them() {
    let fx = Fixture::new();
    let functions = exec_function("create", &fx.exec_image("create.sh"));
    let composition =
        pipeline_composition("  - step: create-buckets\n    functionRef: {name: create}\n");
    fx.write("functions.yaml", &functions);
    fx.write("composition.yaml", &composition);
    fx.write("xr.yaml", XR);
    let base = ["xr.yaml", "composition.yaml", "functions.yaml"];
    // The same render with sane files: its peak is the render's own.
    let sane = measured_render(&fx, &base);
    assert!(sane.status.success(), "{}", sane.stderr);
    eprintln!("sane render: {}", sane.cost());
    let mut results = Vec::new();
    for (name, bomb) in alias_bombs() {
        let with = |text: &str| format!("{text}bomb: {bomb}\n");
        // (the file or flag the error must name, what it holds, the args)
        let cases: Vec<(&str, String, Vec<String>)> = vec![
            ("bomb-xr.yaml", with(XR), vec![]),
            ("bomb-composition.yaml", with(&composition), vec![]),
            ("bomb-functions.yaml", with(&functions), vec![]),
            (
                "bomb-observed.yaml",
                object_with("ConfigMap", &bomb),
                vec!["-o".into()],
            ),
            (
                "bomb-required.yaml",
                object_with("ConfigMap", &bomb),
                vec!["-e".into()],
            ),
            (
                "bomb-extra.yaml",
                object_with("ConfigMap", &bomb),
                vec!["--extra-resources".into()],
            ),
            (
                "bomb-credentials.yaml",
                object_with("Secret", &bomb),
                vec!["--function-credentials".into()],
            ),
            (
                "bomb-ctx.yaml",
                bomb.clone(),
                vec!["--context-files".into()],
            ),
            (
                "--context-values",
                String::new(),
                vec!["--context-values".into()],
            ),
        ];
        for (file, text, flag) in cases {
            // One argument holds at most 128 KiB (MAX_ARG_STRLEN): the
            // 500 KB list cannot be a flag's value.
            if file == "--context-values" && bomb.len() > 128 << 10 {
                continue;
            }
            let mut args: Vec<String> = base.iter().map(|a| a.to_string()).collect();
            match (file, flag.first().map(String::as_str)) {
                ("bomb-xr.yaml", _) => args[0] = file.into(),
                ("bomb-composition.yaml", _) => args[1] = file.into(),
                ("bomb-functions.yaml", _) => args[2] = file.into(),
                (_, Some("--context-files")) => args.extend([flag[0].clone(), format!("k={file}")]),
                (_, Some("--context-values")) => {
                    args.extend([flag[0].clone(), format!("k={bomb}")])
                }
                (_, Some(flag)) => args.extend([flag.to_string(), file.to_string()]),
                _ => unreachable!(),
            }
            if !text.is_empty() {
                fx.write(file, &text);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = measured_render(&fx, &args);
            eprintln!("{name} in {file}: {}, {}", out.cost(), out.stderr.trim());
            results.push((format!("{name} in {file}"), file, out));
        }
    }
    for (case, file, out) in results {
        out.assert_refused(
            &case,
            "its aliases expand too far",
            sane.peak_rss + (32 << 20),
        );
        assert!(out.stderr.contains(file), "{case}: {}", out.stderr);
    }
}

#[test]
fn an_alpha_function_answering_with_an_alias_bomb_fails_its_step_without_the_copies() {
    let fx = Fixture::new();
    let image = fx.alpha_image("aliases.sh");
    fx.write(
        "composition.yaml",
        &format!(
            "apiVersion: apiextensions.crossplane.io/v1
kind: Composition
metadata:
  name: buckets-alpha
spec:
  compositeTypeRef:
    apiVersion: example.org/v1
    kind: XBucket
  functions:
  - name: bomb
    type: Container
    container:
      image: {image}
      timeout: 30s
"
        ),
    );
    fx.write("xr.yaml", XR);
    let out = measured_render(&fx, &["xr.yaml", "composition.yaml"]);
    eprintln!("alpha output bomb: {}, {}", out.cost(), out.stderr.trim());
    out.assert_refused("alpha output", "its aliases expand too far", 96 << 20);
    assert!(out.stderr.contains("\"bomb\""), "{}", out.stderr);
}
