#!/bin/sh
# Alpha function answering with issue 31's 1.9 KB of wide aliases in its
# FunctionIO: 250 copies of 100 copies of 400 items, ten million nodes.
cat >/dev/null
awk 'function rep(s, n,   out, i) { out = s; for (i = 1; i < n; i++) out = out "," s; return out }
BEGIN { printf "config: {a: &a [%s], b: &b [%s], c: [%s]}\n", rep("x", 400), rep("*a", 100), rep("*b", 250) }'
