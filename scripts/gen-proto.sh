#!/usr/bin/env bash
# Regenerates proto/v1.proto and proto/v1beta1.proto from proto/function.proto.in.
# The two packages are wire-identical; keeping one source stops them drifting.
set -euo pipefail
cd "$(dirname "$0")/../proto"
for v in v1 v1beta1; do
  { echo "// GENERATED from function.proto.in by scripts/gen-proto.sh: edit that file, not this one."
    sed "s/@VERSION@/$v/g" function.proto.in; } > "$v.proto"
done
