"""The dev-mode banner (`make run`): the key, a curl and an SDK example, and how to reach the
admin CLI and the dashboard, naming the CLI as this shell can call it (found by a new user: every
`pagegate admin ...` of the README failed with "command not found" outside the virtualenv)."""

from __future__ import annotations

import os
import sys

from gateway import serve
from gateway.settings import Settings


def test_the_banner_names_the_dashboard_and_a_callable_cli(monkeypatch, tmp_path) -> None:  # noqa: ANN001
    fake = tmp_path / ".venv" / "bin" / "pagegate"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(fake), "serve", "--dev"])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # not on PATH: the banner gives its path
    assert serve.cli_name() == os.path.join(".venv", "bin", "pagegate")
    banner = serve.dev_banner(Settings(port=18999, load_engine=False), "pg-example")
    assert "pg-example" in banner and "http://127.0.0.1:18999/admin" in banner
    assert "created tenant 'default'" in banner
    assert "created tenant 'default-2'" in serve.dev_banner(Settings(load_engine=False), "pg-x", "default-2")
    assert "`.venv/bin/pagegate admin token`" in banner
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")  # on PATH (an activated virtualenv)
    assert serve.cli_name() == "pagegate"
    monkeypatch.setattr(sys, "argv", ["-m", "serve"])  # python -m gateway.serve: the command's name
    assert serve.cli_name() == "pagegate"
