"""Runs the property fuzz of every op and `.out` overload (fuzz_ops_child.py: derandomized,
bounded) in its own process, so a crash fails this test instead of killing the run."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_fuzz_every_op_and_out_overload():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, os.path.join(ROOT, "test", "fuzz_ops_child.py"), "400"],
                            capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    assert result.returncode == 0 and "fuzz: ok" in result.stdout, (
        f"exit code {result.returncode}\nstdout:\n{result.stdout[-8000:]}\nstderr:\n{result.stderr[-8000:]}")
