"""One v1 RunFunction call to a Function hosted by `xfn host --insecure`,
routed by the name it gives as the request's `:authority`, as docs/host.md
says; prints the response's desired resources and results as JSON.

    python3 example/host/call.py ADDRESS NAME
"""
import json
import sys

import grpc
from crossplane.function import resource
from crossplane.function.proto.v1 import run_function_pb2 as fnv1
from crossplane.function.proto.v1 import run_function_pb2_grpc as grpcv1

address, name = sys.argv[1:3]
xr = {
    "apiVersion": "example.crossplane.io/v1",
    "kind": "XBucket",
    "metadata": {"name": "example"},
    "spec": {"count": 2},
}
request = fnv1.RunFunctionRequest(
    meta=fnv1.RequestMeta(tag="example"),
    observed=fnv1.State(composite=fnv1.Resource(resource=resource.dict_to_struct(xr))),
    input=resource.dict_to_struct({"action": "create"}),
)
# The authority names the Function: the part before the port is its name.
with grpc.insecure_channel(address, options=[("grpc.default_authority", f"{name}:9443")]) as channel:
    try:
        rsp = grpcv1.FunctionRunnerServiceStub(channel).RunFunction(request, timeout=60)
    except grpc.RpcError as err:
        print(f"{err.code().name}: {err.details()}", file=sys.stderr)
        sys.exit(1)
desired = {k: resource.struct_to_dict(v.resource) for k, v in rsp.desired.resources.items()}
results = [r.message for r in rsp.results]
print(json.dumps({"desired": desired, "results": results}, indent=2))
