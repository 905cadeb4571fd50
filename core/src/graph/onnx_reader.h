#pragma once
// The ONNX reader on bytes in memory (onnx_graph.cpp): what readOnnxGraph does after reading the
// file, for the fuzz target (tests/fuzz/fuzz_onnx_graph.cpp). `name` stands for the file in
// messages and the graph's name.
#include <string>

#include "lathe/core/model_graph.h"

namespace lathe::core {

ModelGraph readOnnxGraphBytes(const std::string& bytes, const std::string& name,
                              const GraphOptions& options = {});

}  // namespace lathe::core
