# tests/pybind11/features/exercise.py - uses what pb11_features bound (calls,
# iterates, raises and catches, subclasses in Python, pickles), in the
# interpreter pyfini-leakcheck creates. Run with --file.
import abc
import array
import os
import pickle

if os.environ.get("PB11_ALSO_IMPORT"):   # an attached module imported first (pb11_a)
    __import__(os.environ["PB11_ALSO_IMPORT"])
import pb11_features as m

F = set(m.features)

# Each feature's use runs in a function: what it makes dies when the function
# returns (module-level names would live in __main__'s dict, which a
# std::function or py::object member could hold in a cycle the GC cannot see).


def use_enums():
    assert m.next_color(m.Color.red) == m.Color.green and m.Color.red.name == "red"
    assert int(m.Flags.a | m.Flags.b) == 3 and m.a == m.Flags.a
    assert "red" in m.Color.__members__ and m.Color.__doc__ is not None
    assert m.mode_name(m.Mode.safe) == "safe" and m.Mode.fast.name == "fast"


def use_statics():
    m.Config.level = 4
    assert m.Config.level == 4 and m.Config.name == "config" and m.Config.doubled == 8
    m.Config.counter = 5
    assert m.Config.counter == 5 and isinstance(m.Config.make(), m.Config)
    assert m.Point.origin.x == 0.0


def use_exceptions():
    for fn, exc in ((m.raise_my, m.MyError), (m.raise_other, ValueError), (m.raise_translated, KeyError),
                    (m.raise_local, OSError), (m.raise_std, IndexError)):
        try:
            fn()
        except exc:
            pass
        else:
            raise AssertionError(fn)
    assert "mine" in m.call_and_catch(m.raise_my)
    assert issubclass(m.PlainError, Exception)


def use_holders():
    assert m.make_shared().v == 1 and m.Shared().v == 1
    s = m.make_unique_smart()
    assert s.s == "unique" and m.consume_smart(s) == "unique"


def use_trampolines():
    class Dog(m.Animal):
        def speak(self):
            return "woof"

        def legs(self):
            return 4
    d = Dog()
    assert m.describe(d) == "woof:4" and m.keep_animal(d) == 4

    class Square(m.Shape):
        def area(self):
            return 4.0
    assert m.total_area([Square(), m.Shape()]) == 4.0


def use_inheritance():
    b = m.Both()
    b.extra = [b]   # a cycle through the instance dict
    assert b.a + b.b + b.c == 6 and m.sum_base2(b) == 2
    # a Python metaclass deriving from pybind11's (abstract pybind11 subclasses)

    class ABCPb(type(m.Base1), abc.ABCMeta):
        pass

    class Iface(m.Base1, metaclass=ABCPb):
        @abc.abstractmethod
        def f(self):
            pass

    class Impl(Iface):
        def f(self):
            return 1
    assert Impl().f() == 1 and Impl().a == 1
    try:
        class Sub(m.Final):
            pass
    except TypeError:
        pass
    else:
        raise AssertionError("is_final")

    class PyOpen(m.Open):
        pass
    o = PyOpen()
    o.me = o
    assert m.Local().l == 5 and m.TypeMeta().t == 6 and type(m.TypeMeta) is type


def use_buffers():
    mx = m.Matrix()
    assert memoryview(mx).shape == (2, 3) and m.buffer_sum(mx) == 9.0
    assert len(m.view(mx)) == 6 and m.buffer_sum(array.array("f", [1.0, 2.0])) == 3.0
    try:
        m.buffer_sum(bytearray(8))
    except TypeError:
        pass
    else:
        raise AssertionError("buffer_sum(bytearray)")


def use_pickle():
    p = m.Pickled("v")
    p.attr = 1
    q = pickle.loads(pickle.dumps(p))
    assert q.value == "v" and m.Made(3).v == 3 and m.Made("abcd").v == 4


def use_containers():
    v = m.DoubleVector([1.0, 2.0])
    v.append(3.0)
    assert m.sum_vector(v) == 6.0 and list(v) == [1.0, 2.0, 3.0]
    dm = m.DoubleMap()
    dm["x"] = 1.5
    assert dict(dm.items()) == {"x": 1.5}
    assert m.round_trip(["a"], {1: {2}}, None, "s") == (["a"], {1: {2}}, None, "s")


def use_iterators():
    bag = m.Bag()
    assert list(bag) == [1, 2, 3] and sorted(bag.keys()) == ["a", "b"] and sorted(bag.values()) == [1, 2]


def use_callables():
    assert m.apply(lambda x: x * 2, 3) == 6 and m.make_adder(2)(3) == 5
    lst = m.Listener()
    lst.set(lambda x: x + 1)
    assert lst.fire(1) == 2


def use_objects():
    par = m.Parent()
    ch = par.get_child()
    assert ch.v == 9 and m.Parent().copy_child().v == 9
    kept = par.take([1, 2])
    ow = m.Owner()
    ow.held = [par]
    c = m.capsule()
    assert m.capsule_value(c) == 42
    seen = []

    class Target:
        pass
    t = Target()
    w = m.weak(t, seen.append)
    del t
    assert len(seen) == 1 and w() is None
    assert m.with_defaults() == 3 and m.decimal_module().dumps(1) == "1"


def use_submodules():
    assert m.sub.f() == 1 and m.sub.deeper.g() == 2
    assert m.import_other() == 5


for _name in sorted(F):
    globals()["use_" + _name]()

# References the garbage collector cannot see, which no adapter can free:
# PB11_CYCLES=1 adds them (pybind11_features_uncollectable expects the
# adapter's report to name the classes whose instances they keep alive).
if os.environ.get("PB11_CYCLES") == "1":
    lst2 = m.Listener()
    lst2.set(lambda x: x + len([lst2]))   # a std::function member holding a callable that holds it
    ow2 = m.Owner()
    ow2.held = ow2                        # a py::object member holding its own instance
