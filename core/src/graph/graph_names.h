#pragma once
// Shared by the model-graph readers (TorchScript, ONNX); implemented in model_graph.cpp.
#include "lathe/core/model_graph.h"

namespace lathe::core {

/// Gives every node but the input(s) and output a unique name: its scope alone where that scope
/// holds one op, else scope/op, scope/op_2, … ("conv2d_3" at the top level), the op without its
/// namespace ("aten::") or in-place underscore.
void nameGraphNodes(ModelGraph& graph);

/// The op without its namespace: "conv2d" of "aten::conv2d".
std::string shortOpName(const std::string& op);

}  // namespace lathe::core
