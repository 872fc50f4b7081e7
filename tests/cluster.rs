//! Test binary `cluster`: `xfn host` as the runtime of every Function of a
//! real Crossplane control plane (scripts/cluster.sh: etcd, kube-apiserver,
//! a garbage-collecting controller manager, Crossplane core v2 with
//! `--package-runtime=Function=External`), driven as an operator would:
//! `kubectl apply` of Functions, an XRD, a Composition and XRs, then what
//! core and the API server show.
//!
//! The cases share one cluster (bringing one up takes most of a minute), so
//! they are one test that runs them in order and reports each: a case that
//! fails is named and the rest still run; the test fails if any did. They
//! depend on each other as an operator's day does (the Functions installed
//! first are the ones later cases upgrade).
//!
//! Needs: scripts/cluster.sh's binaries (`scripts/cluster.sh build`; a
//! missing one fails the test naming it), scripts/peers.sh's
//! function-patch-and-transform and `crossplane` CLI (its package is a
//! real xpkg: `crossplane xpkg build`, `crossplane xpkg push`), crun,
//! skopeo, docker-registry, busybox-static, openssl. Run alone: `cargo
//! test --test cluster` (its xfn host replicas listen on 127.0.45.N:9443;
//! `XFN_CLUSTER_NET=127.X.Y` moves them beside another cluster).
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use serde_json::Value;
use xfn_testkit::cluster::{condition, conditions, function_server_package, Cluster, NAMESPACE};
use xfn_testkit::peers::PeerFunction;
use xfn_testkit::{ImageBuilder, Layer, Registry};

/// How long core and xfn get to converge after a change: a bound on a wait
/// that would otherwise never end (a pull, a reconcile, a poll of 10 s),
/// generous for this loaded 2-CPU machine, not a timing claim.
const PATIENCE: Duration = Duration::from_secs(240);
const PT: &str = "function-patch-and-transform";
const TEST_FN: &str = "function-xfn-test";

/// What the cases share: the cluster, the registry and the packages in it.
struct Day {
    cluster: Cluster,
    registry: Registry,
    pt: String,
}

#[test]
fn crossplane_core_composes_through_xfn_host_as_the_runtime_of_every_function() {
    let registry = Registry::start();
    let pt = PeerFunction::get(PT).xpkg(&registry, &format!("{PT}:v0.10.7"));
    let started = Instant::now();
    let cluster = Cluster::up();
    eprintln!("cluster up in {:?}", started.elapsed());
    let day = Day {
        cluster,
        registry,
        pt,
    };
    type Case = fn(&Day);
    let cases: [(&str, Case); 5] = [
        (
            "two_functions_compose_an_xr_to_ready_with_no_deployment_or_pod",
            two_functions_compose_an_xr_to_ready_with_no_deployment_or_pod,
        ),
        (
            "each_active_revision_has_its_service_certificate_endpoint_and_health",
            each_active_revision_has_its_service_certificate_endpoint_and_health,
        ),
        (
            "an_upgrade_is_served_from_the_new_revision_and_a_deleted_function_is_unhosted",
            an_upgrade_is_served_from_the_new_revision_and_a_deleted_function_is_unhosted,
        ),
        (
            "a_restarted_host_loses_no_xr_and_two_replicas_write_the_same_objects",
            a_restarted_host_loses_no_xr_and_two_replicas_write_the_same_objects,
        ),
        (
            "a_bad_package_says_why_and_the_other_functions_keep_composing",
            a_bad_package_says_why_and_the_other_functions_keep_composing,
        ),
    ];
    let mut failed = Vec::new();
    for (name, case) in cases {
        let started = Instant::now();
        eprintln!("case {name}: running");
        match std::panic::catch_unwind(AssertUnwindSafe(|| case(&day))) {
            Ok(()) => eprintln!("case {name}: ok in {:?}", started.elapsed()),
            Err(_) => {
                eprintln!("case {name}: FAILED after {:?}", started.elapsed());
                failed.push(name);
            }
        }
    }
    assert!(failed.is_empty(), "failed cases: {failed:?}");
}

