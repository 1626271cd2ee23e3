# Install the library, its CMake package (find_package(Phalanx CONFIG)) and a pkg-config file.
include(CMakePackageConfigHelpers)
install(TARGETS phalanx EXPORT PhalanxTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT PhalanxTargets NAMESPACE Phalanx::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Phalanx)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/PhalanxConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/PhalanxConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Phalanx)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/PhalanxConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/PhalanxConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/PhalanxConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Phalanx)
# The .pc file finds the prefix relative to itself, so an install moved or made with
# --prefix elsewhere still works.
file(RELATIVE_PATH PHALANX_PC_TO_PREFIX "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
string(REGEX REPLACE "/$" "" PHALANX_PC_TO_PREFIX "${PHALANX_PC_TO_PREFIX}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/phalanx.pc.in ${CMAKE_CURRENT_BINARY_DIR}/phalanx.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/phalanx.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
