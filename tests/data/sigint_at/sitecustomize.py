"""A Ctrl-C at a chosen moment, for tests/test_cli_ux.py: with this directory on PYTHONPATH, the process
sends itself SIGINT when it first imports the module ``PCG_TEST_SIGINT_AT`` names, and writes that module's
name to the file ``PCG_TEST_SIGINT_SEEN`` names (so a test knows the moment came)."""

import os
import signal
import sys

_AT = os.environ.get("PCG_TEST_SIGINT_AT")


class _Trap:
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == _AT:
            sys.meta_path.remove(self)
            with open(os.environ["PCG_TEST_SIGINT_SEEN"], "w") as seen:
                seen.write(name)
            os.kill(os.getpid(), signal.SIGINT)


if _AT:
    sys.meta_path.insert(0, _Trap())