fn function(name: &str, package: &str) -> String {
    format!(
        "apiVersion: pkg.crossplane.io/v1\nkind: Function\nmetadata:\n  name: {name}\nspec:\n  package: {package}\n"
    )
}

/// The XRD and Composition: patch-and-transform composes a ConfigMap from
/// the XR's `spec.region`; the test function labels it, reads its own
/// package's `FN_VERSION` into the XR's status (through the context), and
/// marks the ConfigMap ready.
const XRD_AND_COMPOSITION: &str = r#"
apiVersion: apiextensions.crossplane.io/v2
kind: CompositeResourceDefinition
metadata:
  name: xbuckets.example.xfn.io
spec:
  group: example.xfn.io
  names: {kind: XBucket, plural: xbuckets}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      referenceable: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                region: {type: string}
            status:
              type: object
              properties:
                fromContext: {type: string}
---
apiVersion: apiextensions.crossplane.io/v1
kind: Composition
metadata:
  name: xbuckets
spec:
  compositeTypeRef: {apiVersion: example.xfn.io/v1, kind: XBucket}
  mode: Pipeline
  pipeline:
    - step: patch-and-transform
      functionRef: {name: function-patch-and-transform}
      input:
        apiVersion: pt.fn.crossplane.io/v1beta1
        kind: Resources
        resources:
          - name: bucket
            base:
              apiVersion: v1
              kind: ConfigMap
              data: {made-by: function-patch-and-transform}
            patches:
              - type: FromCompositeFieldPath
                fromFieldPath: spec.region
                toFieldPath: data.region
    - step: label
      functionRef: {name: function-xfn-test}
      input: {apiVersion: xfn.test/v1alpha1, kind: Input, action: label, labels: {served-by: xfn-host}}
    - step: version-to-context
      functionRef: {name: function-xfn-test}
      input: {apiVersion: xfn.test/v1alpha1, kind: Input, action: env, name: FN_VERSION}
    - step: version-to-status
      functionRef: {name: function-xfn-test}
      input: {apiVersion: xfn.test/v1alpha1, kind: Input, action: context, read: env}
    - step: ready
      functionRef: {name: function-xfn-test}
      input: {apiVersion: xfn.test/v1alpha1, kind: Input, action: ready}
"#;

fn xr(name: &str, region: &str) -> String {
    format!(
        "apiVersion: example.xfn.io/v1\nkind: XBucket\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  region: {region}\n"
    )
}

/// Waits for XR `name` to be Ready with its ConfigMap composed by both
/// functions, the test function at `version`; returns the ConfigMap.
fn wait_composed(day: &Day, name: &str, region: &str, version: &str) -> Value {
    let cluster = &day.cluster;
    cluster.wait(
        &format!("XR {name} Ready from {TEST_FN} {version}"),
        PATIENCE,
        || {
            let xr = cluster
                .get("xbuckets.example.xfn.io", name, Some("default"))
                .ok_or("no XR")?;
            if condition(&xr, "Ready").as_deref() != Some("True")
                || xr["status"]["fromContext"] != version
            {
                return Err(format!("{} {}", conditions(&xr), xr["status"]));
            }
            let composed = cluster.list(
                "configmaps",
                Some(&format!("crossplane.io/composite={name}")),
                Some("default"),
            );
            match composed.as_slice() {
                [cm] if cm["data"]["region"] == region => Ok(cm.clone()),
                other => Err(format!("composed: {other:?}")),
            }
        },
    )
}

fn wait_installed(day: &Day, name: &str) -> Value {
    day.cluster
        .wait(&format!("Function {name} installed"), PATIENCE, || {
            let f = day
                .cluster
                .get("functions", name, None)
                .ok_or("no Function")?;
            match condition(&f, "Installed").as_deref() {
                Some("True") => Ok(f),
                _ => Err(conditions(&f)),
            }
        })
}

