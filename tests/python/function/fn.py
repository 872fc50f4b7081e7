"""The function: composes one ConfigMap named for the XR and says so in a
result that names this function, so a test knows who answered. The
ConfigMap also tells what a function commonly relies on about its
container: its HOME, its user, and a temporary file it wrote and read."""
import os
import tempfile

from crossplane.function import logging, resource, response
from crossplane.function.proto.v1 import run_function_pb2 as fnv1
from crossplane.function.proto.v1 import run_function_pb2_grpc as grpcv1


class FunctionRunner(grpcv1.FunctionRunnerService):
    """Handles RunFunctionRequests."""

    def __init__(self):
        self.log = logging.get_logger()

    async def RunFunction(self, req: fnv1.RunFunctionRequest, _) -> fnv1.RunFunctionResponse:  # noqa: N802
        log = self.log.bind(tag=req.meta.tag)
        rsp = response.to(req)
        xr = resource.struct_to_dict(req.observed.composite.resource)
        name = xr.get("metadata", {}).get("name", "unnamed")
        greeting = req.input["greeting"] if "greeting" in req.input else "hello"
        with tempfile.NamedTemporaryFile("w+") as scratch:
            scratch.write(greeting)
            scratch.flush()
            scratch.seek(0)
            tmp = f"{scratch.name}: {scratch.read()}"
        resource.update(
            rsp.desired.resources["config"],
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "data": {
                    "greeting": greeting,
                    "xr": name,
                    "home": os.environ.get("HOME", "<unset>"),
                    "expanded_home": os.path.expanduser("~"),
                    "ids": f"{os.getuid()}:{os.getgid()}",
                    "tmp": tmp,
                },
            },
        )
        log.info("composed", xr=name)
        response.normal(rsp, f"function-sdk-python composed a ConfigMap for {name}")
        return rsp
