# PyfiniInstall.cmake - what `cmake --install BUILD --prefix P` puts into P.
#
#   P/include/pyfini.h, pyfini_pybind11.h, pyfini.pxd (Cython: cimport pyfini)
#   P/share/cmake/pyfini/pyfiniConfig.cmake, pyfiniConfigVersion.cmake,
#                        pyfiniTargets.cmake       find_package(pyfini) -> pyfini::pyfini
#   P/share/pkgconfig/pyfini.pc                    pkg-config / Meson dependency('pyfini')
#   P/share/doc/pyfini/LICENSE, CHANGELOG.md, README.md, docs/*.md,
#                      docs/leakcheck.schema.json, leakcheck/README.md
#   P/bin/pyfini-leakcheck                         the leak checker (leakcheck/CMakeLists.txt)
#   P/libexec/pyfini/pyfini-leakcheck-worker       its worker for the build's CPython
#   P/share/pyfini/leakcheck/{worker,shared}/, P/share/pyfini/common/
#                                                  the worker's sources: --python X.Y compiles a
#                                                  worker for another CPython from them into the
#                                                  user's cache (never into P)
#   P/share/man/man1/pyfini-leakcheck.1            its man page
#
# pyfini is one header, the same on every architecture, so its CMake package
# and .pc file go under share/ (found there by find_package and pkg-config)
# and the version file accepts consumers of any pointer size.
# Both are relocatable: nothing in them names the prefix given at configure
# time, so `--prefix P` and DESTDIR work.
#
# PYFINI_INSTALL (default: ON when pyfini is the top-level project) switches
# every install rule; PYFINI_BUILD_LEAKCHECK OFF leaves out the tool's files.
# `cmake --install` of a tree whose tool is not built stops before it copies
# anything (the first rule below), naming the build step.
include(CMakePackageConfigHelpers)

set(PYFINI_CMAKE_DIR "${CMAKE_INSTALL_DATADIR}/cmake/pyfini")
set(PYFINI_PKGCONFIG_DIR "${CMAKE_INSTALL_DATADIR}/pkgconfig")
# the leak checker's worker and the worker's sources; the tool finds them
# relative to its own directory (PYFINI_LC_*_REL), so P can move
set(PYFINI_LC_WORKER_DIR "${CMAKE_INSTALL_LIBEXECDIR}/pyfini")
set(PYFINI_LC_DATA_DIR "${CMAKE_INSTALL_DATADIR}/pyfini")
file(RELATIVE_PATH PYFINI_LC_WORKER_REL "/_/${CMAKE_INSTALL_BINDIR}" "/_/${PYFINI_LC_WORKER_DIR}/pyfini-leakcheck-worker")
file(RELATIVE_PATH PYFINI_LC_SOURCE_REL "/_/${CMAKE_INSTALL_BINDIR}" "/_/${PYFINI_LC_DATA_DIR}/leakcheck")

if(NOT PYFINI_INSTALL)
  return()
