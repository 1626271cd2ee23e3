# Installs the build tree into WORK_DIR/prefix, configures and builds the consumer project
# against it with find_package(Phalanx), then runs it.
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message("${out}")
endfunction()
run(${CMAKE_COMMAND} --install ${PHALANX_BUILD_DIR} --prefix ${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
# pkg-config file is installed and names the library
file(READ ${WORK_DIR}/prefix/lib/pkgconfig/phalanx.pc pc)
if(NOT pc MATCHES "-lphalanx")
  message(FATAL_ERROR "phalanx.pc does not link -lphalanx")
endif()
# ... and is relocatable: a program builds and runs with nothing but pkg-config and g++.
find_program(PKG_CONFIG pkg-config)
find_program(GXX g++)
if(PKG_CONFIG AND GXX)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${WORK_DIR}/prefix/lib/pkgconfig
                          ${PKG_CONFIG} --cflags --libs phalanx
                  OUTPUT_VARIABLE pc_flags OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT pc_flags MATCHES "${WORK_DIR}/prefix")
    message(FATAL_ERROR "pkg-config --cflags --libs phalanx does not point into the install prefix: '${pc_flags}'")
  endif()
  separate_arguments(pc_list UNIX_COMMAND "${pc_flags}")
  run(${GXX} ${CONSUMER_SOURCE_DIR}/main.cpp ${pc_list} -o ${WORK_DIR}/pkgconfig_consumer)
  run(${WORK_DIR}/pkgconfig_consumer)
endif()

# The out-of-tree backend example: built against the installed library, selected by
# PHALANX_BACKEND, found through PHALANX_PLUGIN_PATH, run by the installed launcher.
run(${CMAKE_COMMAND} -S ${EXAMPLES_DIR}/custom_backend -B ${WORK_DIR}/plugin
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/plugin)
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env PHALANX_PLUGIN_PATH=${WORK_DIR}/plugin PHALANX_BACKEND=storecomm
          ${WORK_DIR}/prefix/bin/phalanx-run --nproc-per-node 2 ${WORK_DIR}/plugin/custom_backend_demo
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
message("${out}${err}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "on backend 'storecomm': allreduce sum = 3")
  message(FATAL_ERROR "the custom backend example failed (${rc})")
endif()

# The whole-loop example as a user builds it: its own project against the installed package,
# its checks run with the installed launcher.
run(${CMAKE_COMMAND} -S ${EXAMPLES_DIR}/custom_loop -B ${WORK_DIR}/custom_loop
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/custom_loop)
run(${CMAKE_COMMAND} -DLAUNCHER=${WORK_DIR}/prefix/bin/phalanx-run -DPROGRAM=${WORK_DIR}/custom_loop/custom_loop
    -DWORK_DIR=${WORK_DIR}/custom_loop_checks -P ${EXAMPLES_DIR}/custom_loop/run_checks.cmake)
