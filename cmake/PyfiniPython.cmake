# PyfiniPython.cmake - the CPython to embed, described by its python3.X-config script.
#
# Input:  PYFINI_PYTHON_CONFIG  path of python3.X-config (default: tools/find-pythons --default,
#                               the newest release build found)
# Output: target pyfini_python  (INTERFACE: -I of the headers, --ldflags --embed, rpath to libpython
#                                unless PYFINI_PYTHON_RPATH is OFF)
#         PYFINI_PY_VERSION     e.g. 3.12.1
#         PYFINI_PY_ABIFLAGS    "" or "d"
#         PYFINI_PY_TAG         ${PYFINI_PY_VERSION}${PYFINI_PY_ABIFLAGS}
# Using the config script (not FindPython) keeps -I for debug builds, whose
# headers are links to the release ones (see ../shared/reference/lab.md).

if(NOT PYFINI_PYTHON_CONFIG)
  # tools/find-pythons --default: the newest release build found (else the
  # first found)
  execute_process(COMMAND "${PROJECT_SOURCE_DIR}/tools/find-pythons" --default
                  OUTPUT_VARIABLE _pyfini_found RESULT_VARIABLE _rc
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _rc EQUAL 0 OR _pyfini_found STREQUAL "")
    message(FATAL_ERROR "pyfini: no CPython >= 3.11 with headers and a shared libpython; "
                        "install python3-dev or set -DPYFINI_PYTHON_CONFIG=/path/to/python3.X-config")
  endif()
  string(REPLACE "\t" ";" _f "${_pyfini_found}")
  list(GET _f 1 _pick)
  set(PYFINI_PYTHON_CONFIG "${_pick}" CACHE FILEPATH "python3.X-config of the CPython to embed")
endif()

function(_pyfini_pyconfig out)
  execute_process(COMMAND "${PYFINI_PYTHON_CONFIG}" ${ARGN}
                  OUTPUT_VARIABLE _o RESULT_VARIABLE _rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "pyfini: '${PYFINI_PYTHON_CONFIG} ${ARGN}' failed")
  endif()
  separate_arguments(_o UNIX_COMMAND "${_o}")
  set(${out} "${_o}" PARENT_SCOPE)
endfunction()

_pyfini_pyconfig(_inc --includes)
_pyfini_pyconfig(_ld --ldflags --embed)
execute_process(COMMAND "${PYFINI_PYTHON_CONFIG}" --abiflags
                OUTPUT_VARIABLE PYFINI_PY_ABIFLAGS OUTPUT_STRIP_TRAILING_WHITESPACE)

set(_incdirs "")
foreach(_a IN LISTS _inc)
  if(_a MATCHES "^-I(.*)")
    list(APPEND _incdirs "${CMAKE_MATCH_1}")
  endif()
endforeach()
list(REMOVE_DUPLICATES _incdirs)
list(GET _incdirs 0 _inc0)
file(STRINGS "${_inc0}/patchlevel.h" _pl REGEX "^#define PY_VERSION[ \t]+\"")
string(REGEX REPLACE ".*\"([^\"]+)\".*" "\\1" PYFINI_PY_VERSION "${_pl}")
set(PYFINI_PY_TAG "${PYFINI_PY_VERSION}${PYFINI_PY_ABIFLAGS}")

set(_libdirs "")
set(_links "")
foreach(_a IN LISTS _ld)
  if(_a MATCHES "^-L(.*)")
    list(APPEND _libdirs "${CMAKE_MATCH_1}")
  elseif(_a MATCHES "^-Wl,-rpath")
    # rpath is added below for every -L directory
  else()
    list(APPEND _links "${_a}")
  endif()
endforeach()
list(REMOVE_DUPLICATES _libdirs)

add_library(pyfini_python INTERFACE)
target_include_directories(pyfini_python INTERFACE ${_incdirs})
target_link_directories(pyfini_python INTERFACE ${_libdirs})
target_link_libraries(pyfini_python INTERFACE ${_links})
# PYFINI_PYTHON_RPATH OFF: no RUNPATH, for a libpython in the loader's default
# path that must not get one (Debian policy: tools/make-deb, `make deb`)
option(PYFINI_PYTHON_RPATH "Give programs that embed CPython a RUNPATH to libpython's directories" ON)
if(PYFINI_PYTHON_RPATH)
  foreach(_d IN LISTS _libdirs)
    target_link_options(pyfini_python INTERFACE "LINKER:-rpath,${_d}")
  endforeach()
endif()
# For shared objects that live inside a Python process (extension-style): headers only.
add_library(pyfini_python_headers INTERFACE)
target_include_directories(pyfini_python_headers INTERFACE ${_incdirs})

message(STATUS "pyfini: CPython ${PYFINI_PY_TAG} from ${PYFINI_PYTHON_CONFIG}")
