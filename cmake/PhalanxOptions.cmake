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
# It compiles against the public headers of its layer only (PHALANX_PLUGIN_LAYER, set by the
# folder that holds it: `backends` for communication plugins, `core` for device plugins), so
# a plugin cannot include a layer above its own either; it links libphalanx.so for symbols.
function(phalanx_add_plugin name)
  if(NOT PHALANX_PLUGIN_LAYER)
    message(FATAL_ERROR "phalanx_add_plugin(${name}): set PHALANX_PLUGIN_LAYER (core or backends) in the folder above")
  endif()
  add_library(phalanx_${name} MODULE ${ARGN})
  target_link_libraries(phalanx_${name} PRIVATE phalanx_${PHALANX_PLUGIN_LAYER}_headers $<TARGET_FILE:phalanx>)
  add_dependencies(phalanx_${name} phalanx)
  target_compile_options(phalanx_${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
  set_target_properties(phalanx_${name} PROPERTIES
    PREFIX "lib" OUTPUT_NAME phalanx_${name}
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}
    INSTALL_RPATH "$ORIGIN")
  install(TARGETS phalanx_${name} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endfunction()

# Probe the optional toolchains once, at the top level.
macro(phalanx_probe_optional_parts)
  include(CheckLanguage)
  set(_phx_cuda_found FALSE)
  set(_phx_cuda_reason "nvcc, the CUDA runtime or cuBLAS not found (install the CUDA toolkit)")
  if(NOT PHALANX_WITH_CUDA STREQUAL "OFF")
    check_language(CUDA)
    find_package(CUDAToolkit QUIET)
    if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND AND TARGET CUDA::cublas)
      set(_phx_cuda_found TRUE)
    endif()
  endif()
  phalanx_optional(CUDA "${_phx_cuda_found}" "${_phx_cuda_reason}")
  if(PHALANX_HAVE_CUDA)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "90-real;90-virtual")
    endif()
    enable_language(CUDA)
  endif()

  set(_phx_nccl_found FALSE)
  if(PHALANX_HAVE_CUDA AND NOT PHALANX_WITH_NCCL STREQUAL "OFF")
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      set(_phx_nccl_found TRUE)
    endif()
  endif()
  phalanx_optional(NCCL "${_phx_nccl_found}" "NCCL (nccl.h, libnccl) or the CUDA toolkit not found")

  set(_phx_mpi_found FALSE)
  if(NOT PHALANX_WITH_MPI STREQUAL "OFF")
    # The plugin (libphalanx_mpi.so) uses MPI's C API only, from C++: no libmpi_cxx.
    set(MPI_CXX_SKIP_MPICXX ON)
    find_package(MPI COMPONENTS CXX QUIET)
    set(_phx_mpi_found ${MPI_CXX_FOUND})
  endif()
  phalanx_optional(MPI "${_phx_mpi_found}" "MPI not found (apt-get install libopenmpi-dev)")
endmacro()

# PHALANX_FUZZ: a build for the libFuzzer harnesses (tests/fuzz, docs/reliability.md) with
# clang. Everything is compiled with AddressSanitizer and UBSan (UB aborts) plus libFuzzer's
# coverage; no plugins, tools, tests, benchmarks or examples: only the library and the
# harnesses. Use a separate build directory (scripts/fuzz.sh uses build-fuzz/).
option(PHALANX_FUZZ "Build only the library (sanitized) and the libFuzzer harnesses (clang)" OFF)
if(PHALANX_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "Phalanx: PHALANX_FUZZ=ON needs clang (libFuzzer): configure with "
                        "-DCMAKE_CXX_COMPILER=clang++, or run scripts/fuzz.sh build")
  endif()
  foreach(opt CUDA NCCL MPI GLOO)
    set(PHALANX_WITH_${opt} OFF)
  endforeach()
  foreach(part TESTS BENCH EXAMPLES)
    set(PHALANX_BUILD_${part} OFF)
  endforeach()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
endif()
