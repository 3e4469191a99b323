// tests/pybind11/features/pb11_features.cpp - the module (see features.h).
#include "features.h"

#include <cstdlib>
#include <cstring>
#include <string>

namespace {

bool wanted(const char *feature)
{
    const char *v = std::getenv("PB11_FEATURES");
    std::string list = v != nullptr && *v != '\0' ? v : "all";
    if (list == "all") {
        return true;
    }
    std::string item;
    for (size_t i = 0; i <= list.size(); i++) {
        if (i == list.size() || list[i] == ',') {
            if (item == feature) {
                return true;
            }
            item.clear();
        } else {
            item += list[i];
        }
    }
    return false;
}

}  // namespace

PYBIND11_MODULE(pb11_features, m, py::multiple_interpreters::per_interpreter_gil())
{
    // PB11_FEATURES_ATTACH (else PB11_ATTACH) = 0: this module plain, e.g.
    // beside an attached pb11_a (a module its user cannot rebuild)
    const char *a = std::getenv("PB11_FEATURES_ATTACH");
    if (a == nullptr) {
        a = std::getenv("PB11_ATTACH");
    }
    bool adapter = a == nullptr || std::strcmp(a, "0") != 0;
    if (adapter) {
        pyfini_pybind11::attach();
    }
    m.attr("adapter") = py::bool_(adapter);
    struct {
        const char *name;
        void (*bind)(py::module_ &);
    } const all[] = {
        {"enums", bind_enums},           {"statics", bind_statics},       {"exceptions", bind_exceptions},
        {"holders", bind_holders},       {"trampolines", bind_trampolines}, {"inheritance", bind_inheritance},
        {"buffers", bind_buffers},       {"pickle", bind_pickle},         {"containers", bind_containers},
        {"iterators", bind_iterators},   {"callables", bind_callables},   {"objects", bind_objects},
        {"submodules", bind_submodules},
    };
    py::list bound;
    for (const auto &f : all) {
        if (wanted(f.name)) {
            f.bind(m);
            bound.append(f.name);
        }
    }
    m.attr("features") = bound;
}
