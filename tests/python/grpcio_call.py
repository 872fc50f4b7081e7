"""One unary call with Python's grpcio (gRPC C-core), as any C-core client
makes it: the channel's default `:authority` is grpcio's own (for a Unix
socket, its percent-encoded name). Used by tests/server_lifecycle.rs.

    grpcio_call.py TARGET METHOD REQUEST_HEX

REQUEST_HEX `-` reads it from stdin (a request past the 128 KiB an
argument may hold).

Prints the response as hex; on a failed call, prints the status to stderr
and exits 1.
"""
import sys

import grpc

target, method, request_hex = sys.argv[1:4]
if request_hex == "-":
    request_hex = sys.stdin.read().strip()
with grpc.insecure_channel(target) as channel:
    # No serializers: the request and response are the serialized bytes.
    call = channel.unary_unary(method)
    try:
        response = call(bytes.fromhex(request_hex), timeout=60)
    except grpc.RpcError as err:
        print(f"{err.code().name}: {err.details()}", file=sys.stderr)
        sys.exit(1)
print(response.hex())
