"""The ``pagegate`` command. Each subcommand lives with the code it drives; this file only wires
them: ``serve`` (gateway.serve), ``generate`` (gateway.generate_cmd: the engine alone), ``admin``
(admin.cli)."""

from __future__ import annotations

import argparse
import sys


class OneLineParser(argparse.ArgumentParser):
    """A usage error is one line on stderr (``pagegate admin tenants create: error: …``, with where to
    find the usage) and exit status 2, not argparse's usage block first. Subcommands' parsers are
    of the same class."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):  # noqa: ANN001, ANN201
        """As argparse's, noting the innermost (sub)command that parsed (it returns first)."""
        namespace, extras = super().parse_known_args(args, namespace)
        if not hasattr(namespace, "_command_prog"):
            namespace._command_prog = self.prog
        return namespace, extras

    def parse_args(self, args=None, namespace=None):  # noqa: ANN001, ANN201
        """An unknown option is reported by the subcommand it was given to (argparse reports it
        by the top parser: ``pagegate: error: unrecognized arguments``)."""
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            prog = getattr(namespace, "_command_prog", self.prog)
            self.exit(2, f"{prog}: error: unrecognized arguments: {' '.join(extras)} (see: {prog} --help)\n")
        return namespace


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="pagegate", description="Self-hosted multi-tenant LLM gateway")
    sub = parser.add_subparsers(dest="command", required=True)

    from gateway import generate_cmd, serve

    serve.register(sub)
    generate_cmd.register(sub)
    try:
        from admin import cli as admin_cli
    except ImportError:  # admin package not built yet
        admin_cli = None
    if admin_cli is not None and hasattr(admin_cli, "register"):
        admin_cli.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
