# The layers, enforced by the build (docs/design.md, "Layers").
#
# phalanx_component(NAME [DEPENDS COMPONENT...]) turns the current folder into the OBJECT
# library phalanx_<NAME>. Its sources see their own include/ and src/ folders and the public
# include folders of the components named in DEPENDS (and of theirs), nothing else: an
# #include of a header from a layer above (say "phalanx/parallel/ddp.hpp" in core/) does not
# resolve and the build fails. The objects of every component go into the one shared
# library, libphalanx.so (Phalanx::phalanx), which is all a user links.
# phalanx_<NAME>_headers (INTERFACE) carries the component's public include folder and those
# of the layers it may use; plugins (phalanx_add_plugin) compile against it too.
# A component's internal/ folder, when it has one, holds headers its private code shares
# with the components above it: on phalanx_<NAME>_headers' include path (so on theirs), but
# neither installed nor on Phalanx::phalanx's. Include them as "phalanx/<layer>/internal/...".
function(phalanx_component name)
  cmake_parse_arguments(ARG "" "" "DEPENDS" ${ARGN})
  add_library(phalanx_${name}_headers INTERFACE)
  target_include_directories(phalanx_${name}_headers INTERFACE
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>)
  if(IS_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/internal)
    target_include_directories(phalanx_${name}_headers INTERFACE
      $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/internal>)
  endif()
  target_link_libraries(phalanx_${name}_headers INTERFACE Threads::Threads)
  foreach(dep IN LISTS ARG_DEPENDS)
    if(NOT TARGET phalanx_${dep}_headers)
      message(FATAL_ERROR "component ${name} depends on ${dep}, which is not defined before it")
    endif()
    target_link_libraries(phalanx_${name}_headers INTERFACE phalanx_${dep}_headers)
  endforeach()
  add_library(phalanx_${name} OBJECT)
  target_include_directories(phalanx_${name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_compile_options(phalanx_${name} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  target_link_libraries(phalanx_${name} PUBLIC phalanx_${name}_headers)
  target_link_libraries(phalanx PRIVATE phalanx_${name})
  target_include_directories(phalanx PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>)
  install(DIRECTORY include/phalanx DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  set_property(GLOBAL APPEND PROPERTY PHALANX_COMPONENT_TARGETS phalanx_${name})
endfunction()
