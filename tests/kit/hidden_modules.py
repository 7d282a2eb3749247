"""Run a Python snippet as if some top-level modules were not installed.

`HIDE` is a script prelude for `python -c`: its first argument is a comma-separated list of
top-level module names, hidden from every import (their submodules too); the rest of argv is
handed on as `researcher`'s. Why not uninstall them: the tests that check how the CLI behaves
without an extra run in the full venv, and must not break it for the tests beside them.
"""

HIDE = """
import sys

HIDDEN = set(sys.argv[1].split(","))


class Hidden:
    '''Wraps a meta-path finder: the hidden top-level modules (and their submodules) are not there.'''

    def __init__(self, inner):
        self._inner = inner

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        return self._inner.find_spec(name, path, target)

    def __getattr__(self, attr):  # invalidate_caches, find_distributions...
        return getattr(self._inner, attr)


sys.meta_path[:] = [Hidden(f) for f in sys.meta_path]
sys.argv = ["researcher", *sys.argv[2:]]
"""

RUN_CLI = HIDE + "from researcher.cli import main\nmain()\n"
