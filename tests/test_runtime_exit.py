"""Every areal process ends through ``run_main``: the exit code says what happened, what was printed
arrives, and a thread still running cannot keep the process alive."""

import subprocess
import sys

import pytest

CASES = {
    "return": ("pass", 0, ""),
    "sys.exit()": ("sys.exit()", 0, ""),
    "sys.exit(3)": ("sys.exit(3)", 3, ""),
    "sys.exit(message)": ("sys.exit('no such model: put it under models/')", 1,
                          "no such model: put it under models/"),
    "exception": ("raise ValueError('bad reward code')", 1, "ValueError: bad reward code"),
}


@pytest.mark.parametrize("case", CASES)
def test_run_main_ends_with_the_code_of_what_happened(case):
    body, code, err = CASES[case]
    script = (
        "import sys, threading, time\n"
        "from areal_cli.runtime import run_main\n"
        "def main():\n"
        "    threading.Thread(target=time.sleep, args=(600,)).start()  # not a daemon: would block "
        "a plain exit\n"
        "    print('done so far', end='')  # no newline: flushed only by the exit\n"
        f"    {body}\n"
        "run_main(main)\n"
    )
    got = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert got.returncode == code, got.stderr
    assert got.stdout == "done so far"
    assert err in got.stderr
