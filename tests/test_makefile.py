"""The Makefile's own text: `make help` lists every target with its description as it applies
here, the variables it names ($(TORCH_SPEC), $(EXTRAS)) given their values."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from .conftest import REPO


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_help_shows_each_targets_line_with_the_variables_values():
    def help_text(*args: str) -> str:
        # Run under `make test EXTRAS=...` (as CI does), the outer make's variables reach this one
        # through MAKEFLAGS; the Makefile's own defaults are what this test reads.
        env = {k: v for k, v in os.environ.items()
               if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "EXTRAS", "TORCH_SPEC", "TORCH_INDEX")}
        return subprocess.run(["make", "-s", "help", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=60, check=True, env=env).stdout

    text = help_text("TORCH_SPEC=torch==9.9", "EXTRAS=dev,postgres")
    assert "$(" not in text
    assert re.search(r"^  make install +Create ./.venv with torch \(torch==9\.9\) and smallinit\[dev,postgres\]$", text, re.M)
    targets = re.findall(r"^([a-z-]+):.*## ", (REPO / "Makefile").read_text(), re.M)
    assert [line.split()[1] for line in text.splitlines()] == targets
    default = help_text()  # the Makefile's own choice: a CPU wheel pin, or plain torch beside a GPU
    assert re.search(r"with torch \((torch==[0-9.]+|torch)\) and smallinit\[dev,dashboard\]", default)
