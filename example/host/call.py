"""One v1 RunFunction call to a Function hosted by `xfn host`; prints the
response's desired resources and results as JSON.

    python3 example/host/call.py ADDRESS NAME                      # --insecure
    python3 example/host/call.py ADDRESS NAME CA_CRT CRT KEY       # --ca DIR

Plaintext, the host routes by the name given as the request's `:authority`;
over TLS, by the name dialled (SNI), with a client certificate the host's CA
signed, as Crossplane dials a Function (docs/host.md, "A local mTLS run").
"""
import json
import sys

import grpc
from crossplane.function import resource
from crossplane.function.proto.v1 import run_function_pb2 as fnv1
from crossplane.function.proto.v1 import run_function_pb2_grpc as grpcv1

address, name, *tls = sys.argv[1:]
if len(tls) not in (0, 3):
    sys.exit(__doc__)
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
options = [("grpc.default_authority", f"{name}:9443")]
if tls:
    ca, crt, key = (open(path, "rb").read() for path in tls)
    credentials = grpc.ssl_channel_credentials(ca, key, crt)
    # Dial ADDRESS, but verify and send SNI for the Function's name.
    options.append(("grpc.ssl_target_name_override", name))
    channel = grpc.secure_channel(address, credentials, options=options)
else:
    channel = grpc.insecure_channel(address, options=options)
with channel:
    try:
        rsp = grpcv1.FunctionRunnerServiceStub(channel).RunFunction(request, timeout=60)
    except grpc.RpcError as err:
        print(f"{err.code().name}: {err.details()}", file=sys.stderr)
        sys.exit(1)
desired = {k: resource.struct_to_dict(v.resource) for k, v in rsp.desired.resources.items()}
results = [r.message for r in rsp.results]
print(json.dumps({"desired": desired, "results": results}, indent=2))
