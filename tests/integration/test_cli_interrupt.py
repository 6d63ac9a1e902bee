"""A Ctrl-C as `league` starts, while `league_cli.main` itself is still importing (before `main()` runs, which
answers a Ctrl-C during a command's imports with "league: interrupted", exit 130): the same answer, not a
KeyboardInterrupt traceback. Pressed within the first half second of `league coordinator` on a busy machine,
it was a traceback out of `import subprocess` and a death by SIGINT.
"""

from __future__ import annotations

import subprocess
import sys


def test_ctrl_c_while_the_cli_module_imports_exits_130_without_a_traceback():
    # An audit hook sends the SIGINT at a fixed import, so the test does not depend on timing; the import runs as
    # the console script's `from league_cli.main import main` does.
    child = (
        "import os, signal, sys\n"
        # A shell's background job starts with SIGINT ignored, and Python keeps it so: the test's own setting.
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "def hook(event, args):\n"
        "    if event == 'import' and args[0] == 'league_cli.processes':\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "sys.addaudithook(hook)\n"
        "from league_cli.main import main\n"
        "sys.exit(main(['health', '--help']))\n"
    )
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert out.returncode == 130, out.stderr
    assert "Traceback" not in out.stderr and "league: interrupted" in out.stderr
