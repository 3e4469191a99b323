"""The code a marked test runs in each created-and-ended interpreter.

A test function cannot be handed to another interpreter: its objects belong
to the interpreter that runs pytest.  So its source is taken (inspect), its
decorators dropped, and what it names at module level is rebuilt ahead of
it in the new interpreter:

  a module                         import X as name
  a function or class of the       its source, and in turn what it names
  test file
  a function, class or other       from M import Q as name (checked: the
  object importable by name        import gives the same object)
  a literal (numbers, strings,     name = repr(value)
  bytes, None, bool, and tuples,
  lists, dicts, sets of them)

Anything else (an instance built at import time, a lambda, a fixture's
value) is refused with a message naming it: rebuilding it would not be the
object the test meant.  The function itself is compiled with its own file
name and line numbers, so a traceback names the test file's lines.
"""

import ast
import builtins
import importlib
import inspect
import os
import symtable
import textwrap
import types

_LITERAL_TYPES = (int, float, complex, str, bytes, bool, type(None))


class SubjectError(ValueError):
    """The test cannot be run in another interpreter (the message says why)."""


def _is_literal(v, depth=0):
    if depth > 20:
        return False
    if isinstance(v, _LITERAL_TYPES):
        return type(v) in _LITERAL_TYPES
    if type(v) in (tuple, list, set, frozenset):
        return all(_is_literal(x, depth + 1) for x in v)
    if type(v) is dict:
        return all(_is_literal(k, depth + 1) and _is_literal(x, depth + 1) for k, x in v.items())
    return False


def _literal(v):
    if type(v) is frozenset:
        return f"frozenset({_literal(set(v)) if v else '()'})"
    if type(v) is set and not v:
        return "set()"
    text = repr(v)
    try:
        if ast.literal_eval(text) == v or v != v:
            return text
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        pass
    return None


def _free_names(source, filename):
    """Names a top-level snippet (a def or class) uses but does not define:
    its module-level references and the implicit globals of every nested
    scope."""
    top = symtable.symtable(source, filename, "exec")
    defined = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    free = set()
    for s in top.get_symbols():
        if s.is_referenced() and s.get_name() not in defined:
            free.add(s.get_name())
    stack = list(top.get_children())
    while stack:
        t = stack.pop()
        for s in t.get_symbols():
            if (s.is_global() or s.is_declared_global()) and s.get_name() not in defined:
                free.add(s.get_name())
        stack.extend(t.get_children())
    return sorted(free)


def _def_source(obj, what):
    """Source of a function or class, dedented; its first line number in its file."""
    try:
        lines, first = inspect.getsourcelines(obj)
    except (OSError, TypeError) as e:
        raise SubjectError(f"{what}: its source is not available ({e})") from None
    return textwrap.dedent("".join(lines)), first


class _Prelude:
    def __init__(self, module_name, namespace, filename):
        self.module_name = module_name
        self.ns = namespace
        self.filename = filename
        self.lines = []
        self.done = set()
        self.visiting = set()

    def need(self, names, user):
        for name in names:
            self.one(name, user)

    def one(self, name, user):
        if name in self.done or name in self.visiting:
            return
        if name not in self.ns:
            if hasattr(builtins, name):
                return
            # as in the test itself: a NameError when (if) the line runs
            return
        v = self.ns[name]
        self.visiting.add(name)
        try:
            self.lines.extend(self.rebuild(name, v, user))
        finally:
            self.visiting.discard(name)
        self.done.add(name)

    def rebuild(self, name, v, user):
        if isinstance(v, types.ModuleType):
            if name == v.__name__ and "." not in name:
                return [f"import {name}"]
            return [f"import {v.__name__} as {name}"]
        if _is_literal(v):
            text = _literal(v)
            if text is not None:
                return [f"{name} = {text}"]
        mod = getattr(v, "__module__", None)
        qual = getattr(v, "__qualname__", None)
        if (isinstance(v, (types.FunctionType, type)) and mod == self.module_name and qual == name
                and getattr(v, "__name__", None) != "<lambda>"):
            src, first = _def_source(v, f"{name} (used by {user})")
            self.need(_free_names(src, self.filename), name)
            return [self.compiled(src, first)]
        if mod and qual and "<" not in qual and mod != self.module_name and mod != "__main__":
            try:
                obj = importlib.import_module(mod)
                for part in qual.split("."):
                    obj = getattr(obj, part)
            except Exception:
                obj = None
            if obj is v:
                if "." in qual:
                    return [f"import {mod} as __pyfini_m", f"{name} = __pyfini_m.{qual}", "del __pyfini_m"]
                return [f"from {mod} import {qual} as {name}"]
        raise SubjectError(
            f"{user} uses the module-level name {name!r} ({type(v).__name__} object), which cannot be rebuilt in "
            "another interpreter: a marked test may use modules, functions and classes of its file or importable "
            "by name, and literals (numbers, strings, bytes, None and tuples, lists, dicts, sets of them); "
            f"build {name!r} inside the test instead")

    def compiled(self, src, first):
        # compiled with the test file's name and lines: tracebacks point there
        pad = f'"\\n" * {first - 1} + ' if first > 1 else ""
        return f"exec(compile({pad}{src!r}, {self.filename!r}, 'exec'))"


def subject_code(func, params=None):
    """The --code source that runs func(**params) once, with what it names.

    params: argument values (pytest.mark.parametrize's), rebuilt as literals."""
    func = inspect.unwrap(func)
    if not isinstance(func, types.FunctionType):
        raise SubjectError(f"{func!r} is not a Python function")
    if inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
        raise SubjectError(f"{func.__qualname__}: an async test cannot be marked leakcheck")
    if func.__qualname__ != func.__name__:
        raise SubjectError(f"{func.__qualname__}: only module-level test functions can be marked leakcheck "
                           "(not methods of a test class)")
    filename = inspect.getsourcefile(func) or func.__code__.co_filename
    # relative to the working directory (which the tool's worker shares)
    # when below it: reports stay short and name the file as pytest does
    rel = os.path.relpath(filename)
    if not rel.startswith(os.pardir + os.sep):
        filename = rel
    lines, first = inspect.getsourcelines(func)
    text = textwrap.dedent("".join(lines))
    tree = ast.parse(text)
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef):
        raise SubjectError(f"{func.__qualname__}: its source is not a def")
    # from the def line on: the decorators (pytest's marks) stay behind
    src = "".join(text.splitlines(keepends=True)[node.lineno - 1:])
    pre = _Prelude(func.__module__, func.__globals__, filename)
    pre.done.add(func.__name__)
    pre.need(_free_names(src, filename), func.__name__)
    args = []
    for k, v in (params or {}).items():
        text = _literal(v) if _is_literal(v) else None
        if text is None:
            raise SubjectError(f"{func.__name__}: the parameter {k}={v!r} is not a literal, so it cannot be passed "
                               "to another interpreter")
        args.append(f"{k}={text}")
    out = list(pre.lines)
    out.append(pre.compiled(src, first + node.lineno - 1))
    out.append(f"{func.__name__}({', '.join(args)})")
    return "\n".join(out) + "\n"
