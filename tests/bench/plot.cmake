# Plot benchmark: replot time of a MetricChart at a million points, adaptive sampling on vs
# off, measured in the same run (included from tests/bench/CMakeLists.txt).
if(LATHE_GUI)
  add_executable(bench_plot ${CMAKE_CURRENT_LIST_DIR}/bench_plot.cpp)
  target_link_libraries(bench_plot PRIVATE lathe_widgets)
  add_test(NAME bench_plot COMMAND bench_plot)
  set_tests_properties(bench_plot PROPERTIES ENVIRONMENT "QT_QPA_PLATFORM=offscreen" LABELS bench)
endif()

# Overlay benchmark: selecting 1,000 runs of 10,000 points in the Curves tab, the event loop's
# longest stall against the one-graph-per-series path (--quick in CTest: 200 runs x 2,000).
if(LATHE_GUI)
  add_executable(bench_overlay ${CMAKE_CURRENT_LIST_DIR}/bench_overlay.cpp)
  target_link_libraries(bench_overlay PRIVATE lathe_gui SQLite::SQLite3)
  target_include_directories(bench_overlay PRIVATE ${CMAKE_SOURCE_DIR}/tests/support)
  add_test(NAME bench_overlay COMMAND bench_overlay --quick --out ${CMAKE_BINARY_DIR}/bench-results)
  set_tests_properties(bench_overlay PROPERTIES ENVIRONMENT "QT_QPA_PLATFORM=offscreen" LABELS bench
                       TIMEOUT 600)
endif()
