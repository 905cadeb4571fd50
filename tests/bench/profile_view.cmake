# Timeline benchmark: paint time of the profile timeline at 100,000 spans (full view and
# zoomed), culled + merged vs painting every span, in the same run. Included from
# tests/bench/CMakeLists.txt.
include_guard(GLOBAL)
if(LATHE_GUI)
  add_executable(bench_timeline ${CMAKE_CURRENT_LIST_DIR}/bench_timeline.cpp)
  target_link_libraries(bench_timeline PRIVATE lathe_widgets)
  add_test(NAME bench_timeline COMMAND bench_timeline)
  set_tests_properties(bench_timeline PROPERTIES
    ENVIRONMENT "QT_QPA_PLATFORM=offscreen" LABELS bench TIMEOUT 60)
endif()
