# The skip mechanism's self-test (CTest selftest.skip_exit_code, tests/CMakeLists.txt):
#   cmake -DCTEST=ctest -DPROGRAM=skip_selftest -DPROPERTIES=props.cmake -DSKIP_RETURN_CODE=77
#         -DWORK=dir -P skip_selftest.cmake
# Runs each hidden case of support/skip_selftest.cpp directly and checks its exit code, then
# under a nested ctest whose tests get their properties from PROPERTIES (a script written by
# lathe_write_test_properties, as every Catch2 test's are) and checks what ctest reports: a test
# that failed after printing the skip marker, or after skipping in another section, is failed;
# only the one that passed and skipped is skipped.
foreach(var CTEST PROGRAM PROPERTIES SKIP_RETURN_CODE WORK)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "skip_selftest.cmake: -D${var}=... is missing")
  endif()
endforeach()

# name | Catch2 test case | exit code | ctest's verdict
set(cases
  "fail_after_marker|selftest: a failure after the skip marker|1|Failed"
  "skip_then_fail|selftest: a skip in one section and a failure in another|1|Failed"
  "fail_77_times|selftest: 77 failed assertions|1|Failed"
  "skips|selftest: a skip|${SKIP_RETURN_CODE}|Skipped"
  "passes|selftest: a pass|0|Passed")

set(problems "")
set(names "")
set(testfile "")
foreach(case IN LISTS cases)
  string(REPLACE "|" ";" fields "${case}")
  list(GET fields 0 name)
  list(GET fields 1 testcase)
  list(GET fields 2 want_rc)
  execute_process(COMMAND ${PROGRAM} ${testcase} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc STREQUAL want_rc)
    string(APPEND problems "  '${testcase}' exited ${rc}, not ${want_rc}:\n${out}\n")
  endif()
  list(APPEND names ${name})
  string(APPEND testfile "add_test(${name} \"${PROGRAM}\" \"${testcase}\")\n")
endforeach()

# The same tests under ctest, with the properties every Catch2 test gets.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
string(REPLACE ";" " " name_list "${names}")
file(WRITE ${WORK}/CTestTestfile.cmake
  "${testfile}"
  "set(skip_selftest_TESTS ${name_list})\n"
  "include(\"${PROPERTIES}\")\n")
execute_process(COMMAND ${CTEST} --output-on-failure WORKING_DIRECTORY ${WORK}
                RESULT_VARIABLE ctest_rc OUTPUT_VARIABLE ctest_out ERROR_VARIABLE ctest_err)
message("${ctest_out}${ctest_err}")
foreach(case IN LISTS cases)
  string(REPLACE "|" ";" fields "${case}")
  list(GET fields 0 name)
  list(GET fields 3 verdict)
  # e.g. "1/5 Test #1: fail_after_marker ..........***Failed    0.01 sec"
  if(NOT ctest_out MATCHES "Test +#[0-9]+: ${name} [^\n]*[ *]${verdict} ")
    string(APPEND problems "  ctest did not report ${name} as ${verdict}\n")
  endif()
endforeach()
if(ctest_rc EQUAL 0)
  string(APPEND problems "  the nested ctest passed although three of its tests fail\n")
endif()

if(problems)
  message(FATAL_ERROR "the skip mechanism is broken:\n${problems}")
endif()
message("skip_selftest: failures fail whatever they printed or skipped; only a passing test that skipped is skipped")
