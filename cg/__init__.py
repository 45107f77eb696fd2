"""``cg``: the command-line tool of pcgroups (cg/main.py is the console script).

The version lives here, so ``cg --version`` imports nothing else."""

VERSION = "0.1.0"
