"""Validates deploy/ offline against the Kubernetes schemas of the oldest
Kubernetes the deployment supports (1.33: hostUsers and procMount on by
default), with kubernetes-validate (PyPI) in strict mode: unknown fields
are errors.

What is a Kubernetes object is validated as one. What is not:
- the Helm values: the Deployment the Crossplane v1.13 chart renders from
  them is rebuilt here the way its template (templates/deployment.yaml,
  the xfn container and the xfn-cache volume) puts the values in, with the
  post-renderer's hostUsers patch applied, and validated as a Deployment;
  so is the fallback, values-shared-uid.yaml layered over them;
- the DeploymentRuntimeConfig: its deploymentTemplate, completed the way
  Crossplane completes it (selector, labels, the package image), is
  validated as a Deployment, and so is it with the fallback JSON patch
  (shared-uid-patch.yaml) applied; the Function and DeploymentRuntimeConfig
  themselves are Crossplane CRDs, which kubernetes-validate does not know:
  only their references to each other and to the autoscaler are checked;
- deploy/host/: every object of xfn-host.yaml is a Kubernetes object and is
  validated as one, with the references between them (bindings to roles
  and the ServiceAccount, the Deployment's account and selector, the
  autoscaler's target) checked; crossplane-values.yaml is the Crossplane
  v2 chart's `args`, checked to set Function=External.
Nothing here talks to a cluster.

Usage: python3 validate.py REPO
"""
import copy
import pathlib
import sys

import kubernetes_validate
import yaml

K8S = "1.33.0"
REPO = pathlib.Path(sys.argv[1])
PROFILE = "xfn/runner.json"


def valid(obj, what):
    try:
        kubernetes_validate.validate(obj, K8S, strict=True)
    except kubernetes_validate.ValidationError as e:
        sys.exit(f"{what}: not a valid {obj.get('kind')} for Kubernetes {K8S}: {e.message} at {list(e.path)}")
    print(f"ok: {what}")


def invalid(obj, what):
    """The validator must catch a broken object (or it proves nothing)."""
    try:
        kubernetes_validate.validate(obj, K8S, strict=True)
    except kubernetes_validate.ValidationError:
        print(f"ok: rejected {what}")
        return
    sys.exit(f"kubernetes-validate accepted {what}")


def chart_deployment(values, patch):
    """The parts of Crossplane v1.13's Deployment that the xfn values reach."""
    xfn = values["xfn"]
    chart_defaults_security = {
        "runAsUser": 65532, "runAsGroup": 65532, "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True, "capabilities": {"add": ["SETUID", "SETGID"]},
        "seccompProfile": {"type": "Unconfined"},
    }
    security = merge(chart_defaults_security, xfn["securityContext"])
    cache = {"sizeLimit": xfn["cache"]["sizeLimit"]}
    if xfn["cache"]["medium"]:
        cache["medium"] = xfn["cache"]["medium"]
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "crossplane", "namespace": "crossplane-system"},
        "spec": {
            "selector": {"matchLabels": {"app": "crossplane"}},
            "template": {
                "metadata": {"labels": {"app": "crossplane"},
                             "annotations": {"container.apparmor.security.beta.kubernetes.io/crossplane-xfn": "unconfined"}},
                "spec": {
                    "serviceAccountName": "crossplane",
                    "containers": [
                        {"name": "crossplane", "image": "xpkg.upbound.io/crossplane/crossplane:v1.13.2",
                         "args": ["core", "start"] + values["args"]},
                        {"name": "crossplane-xfn",
                         "image": f"{xfn['image']['repository']}:{xfn['image']['tag']}",
                         "args": ["start"] + xfn["args"],
                         "imagePullPolicy": xfn["image"]["pullPolicy"],
                         "resources": xfn["resources"],
                         "securityContext": security,
                         "volumeMounts": [{"mountPath": "/xfn", "name": "xfn-cache"}]},
                    ],
                    "volumes": [{"name": "xfn-cache", "emptyDir": cache}],
                },
            },
        },
    }
    return merge(deployment, {k: v for k, v in patch.items() if k == "spec"})


