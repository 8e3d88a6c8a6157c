# SPDX-License-Identifier: BSD-3-Clause
"""The README's example runs as written."""
import os
import re

import pytest

from mpirun import ROOT, run_mpi


def readme_example():
    """The README's first Python block."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        blocks = re.findall(r"^```python\n(.*?)^```", f.read(), re.M | re.S)
    assert blocks, "README.md has no ```python block"
    return blocks[0]


@pytest.mark.parametrize("n", [2, 3])
def test_readme_example_runs(tmp_path, n):
    """Every rank gets through the example and prints its rank and the
    size, as the example's last line says, and no call falls back to
    mpi4py (which warns)."""
    app = tmp_path / "app.py"
    app.write_text(readme_example())
    # Warnings shown whatever the caller's PYTHONWARNINGS says.
    result = run_mpi(n, [str(app)], timeout=60,
                     env={"PYTHONWARNINGS": "default"})
    lines = sorted(result.stdout.split("\n"))
    assert [ln for ln in lines if ln] == [f"{r} {n}" for r in range(n)], \
        result.stdout
    assert "falling back" not in result.stderr, result.stderr
