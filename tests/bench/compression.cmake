# Compression kernels: quantize/dequantize/fp16/bf16 bandwidth (bytes read + written per second) as
# a share of memcpy's on the same buffer (1, 10, 100 MB), and wire sizes by the size formula
# (arithmetic; bench_allreduce measures them) (included from tests/bench/CMakeLists.txt).
add_executable(bench_compression ${CMAKE_CURRENT_LIST_DIR}/bench_compression.cpp)
target_link_libraries(bench_compression PRIVATE lathe_kernels)
add_test(NAME bench_compression COMMAND bench_compression --out ${LATHE_BENCH_RESULTS})
set_tests_properties(bench_compression PROPERTIES LABELS bench TIMEOUT 60)

# The CUDA kernels (unscale-and-check, compression) against the device's own copy bandwidth;
# skipped (77) without a GPU. Built in kernels-only builds too, for the GPU machine.
add_executable(bench_kernels_cuda ${CMAKE_CURRENT_LIST_DIR}/bench_kernels_cuda.cpp)
target_link_libraries(bench_kernels_cuda PRIVATE lathe_kernels)
target_include_directories(bench_kernels_cuda PRIVATE ${CMAKE_SOURCE_DIR}/tests/support)
add_test(NAME bench_kernels_cuda COMMAND bench_kernels_cuda --quick --out ${LATHE_BENCH_RESULTS})
set_tests_properties(bench_kernels_cuda PROPERTIES LABELS bench SKIP_RETURN_CODE 77 TIMEOUT 120)

# The int8 Linear layer (quantize + GEMM + dequantize) against LibTorch fp32 (OpenBLAS) and
# LibTorch's dynamic int8 linear on each engine the build has, at batch 1, 32 and 128.
if(TORCH_LIBRARIES)  # not in kernels-only builds
  add_executable(bench_qlinear ${CMAKE_CURRENT_LIST_DIR}/bench_qlinear.cpp)
  target_link_libraries(bench_qlinear PRIVATE lathe_kernels ${TORCH_LIBRARIES})
  add_test(NAME bench_qlinear COMMAND bench_qlinear --reps 7 --out ${LATHE_BENCH_RESULTS})
  set_tests_properties(bench_qlinear PROPERTIES LABELS bench TIMEOUT 180)
endif()

# What each compression method costs and gains on digits (quantize dynamic/static/qat, pruning
# the CNN by half, distillation against the same student trained alone), from lathectl's
# side-by-side reports.
if(TORCH_LIBRARIES)
  add_test(NAME bench_compress
    COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/bench_compress.py
            --lathectl $<TARGET_FILE:lathectl> --out ${LATHE_BENCH_RESULTS} --quick)
  set_tests_properties(bench_compress PROPERTIES LABELS bench TIMEOUT 300)
endif()
