# The example's own checks, as its README section states them:
#   cmake -DLAUNCHER=<phalanx-run> -DPROGRAM=<custom_loop> -DWORK_DIR=<scratch> -P run_checks.cmake
# 1. one process and two workers at the same global batch end with the same weights (1e-6);
# 2. two workers stopped after epoch 2 and resumed with --resume end with the bytes of the
#    two-worker run that never stopped.
foreach(var LAUNCHER PROGRAM WORK_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "run_checks.cmake needs -D${var}=...")
  endif()
endforeach()
foreach(var LAUNCHER PROGRAM WORK_DIR)
  get_filename_component(${var} "${${var}}" ABSOLUTE)
endforeach()
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(step name)
  execute_process(COMMAND ${ARGN} WORKING_DIRECTORY ${WORK_DIR} RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 300)
  message("== ${name}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "custom_loop check '${name}' failed (exit ${rc})")
  endif()
  set(last_output "${out}${err}" PARENT_SCOPE)
endfunction()

step("1 process" ${PROGRAM} --out one)
step("2 workers" ${LAUNCHER} --nproc-per-node 2 ${PROGRAM} --out two)
step("1 process equals 2 workers" ${PROGRAM} --compare one/weights.npz two/weights.npz --rtol 1e-6)
step("2 workers, stopped after epoch 2" ${LAUNCHER} --nproc-per-node 2 ${PROGRAM} --out resumed --stop-after-epoch 2)
if(EXISTS ${WORK_DIR}/resumed/weights.npz)
  message(FATAL_ERROR "the stopped run wrote its final weights")
endif()
step("2 workers, resumed" ${LAUNCHER} --nproc-per-node 2 ${PROGRAM} --out resumed --resume)
if(NOT last_output MATCHES "resumed from [^\n]*checkpoint-0*128\\.npz \\(epoch 2, step 128\\)")
  message(FATAL_ERROR "the resumed run did not start from epoch 2's checkpoint")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${WORK_DIR}/two/weights.npz ${WORK_DIR}/resumed/weights.npz
                RESULT_VARIABLE same)
if(NOT same EQUAL 0)
  message(FATAL_ERROR "the resumed run's weights.npz differs from the uninterrupted run's")
endif()
message("custom_loop checks passed: 1 process = 2 workers within 1e-6; stop + resume byte-identical")