def merge(base, over):
    """Helm's (and a strategic merge patch's, for maps) deep merge."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def check_xfn_container(container, what):
    """What every shape of the xfn container keeps (its user and
    capabilities are tests/deploy_manifests.rs's to check)."""
    sc = container["securityContext"]
    assert sc["seccompProfile"] == {"type": "Localhost", "localhostProfile": PROFILE}, (what, sc)
    assert sc["procMount"] == "Unmasked", (what, sc)
    assert any(m["mountPath"] == "/xfn" for m in container["volumeMounts"]), what


def json_patch(obj, ops):
    """RFC 6902 `replace`, and `add` of an object member (what the fallback
    patches use), on a copy."""
    out = copy.deepcopy(obj)
    for op in ops:
        assert op["op"] in ("replace", "add"), op
        *parents, last = [int(p) if p.isdigit() else p for p in op["path"].lstrip("/").split("/")]
        node = out
        for key in parents:
            node = node[key]
        if op["op"] == "add":
            assert isinstance(node, dict) and last not in node, op["path"]
        else:
            assert (last in node) if isinstance(node, dict) else last < len(node), op["path"]
        node[last] = copy.deepcopy(op["value"])
    return out


# The profile the manifests name is the repository's.
assert (REPO / "seccomp" / pathlib.Path(PROFILE).name).is_file()

# Crossplane v1.11–v1.13: the chart's Deployment from the values.
values = yaml.safe_load((REPO / "deploy/crossplane-v1.13/values.yaml").read_text())
patch = yaml.safe_load((REPO / "deploy/crossplane-v1.13/hostusers-patch.yaml").read_text())
valid(patch | {"spec": merge(patch["spec"], {"selector": {"matchLabels": {"app": "crossplane"}},
                                              "template": {"metadata": {"labels": {"app": "crossplane"}},
                                                           "spec": {"containers": [{"name": "c", "image": "i"}]}}})},
      "deploy/crossplane-v1.13/hostusers-patch.yaml (completed)")
deployment = chart_deployment(values, patch)
assert deployment["spec"]["template"]["spec"]["hostUsers"] is False
check_xfn_container(deployment["spec"]["template"]["spec"]["containers"][1], "values.yaml")
valid(deployment, "the Crossplane v1.13 Deployment with deploy/crossplane-v1.13/values.yaml")
# The fallback, layered over values.yaml as Helm merges `-f a -f b`.
shared = yaml.safe_load((REPO / "deploy/crossplane-v1.13/values-shared-uid.yaml").read_text())
fallback = chart_deployment(merge(values, shared), patch)
check_xfn_container(fallback["spec"]["template"]["spec"]["containers"][1], "values-shared-uid.yaml")
valid(fallback, "the Crossplane v1.13 Deployment with values.yaml and values-shared-uid.yaml")
broken = copy.deepcopy(deployment)
broken["spec"]["template"]["spec"]["containers"][1]["securityContext"]["procMount"] = ["Unmasked"]
invalid(broken, "a procMount that is not a string")

# Crossplane v1.14+/v2: Function, DeploymentRuntimeConfig, HPA.
docs = list(yaml.safe_load_all((REPO / "deploy/function/function.yaml").read_text()))
by_kind = {d["kind"]: d for d in docs}
function, drc, hpa = by_kind["Function"], by_kind["DeploymentRuntimeConfig"], by_kind["HorizontalPodAutoscaler"]
assert function["apiVersion"] == drc["apiVersion"] == "pkg.crossplane.io/v1beta1"
assert function["spec"]["runtimeConfigRef"]["name"] == drc["metadata"]["name"]
template = drc["spec"]["deploymentTemplate"]
assert hpa["spec"]["scaleTargetRef"]["name"] == template["metadata"]["name"]
valid(hpa, "deploy/function/function.yaml: HorizontalPodAutoscaler")
runtime = copy.deepcopy(template)
runtime = {"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": runtime["metadata"] | {"namespace": "crossplane-system"}, "spec": runtime["spec"]}
labels = {"pkg.crossplane.io/function": function["metadata"]["name"]}
runtime["spec"]["selector"] = {"matchLabels": labels}
runtime["spec"]["template"].setdefault("metadata", {})["labels"] = labels
container = runtime["spec"]["template"]["spec"]["containers"][0]
assert container["name"] == "package-runtime"
container["image"] = function["spec"]["package"]
container["ports"] = [{"name": "grpc", "containerPort": 9443}]
check_xfn_container(container, "DeploymentRuntimeConfig")
assert runtime["spec"]["template"]["spec"]["hostUsers"] is False
valid(runtime, "deploy/function/function.yaml: the DeploymentRuntimeConfig's deploymentTemplate as Crossplane completes it")
# The fallback: the JSON patch applied to the DeploymentRuntimeConfig.
ops = yaml.safe_load((REPO / "deploy/function/shared-uid-patch.yaml").read_text())
patched = json_patch(drc, ops)["spec"]["deploymentTemplate"]["spec"]
fallback = copy.deepcopy(runtime)
fallback["spec"]["template"]["spec"]["securityContext"] = patched["template"]["spec"]["securityContext"]
fallback_container = fallback["spec"]["template"]["spec"]["containers"][0]
fallback_container["securityContext"] = patched["template"]["spec"]["containers"][0]["securityContext"]
check_xfn_container(fallback_container, "shared-uid-patch.yaml")
valid(fallback, "deploy/function/function.yaml with shared-uid-patch.yaml")
broken = copy.deepcopy(hpa)
broken["spec"]["maxReplicas"] = "ten"
invalid(broken, "an autoscaler with maxReplicas 'ten'")

# xfn host beside Crossplane v2: deploy/host/.
docs = list(yaml.safe_load_all((REPO / "deploy/host/xfn-host.yaml").read_text()))
for doc in docs:
    valid(doc, f"deploy/host/xfn-host.yaml: {doc['kind']} {doc['metadata']['name']}")
by_kind = {}
for doc in docs:
    assert doc["kind"] not in by_kind, f"one {doc['kind']} in deploy/host/xfn-host.yaml"
    by_kind[doc["kind"]] = doc
sa, deployment, hpa = by_kind["ServiceAccount"], by_kind["Deployment"], by_kind["HorizontalPodAutoscaler"]
for binding, role in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
    b = by_kind[binding]
    assert b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role,
                            "name": by_kind[role]["metadata"]["name"]}, binding
    assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                              "namespace": sa["metadata"]["namespace"]}], binding
