"""pyflakes over the package, its tests, the examples and the experiments: no undefined names, unused
imports or redefinitions (an undefined name in a rarely taken branch is a crash waiting for a user)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pyflakes_finds_nothing():
    pytest.importorskip("pyflakes", reason="pyflakes is in the test extra; the GPU machine has no package index")
    paths = [os.path.join(ROOT, p) for p in ("kogc", "tests", "examples", "experiments")]
    run = subprocess.run([sys.executable, "-m", "pyflakes", *paths], capture_output=True, text=True)
    assert run.returncode == 0 and not run.stdout.strip(), run.stdout + run.stderr
