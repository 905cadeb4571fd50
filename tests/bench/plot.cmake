# Plot benchmark: replot time of a MetricChart at a million points, adaptive sampling on vs
# off, measured in the same run (included from tests/bench/CMakeLists.txt).
if(LATHE_GUI)
  add_executable(bench_plot ${CMAKE_CURRENT_LIST_DIR}/bench_plot.cpp)
  target_link_libraries(bench_plot PRIVATE lathe_widgets)
  add_test(NAME bench_plot COMMAND bench_plot)
  set_tests_properties(bench_plot PROPERTIES ENVIRONMENT "QT_QPA_PLATFORM=offscreen" LABELS bench)
endif()
