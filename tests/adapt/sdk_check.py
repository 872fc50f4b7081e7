"""Calls `xfn adapt --insecure` with the v1 stubs the published Crossplane
Python SDK (crossplane-function-sdk-python) ships, and checks the answer.

Usage: python3 sdk_check.py HOST:PORT
"""
import sys

import grpc
from crossplane.function.proto.v1 import run_function_pb2 as fnv1
from crossplane.function.proto.v1 import run_function_pb2_grpc as grpcv1
from google.protobuf import struct_pb2

address = sys.argv[1]
with grpc.insecure_channel(address) as channel:
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
