# PyfiniInstall.cmake - what `cmake --install BUILD --prefix P` puts into P.
#
#   P/include/pyfini.h
#   P/share/cmake/pyfini/pyfiniConfig.cmake, pyfiniConfigVersion.cmake,
#                        pyfiniTargets.cmake       find_package(pyfini) -> pyfini::pyfini
#   P/share/pkgconfig/pyfini.pc                    pkg-config / Meson dependency('pyfini')
#   P/share/doc/pyfini/LICENSE, CHANGELOG.md
#
# pyfini is one header, the same on every architecture, so its CMake package
# and .pc file go under share/ (found there by find_package and pkg-config)
# and the version file accepts consumers of any pointer size.
# Both are relocatable: nothing in them names the prefix given at configure
# time, so `--prefix P` and DESTDIR work.
include(CMakePackageConfigHelpers)

set(PYFINI_CMAKE_DIR "${CMAKE_INSTALL_DATADIR}/cmake/pyfini")
set(PYFINI_PKGCONFIG_DIR "${CMAKE_INSTALL_DATADIR}/pkgconfig")

install(FILES "${PROJECT_SOURCE_DIR}/include/pyfini.h" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(FILES "${PROJECT_SOURCE_DIR}/LICENSE" "${PROJECT_SOURCE_DIR}/CHANGELOG.md"
        DESTINATION "${CMAKE_INSTALL_DOCDIR}")

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
if(IS_ABSOLUTE "${PYFINI_PKGCONFIG_DIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  message(FATAL_ERROR "pyfini: CMAKE_INSTALL_DATADIR and CMAKE_INSTALL_INCLUDEDIR must be relative "
                      "to the prefix (pyfini.pc is relocatable)")
endif()
file(RELATIVE_PATH PYFINI_PC_TO_PREFIX "/_/${PYFINI_PKGCONFIG_DIR}" "/_")
string(REGEX REPLACE "/$" "" PYFINI_PC_TO_PREFIX "${PYFINI_PC_TO_PREFIX}")
set(PYFINI_PC_LIBS "")
foreach(_lib IN LISTS CMAKE_DL_LIBS)
  string(APPEND PYFINI_PC_LIBS " -l${_lib}")
endforeach()
string(STRIP "${PYFINI_PC_LIBS}" PYFINI_PC_LIBS)
configure_file("${CMAKE_CURRENT_LIST_DIR}/pyfini.pc.in" "${PROJECT_BINARY_DIR}/pyfini.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/pyfini.pc" DESTINATION "${PYFINI_PKGCONFIG_DIR}")
