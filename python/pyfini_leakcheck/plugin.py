"""pytest plugin of pyfini-leakcheck (entry point pytest11 "pyfini_leakcheck";
from a checkout: pytest -p pyfini_leakcheck.plugin).

    @pytest.mark.leakcheck(config="isolated", cycles=20)
    def test_import_mymod():
        import mymod

runs the test's body in `cycles` created-and-ended interpreters (and as
many bare ones, whose loss is subtracted) instead of once in pytest's own,
and fails the test with pyfini-leakcheck's text report on LEAK, a crash, a
hang, an exception or refused import in the new interpreter, and on "not
judged" (a checker never passes what it did not judge).

Marker arguments: config ("legacy", "isolated", "own-obmalloc",
"shared-obmalloc"; default --leakcheck-config), cycles, warmup (default
--leakcheck-cycles, --leakcheck-warmup), timeout (seconds per cycle),
max_bytes_per_cycle, where (--where: the report names the allocating call
stacks), python (another CPython: "3.14", a python3.X-config path),
early_stop (default True: cycles is a cap, the run ends once its verdict
held at two checkpoints - every 5 rounds - in a row; --leakcheck-no-early-stop
turns it off for every test).

Fixtures: none.  A marked test runs in other interpreters, where pytest's
fixture objects do not exist; a test that asks for a fixture (an argument,
usefixtures, an autouse fixture) is refused with an error naming it.
Arguments of pytest.mark.parametrize are passed when they are literals.
What the body names at module level is rebuilt in each interpreter (see
_subject.py): modules, functions and classes of the test file or importable
by name, and literals.

--leakcheck-imports=PKG[,PKG] adds one test per module of each package
(the package and every submodule below it, found on the file system without
importing them; __main__ modules left out): "--import MODULE" in the
--leakcheck-config interpreters.
"""

import importlib.util
import os
import pkgutil
import sys

import pytest

from . import CONFIGS, LeakcheckError, run
from ._subject import SubjectError, subject_code

DEFAULT_CYCLES = 20
DEFAULT_WARMUP = 5
_MARKER_ARGS = ("config", "cycles", "warmup", "timeout", "max_bytes_per_cycle", "where", "python", "early_stop")


def pytest_addoption(parser):
    g = parser.getgroup("leakcheck", "pyfini-leakcheck: tests run in created-and-ended interpreters")
    g.addoption("--leakcheck-imports", action="append", default=[], metavar="PKG[,PKG]",
                help="add one test per module of each package: does it import and end cleanly in new "
                     "interpreters, and what does a cycle lose")
    g.addoption("--leakcheck-config", default="legacy", choices=CONFIGS,
                help="interpreter config of --leakcheck-imports' tests and of marked tests that name none "
                     "(default legacy)")
    g.addoption("--leakcheck-cycles", type=int, default=DEFAULT_CYCLES, metavar="N",
                help=f"judged rounds when the marker names none (default {DEFAULT_CYCLES}; at least 4)")
    g.addoption("--leakcheck-warmup", type=int, default=DEFAULT_WARMUP, metavar="W",
                help=f"warm-up cycles when the marker names none (default {DEFAULT_WARMUP})")
    g.addoption("--leakcheck-no-early-stop", action="store_true", default=False,
                help="run every judged round of every check (default: stop once the verdict held at two "
                     "checkpoints in a row, pyfini-leakcheck --early-stop)")
    g.addoption("--leakcheck-tool", default=None, metavar="PATH",
                help="the pyfini-leakcheck executable (default: $PYFINI_LEAKCHECK, the installed one, PATH)")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "leakcheck(config=None, cycles=None, warmup=None, timeout=None, max_bytes_per_cycle=None, where=False, "
        "python=None, early_stop=True): run the test's body in created-and-ended interpreters with pyfini-leakcheck; fail on "
        "LEAK, crash, hang, refused import or not judged. No fixtures.")


def _marker_kwargs(item, marker):
    if marker.args:
        raise pytest.UsageError(f"{item.nodeid}: leakcheck takes keyword arguments only "
                                f"({', '.join(_MARKER_ARGS)})")
    bad = sorted(set(marker.kwargs) - set(_MARKER_ARGS))
    if bad:
        raise pytest.UsageError(f"{item.nodeid}: leakcheck has no argument {', '.join(bad)} "
                                f"(it takes {', '.join(_MARKER_ARGS)})")
    return dict(marker.kwargs)