fn two_functions_compose_an_xr_to_ready_with_no_deployment_or_pod(day: &Day) {
    let cluster = &day.cluster;
    let test_v1 = function_server_package(&day.registry, TEST_FN, "v1");
    cluster.apply(&(function(PT, &day.pt) + "---\n" + &function(TEST_FN, &test_v1)));
    wait_installed(day, PT);
    wait_installed(day, TEST_FN);
    cluster.apply(XRD_AND_COMPOSITION);
    cluster.wait("the XRD established", PATIENCE, || {
        let xrd = cluster
            .get(
                "compositeresourcedefinitions",
                "xbuckets.example.xfn.io",
                None,
            )
            .ok_or("no XRD")?;
        (condition(&xrd, "Established").as_deref() == Some("True"))
            .then_some(())
            .ok_or_else(|| conditions(&xrd))
    });
    cluster.apply(&xr("one", "eu-north-1"));
    let cm = wait_composed(day, "one", "eu-north-1", "v1");
    assert_eq!(cm["data"]["made-by"], PT, "{cm}");
    assert_eq!(cm["metadata"]["labels"]["served-by"], "xfn-host", "{cm}");
    // With Function=External, core made no Deployment, and nothing here
    // could have made a pod.
    assert_eq!(cluster.list("deployments", None, None), Vec::<Value>::new());
    assert_eq!(cluster.list("pods", None, None), Vec::<Value>::new());
    assert_eq!(
        cluster.list("serviceaccounts", Some("pkg.crossplane.io/function"), None),
        Vec::<Value>::new()
    );
}

fn active_revision(day: &Day, function: &str) -> Result<Value, String> {
    let revisions = day.cluster.list(
        "functionrevisions",
        Some(&format!("pkg.crossplane.io/package={function}")),
        None,
    );
    let mut active: Vec<Value> = revisions
        .into_iter()
        .filter(|r| r["spec"]["desiredState"] == "Active")
        .collect();
    match active.len() {
        1 => Ok(active.remove(0)),
        n => Err(format!("{n} active revisions of {function}")),
    }
}

fn each_active_revision_has_its_service_certificate_endpoint_and_health(day: &Day) {
    let cluster = &day.cluster;
    let ca = tempfile::tempdir().unwrap();
    let root = cluster
        .get("secrets", "crossplane-root-ca", Some(NAMESPACE))
        .unwrap();
    std::fs::write(ca.path().join("ca.crt"), secret_value(&root, "tls.crt")).unwrap();
    for name in [PT, TEST_FN] {
        let revision = active_revision(day, name).unwrap();
        // PR #6567: with an External runtime core copies no runtimeConfigRef
        // or TLS secret names to the revision; xfn owns them.
        assert!(
            revision["spec"]["tlsServerSecretName"].is_null(),
            "{revision}"
        );
        // (The CRD's default names `default`, not the Function's.)
        assert_eq!(
            revision["spec"]["runtimeConfigRef"]["name"], "default",
            "{revision}"
        );
        assert_eq!(
            revision["status"]["endpoint"],
            format!("dns:///{name}.{NAMESPACE}:9443"),
            "{revision}"
        );
        let function = cluster.wait(&format!("Function {name} Healthy"), PATIENCE, || {
            let f = cluster.get("functions", name, None).ok_or("no Function")?;
            (condition(&f, "Healthy").as_deref() == Some("True"))
                .then_some(f.clone())
                .ok_or_else(|| conditions(&f))
        });
        let revision = active_revision(day, name).unwrap();
        for kind in ["RevisionHealthy", "RuntimeHealthy"] {
            assert_eq!(
                condition(&revision, kind).as_deref(),
                Some("True"),
                "{}",
                conditions(&revision)
            );
        }
        let service = cluster
            .get("services", name, Some(NAMESPACE))
            .expect("the Service");
        assert_eq!(service["spec"]["clusterIP"], "None", "{service}");
        assert_eq!(service["spec"]["ports"][0]["port"], 9443, "{service}");
        assert_eq!(
            service["metadata"]["ownerReferences"][0]["uid"],
            function["metadata"]["uid"]
        );
        let secret = cluster
            .get("secrets", &format!("{name}-tls-server"), Some(NAMESPACE))
            .expect("the server Secret");
        std::fs::write(ca.path().join("tls.crt"), secret_value(&secret, "tls.crt")).unwrap();
        assert_eq!(
            secret_value(&secret, "ca.crt"),
            secret_value(&root, "tls.crt")
        );
        let verify = std::process::Command::new("openssl")
            .args(["verify", "-purpose", "sslserver", "-CAfile"])
            .arg(ca.path().join("ca.crt"))
            .arg(ca.path().join("tls.crt"))
            .output()
            .unwrap();
        assert!(
            verify.status.success(),
            "{}",
            String::from_utf8_lossy(&verify.stdout)
        );
        let sans = std::process::Command::new("openssl")
            .args(["x509", "-noout", "-ext", "subjectAltName", "-in"])
            .arg(ca.path().join("tls.crt"))
            .output()
            .unwrap();
        let sans = String::from_utf8_lossy(&sans.stdout);
        for dns in [
            name.to_owned(),
            format!("{name}.{NAMESPACE}"),
            format!("{name}.{NAMESPACE}.svc"),
        ] {
            assert!(sans.contains(&format!("DNS:{dns}")), "{sans}");
        }
    }
}

