"""Configuration loads without the model stack: importing ``EngineArgs``
(and parsing a command line with it) loads neither torch nor transformers."""

from __future__ import annotations

import subprocess
import sys


def test_arg_utils_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "import pagedrs.engine.arg_utils as a\n"
        "import argparse\n"
        "p = argparse.ArgumentParser()\n"
        "a.EngineArgs.add_cli_args(p)\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'pagedrs.executor.model_loader')"
        " if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "", f"importing EngineArgs loaded {out.stdout.strip()}"
