"""The function's CLI, as function-template-python's: the SDK's standard
flags (`--insecure`, `--address`, default 0.0.0.0:9443, ...)."""
import click
from crossplane.function import cli as sdkcli

from function import fn


@click.command()
@sdkcli.standard_options
def cli(**kwargs):
    """A Crossplane composition function."""
    sdkcli.run(fn.FunctionRunner(), **kwargs)


if __name__ == "__main__":
    cli()
