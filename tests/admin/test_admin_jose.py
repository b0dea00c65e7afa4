"""``admin.jose``: Authlib's JOSE API without its import-time deprecation warning."""

from __future__ import annotations

import subprocess
import sys


def test_importing_admin_auth_prints_no_deprecation_warning():
    """authlib.jose warns on import (Authlib 1.6+); admin.jose silences exactly that warning."""
    done = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", "import admin.jose"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "deprecated" not in done.stderr, done.stderr
