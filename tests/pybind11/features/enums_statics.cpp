// tests/pybind11/features/enums_statics.cpp - enums and static members.
#include <pybind11/native_enum.h>

#include "features.h"

namespace {
enum class Color { red = 1, green = 2 };
enum Flags { flag_a = 1, flag_b = 2 };
enum class Mode { fast, safe };
struct Config {
    static int level;
    static const char *const name;
    static int counter;
    int x = 0;
};
int Config::level = 3;
const char *const Config::name = "config";
int Config::counter = 0;
struct Point {
    double x = 0, y = 0;
};
}  // namespace

void bind_enums(py::module_ &m)
{
    py::enum_<Color>(m, "Color").value("red", Color::red).value("green", Color::green);
    py::enum_<Flags>(m, "Flags", py::arithmetic()).value("a", flag_a).value("b", flag_b).export_values();
    py::native_enum<Mode>(m, "Mode", "enum.Enum").value("fast", Mode::fast).value("safe", Mode::safe).finalize();
    m.def("next_color", [](Color c) { return c == Color::red ? Color::green : Color::red; });
    m.def("mode_name", [](Mode md) { return md == Mode::fast ? "fast" : "safe"; });
}

void bind_statics(py::module_ &m)
{
    py::class_<Config> c(m, "Config");
    c.def(py::init<>())
        .def_readwrite_static("level", &Config::level)
        .def_readonly_static("name", &Config::name)
        .def_property_static("counter", [](py::object) { return Config::counter; },
                             [](py::object, int v) { Config::counter = v; })
        .def_property_readonly_static("doubled", [](py::object) { return 2 * Config::level; })
        .def_static("make", []() { return Config{}; });
    py::class_<Point> p(m, "Point");
    p.def(py::init<>()).def_readwrite("x", &Point::x).def_readwrite("y", &Point::y);
    p.attr("origin") = Point{};   // a class attribute holding an instance of itself
}
