# mglaunch's hook for Python tracebacks (docs/troubleshooting.md), built into mglaunch, which
# writes it into a directory of its own and puts that directory first on the PYTHONPATH of
# Python workers. It registers faulthandler on the signal mglaunch names (MG_PY_TRACEBACK), to
# write the traceback of every thread into the descriptor mglaunch lends this rank
# (MG_PY_TRACEBACK_FD), never the worker's stdout or stderr. Then it leaves no trace: the two
# variables are removed, PYTHONPATH and sys.path are as they were, and the sitecustomize that
# Python would have run without it (Debian's, a virtualenv's, the user's) runs.
import os as _os
import sys as _sys


def _mg_hook():
    here = _os.path.dirname(_os.path.abspath(__file__))
    spec = _os.environ.pop("MG_PY_TRACEBACK", "").split(":")
    fd = _os.environ.pop("MG_PY_TRACEBACK_FD", "")
    path = _os.environ.get("PYTHONPATH")
    # "<here>" when the user had no PYTHONPATH, "<here>:<theirs>" when they had one
    had = len(spec) > 1 and spec[1] == "1"
    if path is not None and (path == here or path.startswith(here + _os.pathsep)):
        if had:
            _os.environ["PYTHONPATH"] = path[len(here) + 1:]
        else:
            del _os.environ["PYTHONPATH"]
    if here in _sys.path:
        _sys.path.remove(here)
    try:
        sig, fd = int(spec[0]), int(fd)
    except ValueError:
        return
    try:
        import faulthandler

        _os.set_inheritable(fd, False)  # the worker's own children do not keep it
        # chain=False: the handler is installed with SA_RESTART
        faulthandler.register(sig, file=fd, all_threads=True, chain=False)
    except Exception as e:  # a Python without faulthandler.register (not CPython)
        try:
            _os.write(fd, ("mglaunch: no Python tracebacks: %s: %s: %s\n"
                           % (_sys.implementation.name, type(e).__name__, e)).encode())
        except OSError:
            pass


_mg_hook()
del _mg_hook

# The next sitecustomize on sys.path, as if this one were not there.
_mg_self = _sys.modules.pop(__name__)
try:
    import sitecustomize  # noqa: F401
except ImportError as _mg_e:
    if _mg_e.name != "sitecustomize":
        raise  # an error inside that module: site reports it as it would have
    _sys.modules[__name__] = _mg_self  # there is none: the import system wants one