assert by_kind["Role"]["metadata"]["namespace"] == sa["metadata"]["namespace"] == deployment["metadata"]["namespace"]
pod = deployment["spec"]["template"]
assert pod["spec"]["serviceAccountName"] == sa["metadata"]["name"]
assert pod["metadata"]["labels"] | deployment["spec"]["selector"]["matchLabels"] == pod["metadata"]["labels"]
assert pod["spec"]["hostUsers"] is False
host = pod["spec"]["containers"][0]
check_xfn_container(host, "deploy/host/xfn-host.yaml")
assert host["args"][0] == "host" and not any(a.startswith("--functions") for a in host["args"]), host["args"]
assert f"--namespace={deployment['metadata']['namespace']}" in host["args"], host["args"]
assert {"name": "grpc", "containerPort": 9443} in host["ports"]
ca = next(v for v in pod["spec"]["volumes"] if v["name"] == "crossplane-root-ca")
assert ca["secret"]["secretName"] == "crossplane-root-ca"
mount = next(m for m in host["volumeMounts"] if m["name"] == "crossplane-root-ca")
assert f"--ca={mount['mountPath']}" in host["args"], host["args"]
assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                         "name": deployment["metadata"]["name"]}
assert hpa["metadata"]["namespace"] == deployment["metadata"]["namespace"]
crossplane = yaml.safe_load((REPO / "deploy/host/crossplane-values.yaml").read_text())
assert "--package-runtime=Function=External" in crossplane["args"], crossplane
broken = copy.deepcopy(by_kind["Role"])
broken["rules"][0]["verbs"] = "get"
invalid(broken, "a Role whose verbs are not a list")
print("deploy-valid")
