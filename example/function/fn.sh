#!/bin/sh
# An example Composition Function in the alpha (FunctionIO) style: it reads the
# FunctionIO on stdin and writes it back with one more desired resource, a
# bucket named after the composite resource.
set -eu
input=$(cat)
name=$(printf '%s\n' "$input" | sed -n 's/^        name: //p' | head -n 1)
printf '%s\n' "$input"
cat <<YAML
desired:
  resources:
  - name: bucket
    resource:
      apiVersion: s3.aws.upbound.io/v1beta1
      kind: Bucket
      metadata:
        name: ${name:-example}-bucket
      spec:
        forProvider:
          region: us-east-2
YAML
