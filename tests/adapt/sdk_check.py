"""Calls an `xfn adapt` Function with the v1 stubs the published Crossplane
Python SDK (crossplane-function-sdk-python) ships, and checks the answer.

Usage: python3 sdk_check.py HOST:PORT               # plaintext (--insecure)
       python3 sdk_check.py HOST:PORT CERTS_DIR     # mutual TLS, as Crossplane
           calls a Function: CERTS_DIR holds ca.crt, client.crt, client.key;
           the server's certificate must name localhost
"""
import sys
from pathlib import Path

import grpc
from crossplane.function.proto.v1 import run_function_pb2 as fnv1
from crossplane.function.proto.v1 import run_function_pb2_grpc as grpcv1
from google.protobuf import struct_pb2

address = sys.argv[1]
if len(sys.argv) > 2:
    certs = Path(sys.argv[2])
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(certs / "ca.crt").read_bytes(),
        private_key=(certs / "client.key").read_bytes(),
        certificate_chain=(certs / "client.crt").read_bytes(),
    )
    channel = grpc.secure_channel(
        address, credentials, options=[("grpc.ssl_target_name_override", "localhost")]
    )
else:
    channel = grpc.insecure_channel(address)
with channel:
    stub = grpcv1.FunctionRunnerServiceStub(channel)
    request = fnv1.RunFunctionRequest(
        meta=fnv1.RequestMeta(tag="sdk-tag"),
        input=struct_pb2.Struct(fields={"mode": struct_pb2.Value(string_value="ok")}),
    )
    response = stub.RunFunction(request, timeout=60)
    assert response.meta.tag == "sdk-tag", response
    assert len(response.results) == 1, response
    assert response.results[0].message == "hello from the container", response
    assert response.results[0].severity == fnv1.SEVERITY_NORMAL, response
print("sdk-check-ok")
