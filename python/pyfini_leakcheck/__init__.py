"""pyfini_leakcheck - run pyfini-leakcheck from Python and read its verdict.

    import pyfini_leakcheck
    result = pyfini_leakcheck.run(module="mymod", config="isolated", cycles=20)
    if result.exit_status != 0:
        print(result.report)

run() starts the tool (a C program: it embeds no Python; its worker creates
and ends the interpreters) with --json and --junit, and builds a Result from
the JSON document (its schema: docs/leakcheck.schema.json) and the text
report (the JUnit file carries it).  Nothing here measures anything itself.

The tool is found (find_tool): the argument tool=, the environment variable
PYFINI_LEAKCHECK, the pyfini-leakcheck installed with this package
(`cmake --install`, the .deb), then PATH.

Exit statuses (leakcheck/README.md): 0 no leak, 1 LEAK, 2 the subject failed
or bad input, 3 crash / hang / memory limit / broken descriptors / a failed
child, 4 not judged, 5 interrupted.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import xml.etree.ElementTree as ET

__all__ = ["run", "find_tool", "running_python_config", "Result", "Meter", "LeakcheckError", "ToolNotFound",
           "CONFIGS", "EXIT_STATUS"]
__version__ = "0.1.0"

# The pytest plugin (plugin.py), for pytest only: pytest registers this
# package by its entry point (pytest11 "pyfini_leakcheck") or by
# `-p pyfini_leakcheck`, and then the modules named here.  Without pytest
# the list is only a name.
pytest_plugins = ["pyfini_leakcheck.plugin"]

ENV_TOOL = "PYFINI_LEAKCHECK"
CONFIGS = ("legacy", "isolated", "own-obmalloc", "shared-obmalloc")
EXIT_STATUS = {0: "no leak", 1: "LEAK", 2: "the subject failed, or bad input", 3: "crash, hang or memory limit",
               4: "not judged", 5: "interrupted"}


class LeakcheckError(Exception):
    """pyfini-leakcheck could not be run, or did not answer with its JSON document."""


class ToolNotFound(LeakcheckError):
    """No pyfini-leakcheck executable was found (the places tried are in the message)."""


def _installed_tool():
    """The pyfini-leakcheck installed beside this package by `cmake --install`
    (and the .deb): _installed.py, written at install time, holds its path
    relative to this directory, so a moved prefix still works."""
    try:
        from . import _installed
    except ImportError:
        return None
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), _installed.TOOL_RELATIVE))


def find_tool(tool=None):
    """The path of the pyfini-leakcheck executable to run.

    In order: `tool` (a path, or a name looked up on PATH), $PYFINI_LEAKCHECK,
    the one installed with this package, `pyfini-leakcheck` on PATH.  Raises
    ToolNotFound naming every place tried."""
    tried = []

    def usable(path, how):
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
        tried.append(f"{how}: {path}" + (" (not an executable file)" if path else ""))
        return None

    if tool:
        p = usable(tool if os.sep in tool else shutil.which(tool) or tool, "tool=")
        if p:
            return p
        raise ToolNotFound(f"pyfini-leakcheck not found: {tried[-1]}")
    env = os.environ.get(ENV_TOOL)
    if env:
        p = usable(env, f"${ENV_TOOL}")
        if p:
            return p
        raise ToolNotFound(f"pyfini-leakcheck not found: {tried[-1]} (unset {ENV_TOOL} to search further)")
    p = _installed_tool()
    if p and usable(p, "installed beside the package"):
        return p
    p = shutil.which("pyfini-leakcheck")
    if p:
        return p
    tried.append("PATH: no pyfini-leakcheck")
    raise ToolNotFound("pyfini-leakcheck not found; tried " + "; ".join(tried) +
                       f". Build pyfini (cmake --build build) and set {ENV_TOOL}=build/pyfini-leakcheck, "
                       "install it (cmake --install, or the pyfini .deb), or pass tool=PATH")


def running_python_config():
    """The python3.X-config of the CPython running this code (what the tool's
    --python takes), or None when it is not installed (python3.X-dev)."""
    name = f"python{sysconfig.get_config_var('VERSION')}{getattr(sys, 'abiflags', '')}-config"
    for d in (sysconfig.get_config_var("BINDIR"), os.path.dirname(sys.executable)):
        p = os.path.join(d or "", name)
        if d and os.access(p, os.X_OK):
            return p
    return None


def _running_tag():
    v = sys.version_info
    return f"{v.major}.{v.minor}.{v.micro}{getattr(sys, 'abiflags', '')}"


class Meter:
    """One meter of a check: its verdict and the judged series' figure per cycle.

    name, available, exact (counts every block: judged by the exact rule),
    bytes_meter, verdict ("LEAK", "no leak", "inconclusive", "too few cycles",
    "no judged cycle", "unavailable"), judged ("excess", "subject" or "bare":
    which series decides), per_cycle and bound (of that series: units per
    cycle and its 99% bound; None when not judged), how (the tool's words),
    series: the raw dicts of the document ("subject", "bare", "excess")."""

    def __init__(self, name, doc):
        self.name = name
        self.doc = doc
        self.available = bool(doc.get("available"))
        self.exact = bool(doc.get("exact"))
        self.bytes_meter = bool(doc.get("bytes_meter"))
        self.verdict = doc.get("verdict")
        self.how = doc.get("how")
        self.series = {k: doc[k] for k in ("subject", "bare", "excess") if k in doc}
        self.judged = doc.get("judged")
        judged = self.series.get(self.judged) if self.judged else None
        self.per_cycle = judged.get("per_cycle") if judged else None
        self.bound = judged.get("bound") if judged else None

    def __repr__(self):
        return f"<Meter {self.name}: {self.verdict}, {self.per_cycle} ± {self.bound} per cycle>"


class Result:
    """What one pyfini-leakcheck check found.

    verdict       "LEAK", "no leak", "not judged", "crash", "hang", "memory limit",
                  "child failed", "interrupted", or "error" (the run ended before
                  its first cycle: the subject failed to import or raised, a
                  config this CPython lacks; see error and error_kind)
    exit_status   the tool's exit status (EXIT_STATUS)
    meters        {name: Meter}, in the tool's order
    leaking_meters  names of the meters judged LEAK
    pyfini_leaks  pyfini's leak reports on the subject's stderr, parsed by the tool
                  (per state: state, interpreter, objects, first_cycle, reports, types)
    where         --where's allocation sites (list of dicts), None without where=True
    crash         the crash / hang / memory-limit object of the document, or None
    error, error_kind  for verdict "error": the tool's message and its kind
    refused       the subject's import was refused in this kind of interpreter
                  (an ImportError naming sub-interpreters)
    report        the tool's text report (what pyfini-leakcheck prints without --json)
    document      the whole JSON document
    command       the command line that ran
    stderr        what the tool wrote on its stderr
    """

    def __init__(self, document, report, command, stderr):
        d = document
        self.document = d
        self.command = command
        self.stderr = stderr
        self.verdict = d.get("verdict")
        self.exit_status = d.get("exit_status")
        self.error = d.get("error")
        self.error_kind = d.get("error_kind")
        self.meters = {k: Meter(k, v) for k, v in (d.get("meters") or {}).items()}
        self.leaking_meters = list(d.get("leaking_meters") or [])
        self.pyfini_leaks = list((d.get("subject_stderr") or {}).get("pyfini_leaks") or [])
        self.where = d.get("where")
        self.crash = d.get("crash")
        self.python = d.get("python")
        self.config = d.get("config")
        self.cycles_finished = d.get("cycles_finished")
        self.cycles = d.get("cycles")
        self.early_stop = d.get("early_stop")
        self.report = report or self.error or ""

    @property
    def ok(self):
        """True only for the verdict "no leak" (exit status 0): never for a run
        that was not judged."""
        return self.exit_status == 0

    @property
    def refused(self):
        e = (self.error or "") + "\n" + self.report
        return self.verdict == "error" and "ImportError" in e and (
            "subinterpreter" in e or "sub-interpreter" in e)

    def __repr__(self):
        return f"<pyfini_leakcheck.Result {self.verdict!r}, exit status {self.exit_status}>"


def _junit_text(path):
    """The text report the tool put into its JUnit file (the <failure>,
    <error> or <skipped> text, or <system-out> of a pass)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    for case in root.iter("testcase"):
        for tag in ("failure", "error", "skipped", "system-out"):
            el = case.find(tag)
            if el is not None and el.text:
                return el.text
    return None


def _subject_args(module, code, file):
    args = []
    mods = [module] if isinstance(module, str) else list(module or [])
    for m in mods:
        if not isinstance(m, str) or not m:
            raise ValueError(f"module: a module name or a list of them, not {m!r}")
        args += ["--import", m]
    if code is not None:
        args += ["--code", code]
    if file is not None:
        args += ["--file", os.fspath(file)]
    return args


def run(module=None, code=None, file=None, *, config=None, cycles=None, warmup=None, python=None, where=False,
        max_bytes_per_cycle=None, timeout=None, baseline=True, early_stop=False, tool=None, env=None, cwd=None,
        extra_args=()):
    """Run one pyfini-leakcheck check and return its Result.

    module   a module name, or a list of them (--import, in order)
    code     Python source (--code), run as __main__ after the imports
    file     a Python file (--file), run as __main__ after the code
             (none of the three: the bare cycle itself is judged)
    config   "legacy" (the tool's default), "isolated", "own-obmalloc", "shared-obmalloc"
    cycles, warmup  judged rounds and warm-up cycles (tool defaults: 100, 10)
    early_stop  --early-stop: cycles is a cap; the run ends once its verdict
             held at two checkpoints (every 5 rounds) in a row
             (Result.early_stop: {"cap", "every", "checkpoints", "stopped_at"};
             Result.cycles: --cycles, or the rounds judged at the stop)
    python   which CPython: "X.Y", "X.Y.Z", "X.Yd" or a python3.X-config path;
             default the one running this code (its python3.X-config; the tool's
             build CPython is then checked to be this one if there is none)
    where    --where: the allocating call stacks (Result.where)
    timeout  --timeout: seconds a cycle may take before it is a hang
    env      environment of the tool (default os.environ); the worker's
             sys.path follows its PYTHONPATH
    tool     path of pyfini-leakcheck (default: find_tool())
    extra_args  more options, passed as they are

    Raises ToolNotFound, LeakcheckError (the tool could not run or printed
    no JSON document, or an internal/spawn error), ValueError (bad arguments).
    A subject that fails (ImportError, an exception) is a Result with verdict
    "error", not an exception."""
    if config is not None and config not in CONFIGS:
        raise ValueError(f"config: one of {', '.join(CONFIGS)}, not {config!r}")
    for name, v, lo in (("cycles", cycles, 1), ("warmup", warmup, 0)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < lo):
            raise ValueError(f"{name}: an integer >= {lo}, not {v!r}")
    exe = find_tool(tool)
    cmd = [exe, "--json"]
    if config:
        cmd += ["--config", config]
    cmd += _subject_args(module, code, file)
    if cycles is not None:
        cmd += ["--cycles", str(cycles)]
    if warmup is not None:
        cmd += ["--warmup", str(warmup)]
    check_version = None
    if python is None:
        python = running_python_config()
        if python is None:
            check_version = _running_tag()
    if python is not None:
        cmd += ["--python", os.fspath(python)]
    if where:
        cmd.append("--where")
    if max_bytes_per_cycle is not None:
        cmd += ["--max-bytes-per-cycle", str(max_bytes_per_cycle)]
    if timeout is not None:
        cmd += ["--timeout", str(timeout)]
    if not baseline:
        cmd.append("--no-baseline")
    if early_stop:
        cmd.append("--early-stop")
    cmd += [str(a) for a in extra_args]
    with tempfile.TemporaryDirectory(prefix="pyfini-leakcheck-") as tmp:
        junit = os.path.join(tmp, "report.xml")
        full = cmd + ["--junit", junit]
        try:
            p = subprocess.run(full, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=env, cwd=cwd)
        except OSError as e:
            raise LeakcheckError(f"cannot run {exe}: {e}") from e
        report = _junit_text(junit)
    out = p.stdout.decode("utf-8", "replace")
    err = p.stderr.decode("utf-8", "replace")
    if p.returncode < 0:
        raise LeakcheckError(f"{exe} was killed by signal {-p.returncode}; its stderr:\n{err}")
    try:
        doc = json.loads(out)
    except ValueError:
        raise LeakcheckError(f"{exe} exited with status {p.returncode} without a JSON document; "
                             f"its stderr:\n{err.strip() or '(empty)'}") from None
    if not isinstance(doc, dict) or doc.get("tool") != "pyfini-leakcheck" or "exit_status" not in doc:
        raise LeakcheckError(f"{exe} printed something that is not pyfini-leakcheck's JSON document")
    if doc.get("mode") == "scan":
        raise LeakcheckError("run() makes one check; this document is a --scan")
    if doc.get("exit_status") != p.returncode:
        raise LeakcheckError(f"{exe} exited with status {p.returncode}, its document says {doc.get('exit_status')}")
    if doc.get("verdict") == "error" and doc.get("error_kind") in ("internal", "spawn"):
        raise LeakcheckError(f"{exe} could not run the check ({doc.get('error_kind')}): {doc.get('error')}\n{err}")
    result = Result(doc, report, full, err)
    if check_version and result.python:
        got = result.python.get("version", "") + result.python.get("abiflags", "")
        if got != check_version:
            raise LeakcheckError(f"this is CPython {check_version}, which has no python3.X-config (install its -dev "
                                 f"package), and {exe} runs CPython {got}: pass python= to choose one")
    return result
