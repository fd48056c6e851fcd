import os
import subprocess
import sys

import pytest

ROOT = os.environ.get("DCR_SOURCE_ROOT", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
EXAMPLES = os.path.join(ROOT, "examples", "python")
sys.path.insert(0, EXAMPLES)


def run_example(name, *args, timeout=600):
    """Runs examples/python/NAME with the same interpreter and module path; returns stdout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([EXAMPLES, env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, os.path.join(EXAMPLES, name), *args], env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{name} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return p.stdout


@pytest.fixture
def example():
    return run_example