endif()
if(PYFINI_BUILD_LEAKCHECK)
  install(CODE "
    foreach(_f [[$<TARGET_FILE:pyfini-leakcheck>]] [[$<TARGET_FILE:pyfini-leakcheck-worker>]])
      if(NOT EXISTS \"\${_f}\")
        message(FATAL_ERROR \"pyfini: \${_f} is not built; nothing was installed. Build first: \"
                            \"cmake --build ${PROJECT_BINARY_DIR}\")
      endif()
    endforeach()")
endif()

install(FILES "${PROJECT_SOURCE_DIR}/include/pyfini.h" "${PROJECT_SOURCE_DIR}/include/pyfini_pybind11.h"
              "${PROJECT_SOURCE_DIR}/include/pyfini.pxd" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(FILES "${PROJECT_SOURCE_DIR}/LICENSE" "${PROJECT_SOURCE_DIR}/CHANGELOG.md" "${PROJECT_SOURCE_DIR}/README.md"
        DESTINATION "${CMAKE_INSTALL_DOCDIR}")
# the user documentation, where README.md's links expect it (not docs/'s
# subfolders: findings, reproducers and examples are the project's own)
file(GLOB _pyfini_docs "${PROJECT_SOURCE_DIR}/docs/*.md")
install(FILES ${_pyfini_docs} "${PROJECT_SOURCE_DIR}/docs/leakcheck.schema.json"
        DESTINATION "${CMAKE_INSTALL_DOCDIR}/docs")
install(FILES "${PROJECT_SOURCE_DIR}/leakcheck/README.md" DESTINATION "${CMAKE_INSTALL_DOCDIR}/leakcheck")

install(TARGETS pyfini EXPORT pyfiniTargets)
install(EXPORT pyfiniTargets NAMESPACE pyfini:: DESTINATION "${PYFINI_CMAKE_DIR}")
configure_package_config_file("${CMAKE_CURRENT_LIST_DIR}/pyfiniConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/pyfiniConfig.cmake" INSTALL_DESTINATION "${PYFINI_CMAKE_DIR}")
# 0.x: a new minor version may change the API (semantic versioning), so
# find_package(pyfini 0.1) accepts 0.1.z only.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/pyfiniConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES "${PROJECT_BINARY_DIR}/pyfiniConfig.cmake" "${PROJECT_BINARY_DIR}/pyfiniConfigVersion.cmake"
        DESTINATION "${PYFINI_CMAKE_DIR}")

# pyfini.pc: the prefix is found from the .pc file's own place (${pcfiledir}).
if(IS_ABSOLUTE "${PYFINI_PKGCONFIG_DIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}"
   OR IS_ABSOLUTE "${CMAKE_INSTALL_BINDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_LIBEXECDIR}")
  message(FATAL_ERROR "pyfini: CMAKE_INSTALL_DATADIR, CMAKE_INSTALL_INCLUDEDIR, CMAKE_INSTALL_BINDIR and "
                      "CMAKE_INSTALL_LIBEXECDIR must be relative to the prefix (pyfini.pc and "
                      "pyfini-leakcheck are relocatable)")
endif()
file(RELATIVE_PATH PYFINI_PC_TO_PREFIX "/_/${PYFINI_PKGCONFIG_DIR}" "/_")
string(REGEX REPLACE "/$" "" PYFINI_PC_TO_PREFIX "${PYFINI_PC_TO_PREFIX}")
set(PYFINI_PC_LIBS "")
foreach(_lib IN LISTS CMAKE_DL_LIBS)
  string(APPEND PYFINI_PC_LIBS " -l${_lib}")
endforeach()
string(STRIP "${PYFINI_PC_LIBS}" PYFINI_PC_LIBS)
# Installed into the prefix /usr (the .deb, a distribution's package), the
# prefix is written as is: pkg-config then gives -I/usr/include, which it
# drops as a system directory, not -I/usr/share/pkgconfig/../../include.
# Chosen at install time (`cmake --install --prefix` may differ from
# CMAKE_INSTALL_PREFIX).
set(PYFINI_PC_PREFIX "\${pcfiledir}/${PYFINI_PC_TO_PREFIX}")
configure_file("${CMAKE_CURRENT_LIST_DIR}/pyfini.pc.in" "${PROJECT_BINARY_DIR}/pyfini-relocatable.pc" @ONLY)
set(PYFINI_PC_PREFIX "/usr")
configure_file("${CMAKE_CURRENT_LIST_DIR}/pyfini.pc.in" "${PROJECT_BINARY_DIR}/pyfini-usr.pc" @ONLY)
install(CODE "
  set(_pc relocatable)
  if(CMAKE_INSTALL_PREFIX STREQUAL \"/usr\")
    set(_pc usr)
  endif()
  file(INSTALL DESTINATION \"\${CMAKE_INSTALL_PREFIX}/${PYFINI_PKGCONFIG_DIR}\" TYPE FILE RENAME pyfini.pc
       FILES \"${PROJECT_BINARY_DIR}/pyfini-\${_pc}.pc\")")
