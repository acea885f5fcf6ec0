"""The ``dfo`` command: click only. It parses, calls, prints.

Decisions live in ``orchestrator.plan`` and ``orchestrator.common`` (pure) and side effects behind
``orchestrator.transport``. Errors become exit codes here, in one place
(see ``orchestrator.common.errors`` for the table); a user never sees a traceback
for an error they can cause.
"""

from __future__ import annotations

import logging
import sys

import click

from .. import __version__
from ..common.errors import EXIT_INTERRUPTED, DfoError, Interrupted
from .context import AppContext
from . import cache as _cache, demo as _demo, deploy as _deploy, hosts as _hosts, run as _run
from . import status as _status
from . import viz as _viz
from . import export as _export

log = logging.getLogger("dfo")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dfo")
@click.option("--hosts", "hosts_file", type=click.Path(dir_okay=False), default=None,
              envvar="DFO_HOSTS",
              help="hosts.yaml to use (default: ./hosts.yaml, then ~/.config/dfo/hosts.yaml, "
                   "then the embedded `local` default).")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.pass_context
def cli(ctx: click.Context, hosts_file: str | None, verbose: int) -> None:
    """Orchestrate DFlash drafter training on Proxmox LXC GPU hosts."""
    _setup_logging(verbose)
    ctx.obj = AppContext(hosts_file=hosts_file)
    ctx.call_on_close(ctx.obj.close)


for _module in (_hosts, _deploy, _cache, _run, _status, _demo, _viz, _export):
    for _cmd in _module.COMMANDS:
        cli.add_command(_cmd)


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING - 10 * verbose
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("dfo: %(levelname)s: %(message)s"))
    logger = logging.getLogger("dfo")
    logger.handlers[:] = [handler]
    logger.setLevel(max(level, logging.DEBUG))
    logger.propagate = False


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI and map errors to exit codes (the only place that does)."""
    try:
        rv = cli.main(args=argv, prog_name="dfo", standalone_mode=False)
    except Interrupted as e:
        click.echo(f"dfo: interrupted: {e}", err=True)
        return e.exit_code
    except DfoError as e:
        click.echo(f"dfo: error: {e}", err=True)
        return e.exit_code
    except click.exceptions.Abort:
        click.echo("dfo: interrupted", err=True)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        click.echo("dfo: interrupted", err=True)
        return EXIT_INTERRUPTED
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.ctx.get_help() if e.ctx else "", err=True)
        return 2
    except click.ClickException as e:
        click.echo(f"dfo: error: {usage_error_line(e)}", err=True)
        return 2  # usage errors are config errors: exit 2
    except click.exceptions.Exit as e:
        return e.exit_code
    return rv if isinstance(rv, int) else 0


def usage_error_line(e: click.ClickException) -> str:
    """click's usage errors (unknown option, bad value, missing argument) as dfo's one line:
    ``<command>: <what is wrong> (see `<command> --help`)``, without click's usage block."""
    msg = " ".join(e.format_message().split()).replace(". Did you mean", "; did you mean")
    ctx = getattr(e, "ctx", None)
    path = ctx.command_path if ctx is not None else "dfo"
    if msg[:1].isupper() and not msg[:2].isupper():
        msg = msg[0].lower() + msg[1:]
    return f"{path}: {msg.rstrip('.')} (see `{path} --help`)"


def run() -> None:  # pragma: no cover - console script shim
    sys.exit(main())