fn secret_value(secret: &Value, key: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(secret["data"][key].as_str().unwrap_or_default())
        .unwrap()
}

fn an_upgrade_is_served_from_the_new_revision_and_a_deleted_function_is_unhosted(day: &Day) {
    let cluster = &day.cluster;
    let old = active_revision(day, TEST_FN).unwrap();
    let test_v2 = function_server_package(&day.registry, TEST_FN, "v2");
    cluster.apply(&function(TEST_FN, &test_v2));
    let new = cluster.wait("a new Active revision with an endpoint", PATIENCE, || {
        let r = active_revision(day, TEST_FN)?;
        (r["metadata"]["name"] != old["metadata"]["name"] && r["status"]["endpoint"].is_string())
            .then_some(r.clone())
            .ok_or_else(|| format!("{}", r["metadata"]["name"]))
    });
    assert_eq!(new["spec"]["image"], test_v2.as_str(), "{new}");
    // Core dials the new revision's endpoint, and xfn serves it from the
    // new package: the XR's status says v2 (core polls every 10 s).
    wait_composed(day, "one", "eu-north-1", "v2");
    let old = cluster
        .get(
            "functionrevisions",
            old["metadata"]["name"].as_str().unwrap(),
            None,
        )
        .expect("the old revision");
    assert_eq!(old["spec"]["desiredState"], "Inactive", "{old}");
    let served = new["status"]["resolvedImage"]
        .as_str()
        .filter(|i| !i.is_empty())
        .unwrap_or(&test_v2);
    assert!(
        hosted(&cluster.log("xfn-host-1"), TEST_FN, Some(served)),
        "xfn host never hosted {served}"
    );

    // A Function deleted: unhosted, its Service, Secret and revisions gone.
    let doomed = "function-doomed";
    let package = function_server_package(&day.registry, doomed, "v1");
    cluster.apply(&function(doomed, &package));
    cluster.wait("the doomed Function's Service", PATIENCE, || {
        cluster
            .get("services", doomed, Some(NAMESPACE))
            .map(drop)
            .ok_or("no Service".to_owned())
    });
    cluster.kubectl(&["delete", "function", doomed]);
    cluster.wait(
        "the doomed Function's Service, Secret and revisions gone",
        PATIENCE,
        || {
            let service = cluster.get("services", doomed, Some(NAMESPACE));
            let secret = cluster.get("secrets", &format!("{doomed}-tls-server"), Some(NAMESPACE));
            let revisions = cluster.list(
                "functionrevisions",
                Some(&format!("pkg.crossplane.io/package={doomed}")),
                None,
            );
            (service.is_none() && secret.is_none() && revisions.is_empty())
                .then_some(())
                .ok_or(format!(
                    "service {} secret {} revisions {}",
                    service.is_some(),
                    secret.is_some(),
                    revisions.len()
                ))
        },
    );
    // Whichever deletes the Service first, the garbage collector (the
    // owner reference) or xfn, the Function is no longer hosted.
    cluster.wait("the doomed Function unhosted", PATIENCE, || {
        cluster
            .log("xfn-host-1")
            .lines()
            .any(|l| l.contains(" unhosted ") && l.contains(&format!("function={doomed}")))
            .then_some(())
            .ok_or_else(|| "no unhosted line".to_owned())
    });
}

