# Optional parts: AUTO (build when found), ON (required), OFF (skip).
# The core library never links CUDA, NCCL or MPI: each lives in its own plugin.
set(PHALANX_WITH_CUDA AUTO CACHE STRING "CUDA device plugin (AUTO|ON|OFF)")
set(PHALANX_WITH_NCCL AUTO CACHE STRING "NCCL communication plugin (AUTO|ON|OFF)")
set(PHALANX_WITH_MPI  AUTO CACHE STRING "MPI communication plugin (AUTO|ON|OFF)")
foreach(opt CUDA NCCL MPI)
  set_property(CACHE PHALANX_WITH_${opt} PROPERTY STRINGS AUTO ON OFF)
endforeach()

# phalanx_optional(NAME FOUND REASON): resolves PHALANX_HAVE_<NAME> (a global cache entry)
# and prints one line.
function(phalanx_optional name found reason)
  set(mode ${PHALANX_WITH_${name}})
  if(mode STREQUAL "OFF")
    message(STATUS "Phalanx: ${name} plugin skipped (PHALANX_WITH_${name}=OFF)")
    set(PHALANX_HAVE_${name} OFF CACHE INTERNAL "")
  elseif(found)
    message(STATUS "Phalanx: ${name} found, plugin enabled")
    set(PHALANX_HAVE_${name} ON CACHE INTERNAL "")
  elseif(mode STREQUAL "ON")
    message(FATAL_ERROR "Phalanx: PHALANX_WITH_${name}=ON but ${reason}")
  else()
    message(STATUS "Phalanx: ${name} plugin skipped: ${reason}")
    set(PHALANX_HAVE_${name} OFF CACHE INTERNAL "")
  endif()
endfunction()

set(PHALANX_WITH_GLOO AUTO CACHE STRING "Gloo communication plugin (AUTO|ON|OFF)")
set_property(CACHE PHALANX_WITH_GLOO PROPERTY STRINGS AUTO ON OFF)

# phalanx_add_plugin(NAME SOURCES...): a MODULE library libphalanx_<name>.so next to
# libphalanx.so (so the registry finds it in the build tree) and installed beside it.
function(phalanx_add_plugin name)
  add_library(phalanx_${name} MODULE ${ARGN})
  target_link_libraries(phalanx_${name} PRIVATE Phalanx::phalanx)
  target_compile_options(phalanx_${name} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  set_target_properties(phalanx_${name} PROPERTIES
    PREFIX "lib" OUTPUT_NAME phalanx_${name}
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}
    INSTALL_RPATH "$ORIGIN")
  install(TARGETS phalanx_${name} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endfunction()
