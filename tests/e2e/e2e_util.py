"""What every end-to-end script shares: its arguments (the kiln binary, a work directory), the kiln
runner, check() that records failures, and finish() that reports them and sets the exit status.

    from e2e_util import KILN, WORK, check, kiln, finish   # test_x.py KILN WORKDIR
"""
import os
import shutil
import subprocess
import sys

KILN, WORK = sys.argv[1], sys.argv[2]
failures = []


def make_workdir(clean=False):
    """Creates WORK (emptied first when clean)."""
    if clean:
        shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK, exist_ok=True)


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run_kiln(*args, env=None):
    """kiln ARGS: (exit code, stdout, stderr)."""
    r = subprocess.run([KILN, *args], capture_output=True, text=True, env=env)
    return r.returncode, r.stdout, r.stderr


def kiln(*args, env=None):
    """kiln ARGS: (exit code, stdout and stderr together)."""
    rc, out, err = run_kiln(*args, env=env)
    return rc, out + err


def finish():
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)
