"""A composition function in Python as people write them without the SDK:
it imports its libraries, reads the request on stdin, adds a desired
resource and writes the answer on stdout. A FunctionIO (YAML, `xfn start`)
or a RunFunctionRequest (JSON, `xfn adapt`), told by the first byte."""
import json
import sys

import yaml

BUCKET = {
    "apiVersion": "s3.aws.upbound.io/v1beta1",
    "kind": "Bucket",
    "spec": {"forProvider": {"region": "us-east-2"}},
}

raw = sys.stdin.read()
if raw.lstrip().startswith("{"):
    request = json.loads(raw)
    desired = request.get("desired") or {}
    desired.setdefault("resources", {})["bucket"] = {"resource": BUCKET}
    tag = (request.get("meta") or {}).get("tag", "")
    json.dump({"meta": {"tag": tag}, "desired": desired}, sys.stdout)
else:
    doc = yaml.safe_load(raw) or {}
    desired = doc.get("desired") or {}
    desired.setdefault("resources", []).append({"name": "bucket", "resource": BUCKET})
    doc["desired"] = desired
    yaml.safe_dump(doc, sys.stdout, sort_keys=True)
