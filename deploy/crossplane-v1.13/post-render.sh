#!/bin/sh
# Helm post-renderer: applies hostusers-patch.yaml to the chart's output
# (stdin) with `kubectl kustomize`, and prints the result.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/all.yaml"
cp "$here/hostusers-patch.yaml" "$dir/"
cat > "$dir/kustomization.yaml" <<YAML
resources: [all.yaml]
patches:
  - path: hostusers-patch.yaml
    target: {kind: Deployment, name: crossplane}
YAML
kubectl kustomize "$dir"
