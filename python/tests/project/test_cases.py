"""The pytest plugin's test project (python/tests/check-plugin runs pytest on
it and compares the outcomes pytest reports with EXPECTED there)."""
import threading

import pytest

import _pyfini_noleak64

PAYLOAD = {"name": "pyfini", "sizes": (64, 128), "flags": [True, None]}
LOCK = threading.Lock()


def checksum(data):
    return sum(len(str(k)) + len(repr(v)) for k, v in data.items())


class Counter:
    def __init__(self):
        self.n = 0

    def add(self, k):
        self.n += k
        return self


# docs: begin leak
@pytest.mark.leakcheck
def test_leak64():
    import _pyfini_leak64  # noqa: F401


@pytest.mark.leakcheck
def test_noleak64():
    import _pyfini_noleak64  # noqa: F401
# docs: end leak


@pytest.mark.leakcheck
def test_clean():
    # module-level names of this file: a module, a literal, a function, a class
    assert _pyfini_noleak64.__name__ == "_pyfini_noleak64"
    assert checksum(PAYLOAD) == Counter().add(checksum(PAYLOAD)).n


@pytest.mark.leakcheck
def test_crash():
    import ctypes
    ctypes.string_at(0)


@pytest.mark.leakcheck(config="isolated")
def test_refused():
    import _pyfini_singlephase  # noqa: F401


@pytest.mark.leakcheck
def test_assertion():
    assert checksum(PAYLOAD) == 0, "checksum in the new interpreter"


@pytest.mark.leakcheck
@pytest.mark.parametrize("n", [3])
def test_params(n):
    assert Counter().add(n).n == n


@pytest.mark.leakcheck
def test_fixture(tmp_path):
    tmp_path.joinpath("x").write_text("x")


@pytest.mark.leakcheck
def test_unrebuildable():
    with LOCK:
        pass


def test_unmarked():
    assert checksum(PAYLOAD) > 0


@pytest.mark.leakcheck(warmup=0, timeout=0.5)
def test_hang():
    import time
    time.sleep(10)
