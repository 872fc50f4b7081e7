#!/bin/sh
# An example Composition Function in the alpha (FunctionIO) style: it reads the
# FunctionIO on stdin and writes it back with one more desired resource, a
# bucket named after the composite resource.
#
# The FunctionIO it is given may already hold a `desired` state (an alpha
# Composition's render passes `desired: {}` to the first step and each step's
# output to the next): that state is kept and the bucket added to its
# resources, so the output has one `desired` key, as YAML requires.
set -eu
input=$(cat)
name=$(printf '%s\n' "$input" | sed -n 's/^        name: //p' | head -n 1)
printf '%s\n' "$input" | awk -v name="${name:-example}" '
function bucket() {
    print "  - name: bucket"
    print "    resource:"
    print "      apiVersion: s3.aws.upbound.io/v1beta1"
    print "      kind: Bucket"
    print "      metadata:"
    print "        name: " name "-bucket"
    print "      spec:"
    print "        forProvider:"
    print "          region: us-east-2"
}
# The top-level desired block is held back and written last, with the bucket.
/^desired:/ { in_desired = 1; n = 0; next }
in_desired && /^[^ ]/ { in_desired = 0 }
in_desired { held[n++] = $0; next }
{ print }
END {
    print "desired:"
    for (i = 0; i < n; i++) {
        line = held[i]
        if (line ~ /^  resources:/) {
            print "  resources:"
            bucket()
            added = 1
        } else {
            print line
        }
    }
    if (!added) {
        print "  resources:"
        bucket()
    }
}'
