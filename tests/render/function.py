"""A composition function built with Crossplane's published Python SDK
(crossplane-function-sdk-python), for xfn's Development-runtime tests.

Each pipeline step says what to do in its input's `action`:
  create   one ConfigMap per `spec.count` of the XR (bucket-0, bucket-1, ...)
  label    add `input.labels` to every desired resource
  ready    mark desired resources ready (all, or `input.names`)
  results  return a Warning (and a Fatal when `input.fatal` is set)
  require  require ConfigMap `input.name`; once given, copy its data into
           `from-settings`
  context  write `input.write` into the context; copy context key `input.read`
           into the XR's desired status
  observe  copy the observed XR's metadata.uid, labels and spec into the
           context (`observed`): what Crossplane's reconciler gave it
  schema   require the schema of `input.apiVersion` `input.kind`; once
           given, put its top-level property names into the context
           (`schemaProperties`, null when there is none)
  env      put environment variable `input.name` into the context (`env`)
  mirror   copy each observed composed resource's `data` into the XR's
           desired status (`mirrored`, by resource name): a composed
           resource's state patched back to the XR
  operate  (Operations) apply ConfigMap `input.name` holding the watched
           resource's name and the required `settings` data, if any; set
           the step's output

Run: python3 function.py --address 127.0.0.1:PORT --insecure
"""

import argparse
import os

from crossplane.function import logging, request, resource, response, runtime
from crossplane.function.proto.v1 import run_function_pb2 as fnv1
from crossplane.function.proto.v1 import run_function_pb2_grpc as grpcv1


class Function(grpcv1.FunctionRunnerServiceServicer):
    async def RunFunction(self, req: fnv1.RunFunctionRequest, _) -> fnv1.RunFunctionResponse:
        rsp = response.to(req)
        inp = resource.struct_to_dict(req.input)
        action = inp.get("action")
        if action == "create":
            xr = resource.struct_to_dict(req.observed.composite.resource)
            count = int(xr.get("spec", {}).get("count", 0))
            for i in range(count):
                resource.update(
                    rsp.desired.resources[f"bucket-{i}"],
                    {"apiVersion": "v1", "kind": "ConfigMap", "data": {"index": str(i)}},
                )
            response.normal(rsp, f"created {count} buckets")
        elif action == "compose":
            resource.update(rsp.desired.resources[inp["name"]], inp["resource"])
        elif action == "label":
            for name in rsp.desired.resources:
                obj = resource.struct_to_dict(rsp.desired.resources[name].resource)
                obj.setdefault("metadata", {}).setdefault("labels", {}).update(inp["labels"])
                resource.update(rsp.desired.resources[name], obj)
        elif action == "ready":
            for name in rsp.desired.resources:
                if not inp.get("names") or name in inp["names"]:
                    rsp.desired.resources[name].ready = fnv1.READY_TRUE
        elif action == "results":
            response.warning(rsp, inp.get("warning", "careful"))
            if inp.get("fatal"):
                response.fatal(rsp, inp["fatal"])
        elif action == "require":
            # Ask every time: the caller re-runs the step until the
            # requirements stop changing, as Crossplane does.
            response.require_resources(
                rsp, "settings", "v1", "ConfigMap", match_name=inp["name"]
            )
            found = request.get_required_resource(req, "settings")
            if found is not None:
                resource.update(
                    rsp.desired.resources["from-settings"],
                    {"apiVersion": "v1", "kind": "ConfigMap", "data": found.get("data", {})},
                )
        elif action == "context":
            ctx = resource.struct_to_dict(req.context)
            ctx.update(inp.get("write", {}))
            rsp.context.Clear()
            rsp.context.update(ctx)
            if "read" in inp:
                value = ctx.get(inp["read"])
                resource.update(
                    rsp.desired.composite, {"status": {"fromContext": value}}
                )
        elif action == "observe":
            xr = resource.struct_to_dict(req.observed.composite.resource)
            meta = xr.get("metadata", {})
            rsp.context.update({"observed": {
                "uid": meta.get("uid"),
                "labels": meta.get("labels", {}),
                "spec": xr.get("spec", {}),
            }})
        elif action == "schema":
            response.require_schema(rsp, "schema", inp["apiVersion"], inp["kind"])
            if "schema" in req.required_schemas:
                schema = request.get_required_schema(req, "schema")
                names = sorted(schema.get("properties", {})) if schema else None
                rsp.context.update({"schemaProperties": names})
        elif action == "mirror":
            mirrored = {
                name: resource.struct_to_dict(r.resource).get("data", {})
                for name, r in req.observed.resources.items()
            }
            resource.update(rsp.desired.composite, {"status": {"mirrored": mirrored}})
        elif action == "env":
            rsp.context.update({"env": os.environ.get(inp["name"])})
        elif action == "operate":
            response.require_resources(
                rsp, "settings", "v1", "ConfigMap", match_name="settings"
            )
            watched = request.get_watched_resource(req)
            data = {"watched": watched["metadata"]["name"] if watched else ""}
            settings = request.get_required_resource(req, "settings")
            if settings is not None:
                data.update(settings.get("data", {}))
            resource.update(
                rsp.desired.resources[inp["name"]],
                {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": inp["name"], "namespace": "default"}, "data": data},
            )
            response.set_output(rsp, {"applied": inp["name"], "keys": sorted(data)})
            response.normal(rsp, f"applied {inp['name']}")
        else:
            response.fatal(rsp, f"unknown action {action!r}")
        return rsp


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", default="0.0.0.0:9443")
    parser.add_argument("--insecure", action="store_true")
    args = parser.parse_args()
    logging.configure()
    runtime.serve(Function(), args.address, creds=None, insecure=args.insecure)


if __name__ == "__main__":
    main()