def _check(item, **kw):
    opt = item.config.getoption
    kw.setdefault("config", opt("leakcheck_config"))
    kw.setdefault("cycles", opt("leakcheck_cycles"))
    kw.setdefault("warmup", opt("leakcheck_warmup"))
    kw.setdefault("early_stop", not opt("leakcheck_no_early_stop"))
    env = dict(os.environ)
    if kw.get("python") is None:
        # the worker runs this CPython: it sees what this pytest sees
        path = [p for p in sys.path if p and os.path.isdir(p)]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
    try:
        result, why = run(tool=opt("leakcheck_tool"), env=env, **kw), None
    except (LeakcheckError, ValueError) as e:
        result, why = None, str(e)
    if result is None:
        pytest.fail(f"pyfini-leakcheck could not run: {why}", pytrace=False)
    item.user_properties.append(("leakcheck_verdict", result.verdict))
    if result.ok:
        return result
    what = {"LEAK": "LEAK", "not judged": "not judged (never read as no leak)", "error": "the subject failed"}
    head = what.get(result.verdict, result.verdict)
    if result.refused:
        head = "the import was refused in this interpreter"
    pytest.fail(f"pyfini-leakcheck: {head} (exit status {result.exit_status})\n{result.report}", pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    marker = item.get_closest_marker("leakcheck")
    if marker is None or isinstance(item, LeakcheckImportItem):
        return
    _marker_kwargs(item, marker)
    params = getattr(getattr(item, "callspec", None), "params", {})
    fixtures = [f for f in getattr(item, "fixturenames", ()) if f not in params]
    if fixtures:
        pytest.fail(f"{item.nodeid}: a test marked leakcheck runs in other interpreters and can use no fixtures; "
                    f"it asks for: {', '.join(fixtures)} (arguments, usefixtures or autouse fixtures)",
                    pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    marker = pyfuncitem.get_closest_marker("leakcheck")
    if marker is None:
        return None
    kw = _marker_kwargs(pyfuncitem, marker)
    params = getattr(getattr(pyfuncitem, "callspec", None), "params", {})
    try:
        code = subject_code(pyfuncitem.obj, params)
    except SubjectError as e:
        code, why = None, str(e)
    if code is None:
        pytest.fail(f"{pyfuncitem.nodeid}: cannot run in other interpreters: {why}", pytrace=False)
    _check(pyfuncitem, code=code, **kw)
    return True


def _modules_of(pkg):
    """pkg and the modules below it, from the file system (not imported)."""
    try:
        spec = importlib.util.find_spec(pkg)
    except (ImportError, ValueError) as e:
        raise pytest.UsageError(f"--leakcheck-imports {pkg}: {e}") from None
    if spec is None:
        raise pytest.UsageError(f"--leakcheck-imports {pkg}: no such module or package on sys.path")
    names = [pkg]

    def walk(paths, prefix):
        for info in pkgutil.iter_modules(paths, prefix):
            if info.name.rsplit(".", 1)[-1] == "__main__":
                continue
            names.append(info.name)
            if info.ispkg:
                base = getattr(info.module_finder, "path", None)
                if base:
                    walk([os.path.join(base, info.name.rsplit(".", 1)[-1])], info.name + ".")

    if spec.submodule_search_locations:
        walk(list(spec.submodule_search_locations), pkg + ".")
    return sorted(names)


class LeakcheckImportItem(pytest.Item):
    """--leakcheck-imports: pyfini-leakcheck --import MODULE."""

    def __init__(self, *, module, **kw):
        super().__init__(**kw)
        self.module = module

    def runtest(self):
        _check(self, module=self.module)

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, pytest.fail.Exception):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"leakcheck import {self.module}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    pkgs = [p.strip() for opt in config.getoption("leakcheck_imports") for p in opt.split(",") if p.strip()]
    for pkg in dict.fromkeys(pkgs):
        for mod in _modules_of(pkg):
            items.append(LeakcheckImportItem.from_parent(session, name=mod, nodeid=f"leakcheck-imports::{mod}",
                                                         module=mod))
