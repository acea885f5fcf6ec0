"""``python -m orchestrator.cli.docgen > docs/cli.md``: the command reference from the click
definitions, so the docs list every command and option that exists (a test compares).

The hand-written parts (intro, terminals and pipes, exit codes) are ``cli_template.md``
beside this file; ``{{SUMMARY}}`` and ``{{REFERENCE}}`` are filled in from the click tree.
A command added to the ``dfo`` group appears here with no change to this file.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import click

TEMPLATE = Path(__file__).with_name("cli_template.md")

#: the doc that explains a top-level command in depth (others: none)
DETAILS = {"hosts": "hosts.md", "deploy": "deploy.md", "warm-cache": "cache.md",
           "launch": "recovery.md", "logs": "recovery.md", "status": "recovery.md",
           "stop": "recovery.md", "diagnose": "recovery.md", "demo": "architecture.md"}


def walk(cmd: click.Command, ctx: click.Context):
    """(ctx, command) for every command under ``cmd``, depth first, in name order."""
    if isinstance(cmd, click.Group):
        for name in sorted(cmd.list_commands(ctx)):
            sub = cmd.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            sub_ctx = click.Context(sub, info_name=name, parent=ctx)
            if isinstance(sub, click.Group):
                yield sub_ctx, sub
            yield from walk(sub, sub_ctx)
    else:
        yield ctx, cmd


def _cell(s: str) -> str:
    return " ".join(s.split()).replace("|", "\\|")


def _help(cmd: click.Command) -> str:
    return inspect.cleandoc(cmd.help or "").replace("\b\n", "")


def usage(ctx: click.Context, cmd: click.Command) -> str:
    return " ".join([ctx.command_path, *cmd.collect_usage_pieces(ctx)])


def option_rows(ctx: click.Context, cmd: click.Command) -> list[tuple[str, str]]:
    rows = []
    for p in cmd.get_params(ctx):
        if isinstance(p, click.Argument):
            continue
        if not isinstance(p, click.Option) or p.hidden or "--help" in p.opts or p.name == "version":
            continue
        meta = "" if p.is_flag or p.count else f" {p.make_metavar(ctx)}"
        names = ", ".join(f"`{o}{meta}`" for o in [*p.opts, *p.secondary_opts])
        text = p.help or ""
        if p.show_default and p.default is not None:
            text += f" (default: {p.default})"
        if p.multiple and "repeatable" not in text:
            text += " (repeatable)"
        rows.append((names, text))
    return rows


def summary(root: click.Group) -> str:
    ctx = click.Context(root, info_name="dfo")
    out = ["| command | what it does | details |", "|---|---|---|"]
    for c, cmd in walk(root, ctx):
        if isinstance(cmd, click.Group):
            continue
        top = c.command_path.split()[1]
        link = f"[{DETAILS[top]}]({DETAILS[top]})" if top in DETAILS else "-"
        out.append(f"| `{c.command_path}` | {_cell(cmd.get_short_help_str(limit=300))} | {link} |")
    return "\n".join(out)


def reference(root: click.Group) -> str:
    ctx = click.Context(root, info_name="dfo")
    parts = [_section(ctx, root)]
    for c, cmd in walk(root, ctx):
        parts.append(_section(c, cmd))
    return "\n\n".join(parts)


def _section(ctx: click.Context, cmd: click.Command) -> str:
    lines = [f"### `{ctx.command_path}`", "", "```", usage(ctx, cmd), "```", ""]
    if _help(cmd):
        lines += [_help(cmd), ""]
    args = [p for p in cmd.get_params(ctx) if isinstance(p, click.Argument)]
    for a in args:
        lines.append(f"Argument `{a.make_metavar(ctx)}`" + ("" if a.required else " (optional)") + ".")
    if args:
        lines.append("")
    rows = option_rows(ctx, cmd)
    if rows:
        lines += ["| option | meaning |", "|---|---|"]
        lines += [f"| {_cell(n)} | {_cell(t)} |" for n, t in rows]
    if isinstance(cmd, click.Group):
        subs = ", ".join(f"`{ctx.command_path} {n}`" for n in sorted(cmd.list_commands(ctx)))
        lines += ["", f"Commands: {subs}."]
    return "\n".join(lines).rstrip()


def render(root: click.Group | None = None, template: str | None = None) -> str:
    if root is None:
        from . import cli

        root = cli
    text = template if template is not None else TEMPLATE.read_text()
    return text.replace("{{SUMMARY}}", summary(root)).replace("{{REFERENCE}}", reference(root))


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