fn a_restarted_host_loses_no_xr_and_two_replicas_write_the_same_objects(day: &Day) {
    let cluster = &day.cluster;
    // XRs created, then the only replica killed while core reconciles
    // them: core's calls fail (UNAVAILABLE, or the name resolves to
    // nothing) and are retried; a new replica serves them.
    for i in 0..3 {
        cluster.apply(&xr(&format!("restart-{i}"), &format!("region-{i}")));
    }
    cluster.host("kill", 1);
    std::thread::sleep(Duration::from_secs(3));
    cluster.host("start", 1);
    for i in 0..3 {
        wait_composed(day, &format!("restart-{i}"), &format!("region-{i}"), "v2");
    }

    // Two replicas at once: both reconcile every Function; the objects they
    // write stop changing (each writes only what differs), and one field
    // manager owns them.
    cluster.host("start", 2);
    let versions = || -> Vec<String> {
        let mut versions = Vec::new();
        for name in [PT, TEST_FN] {
            let service = cluster.get("services", name, Some(NAMESPACE)).unwrap();
            let secret = cluster
                .get("secrets", &format!("{name}-tls-server"), Some(NAMESPACE))
                .unwrap();
            let revision = active_revision(day, name).unwrap();
            for object in [service, secret, revision] {
                versions.push(
                    object["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap()
                        .to_owned(),
                );
            }
        }
        versions
    };
    cluster.wait("replica 2 hosting every Function", PATIENCE, || {
        let log = cluster.log("xfn-host-2");
        [PT, TEST_FN]
            .iter()
            .all(|f| hosted(&log, f, None))
            .then_some(())
            .ok_or_else(|| log.lines().rev().take(5).collect::<Vec<_>>().join("\n"))
    });
    let before = versions();
    std::thread::sleep(Duration::from_secs(15));
    assert_eq!(
        before,
        versions(),
        "the two replicas kept rewriting the objects"
    );
    for object in ["service", "secret"] {
        for name in [PT, TEST_FN] {
            let name = match object {
                "secret" => format!("{name}-tls-server"),
                _ => name.to_owned(),
            };
            let managers = cluster.kubectl(&[
                "get",
                object,
                &name,
                "-n",
                NAMESPACE,
                "--show-managed-fields",
                "-o",
                "jsonpath={.metadata.managedFields[*].manager}",
            ]);
            assert_eq!(managers, "xfn-host", "{object} {name}");
        }
    }
    cluster.apply(&xr("two-replicas", "region-2r"));
    wait_composed(day, "two-replicas", "region-2r", "v2");
    cluster.host("stop", 2);
}

fn a_bad_package_says_why_and_the_other_functions_keep_composing(day: &Day) {
    let cluster = &day.cluster;
    let not_a_function = ImageBuilder::new()
        .layer(Layer::busybox())
        .push(&day.registry, "not-a-function:v1")
        .reference;
    let missing = day.registry.reference("never-pushed:v1");
    cluster.apply(
        &(function("function-unpullable", &missing)
            + "---\n"
            + &function("function-not-a-function", &not_a_function)),
    );
    for name in ["function-unpullable", "function-not-a-function"] {
        let why = cluster.wait(&format!("{name} says why"), PATIENCE, || {
            let f = cluster.get("functions", name, None).ok_or("no Function")?;
            let said = conditions(&f);
            let failed = f["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| {
                    c["status"] == "False" && c["message"].as_str().is_some_and(|m| !m.is_empty())
                });
            failed.then_some(said.clone()).ok_or(said)
        });
        eprintln!("{name}: {why}");
    }
    cluster.apply(&xr("after-bad", "region-bad"));
    wait_composed(day, "after-bad", "region-bad", "v2");
}

/// Whether an `xfn host` log says it hosted `function` (from `package`).
fn hosted(log: &str, function: &str, package: Option<&str>) -> bool {
    log.lines().any(|line| {
        line.contains(" hosted ")
            && line.contains(&format!("function={function} "))
            && package.is_none_or(|p| line.contains(&format!("package={p} ")))
    })
}
