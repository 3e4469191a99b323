"""python.pytest_plugin (and pip_install, installed): pytest over project/,
the outcomes it reports (its --junitxml) compared with EXPECTED.

usage: check_plugin.py --work DIR [--entry-point] [--quick]
  default        pytest -p pyfini_leakcheck (a checkout: PYTHONPATH=python)
  --entry-point  no -p: pytest must load the plugin by its pytest11 entry point
  --quick        only test_leak64 (it fails only where the plugin is loaded)
PYTHONPATH also holds the test modules (_pyfini_leak64, _pyfini_noleak64,
_pyfini_singlephase); $PYFINI_LEAKCHECK the tool, when set."""
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
PROJECT = os.path.join(HERE, "project")
OWN_GIL = sys.version_info >= (3, 12)

# test id -> (outcome, texts the message must hold)
EXPECTED = {
    "test_cases.test_leak64": ("failed", ["pyfini-leakcheck: LEAK (exit status 1)", "py.raw", "verdict: LEAK"]),
    "test_cases.test_noleak64": ("passed", []),
    "test_cases.test_clean": ("passed", []),
    "test_cases.test_crash": ("failed", ["CRASH: the worker", "exit status 3"]),
    "test_cases.test_hang": ("failed", ["HANG: cycle 1", "did not finish within 0.5 s"]),
    "test_cases.test_refused": (
        ("failed", ["the import was refused in this interpreter", "does not support loading in subinterpreters"])
        if OWN_GIL else ("failed", ["config 'isolated' needs CPython 3.12 or newer"])),
    "test_cases.test_assertion": ("failed", ["AssertionError: checksum in the new interpreter",
                                             "test_cases.py, line "]),
    "test_cases.test_params[3]": ("passed", []),
    "test_cases.test_fixture": ("error", ["can use no fixtures; it asks for: tmp_path"]),
    "test_cases.test_unrebuildable": ("failed", ["module-level name 'LOCK' (lock object)"]),
    "test_cases.test_unmarked": ("passed", []),
    "leakcheck-imports.lcpkg": ("passed", []),
    "leakcheck-imports.lcpkg.clean": ("passed", []),
    "leakcheck-imports.lcpkg.sub": ("passed", []),
    "leakcheck-imports.lcpkg.sub.leaky": ("failed", ["--import lcpkg.sub.leaky", "verdict: LEAK"]),
}
QUICK = ["test_cases.test_leak64"]   # enough to show the plugin is loaded: it fails


def outcomes(junit):
    got = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        key = f"{case.get('classname')}.{case.get('name')}"
        outcome, text = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                text = (el.get("message") or "") + "\n" + (el.text or "")
                break
        got[key] = (outcome, text)
    return got


def main():
    args = sys.argv[1:]
    work = args[args.index("--work") + 1]
    entry = "--entry-point" in args
    quick = "--quick" in args
    junit = os.path.join(work, "junit.xml")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={junit}", "-q", "-rN",
           f"--rootdir={PROJECT}", "--leakcheck-imports=lcpkg",
           # CI time: the fewest cycles that judge these modules alike on every CPython here
           "--leakcheck-cycles=8", "--leakcheck-warmup=2"]
    if not entry:
        cmd += ["-p", "pyfini_leakcheck"]
    if quick:
        cmd += ["-k", "test_leak64"]
    cmd.append(PROJECT)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
    env.pop("PYTEST_ADDOPTS", None)
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail = "\n".join(p.stdout.splitlines()[-15:])
    print(tail)
    if not os.path.exists(junit):
        print(f"FAIL: pytest wrote no {junit} (exit status {p.returncode}); its output:\n{p.stdout}")
        return 1
    got = outcomes(junit)
    want = {k: v for k, v in EXPECTED.items() if not quick or k in QUICK}
    bad = 0
    for key, (outcome, texts) in want.items():
        g = got.get(key)
        if g is None:
            print(f"FAIL {key}: not in pytest's report")
            bad += 1
            continue
        missing = [t for t in texts if t not in g[1]]
        if g[0] != outcome or missing:
            print(f"FAIL {key}: {g[0]} (expected {outcome}); missing from its message: {missing}\n{g[1][:3000]}")
            bad += 1
        else:
            print(f"ok   {key}: {outcome}")
    extra = sorted(set(got) - set(want))
    if extra:
        print(f"FAIL tests pytest reported and nobody expected: {extra}")
        bad += 1
    if p.returncode != 1:
        print(f"FAIL pytest's exit status {p.returncode}, expected 1 (tests failed)")
        bad += 1
    if bad:
        print(f"FAIL: {bad} of {len(want)} outcomes differ")
        return 1
    print(f"all {len(want)} outcomes as expected")
    return 0


sys.exit(main())
