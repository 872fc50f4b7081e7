"""A composition function written against crossplane-function-sdk-python,
packaged by tests/host_e2e.rs as a Function image is (a venv-less copy of
function-template-python's layout) and hosted by `xfn host`."""
