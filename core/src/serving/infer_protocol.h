#pragma once
// The Open Inference (KServe v2) request and response bodies. Torch-free and self-contained
// (nlohmann JSON only) so the fuzz target can build it alone: request bodies are untrusted input.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lathe/core/registry.h"

namespace lathe::core::serving {

/// A request the server must refuse: HTTP status and a message for {"error": ...}.
struct ProtocolError {
    int status = 400;
    std::string message;
};

struct InferRequest {
    std::string id;
    int64_t rows = 0;            // the batch dimension of the input
    std::vector<float> data;     // rows × prod(sample shape), row-major
    bool wantOutput = true;      // false when "outputs" names none of ours (cannot happen: refused)
};

/// Parses and validates an infer request against the model's signature (one FP32 input).
/// Accepts flat or nested `data`. Returns false and fills `error` when the request is bad.
bool parseInferRequest(std::string_view body, const ModelSignature& signature, int64_t maxRows,
                       InferRequest& out, ProtocolError& error);

/// {"model_name":..., "model_version":..., "id":..., "outputs":[{name, datatype, shape, data}]}
std::string inferResponse(const std::string& model, int64_t version, const std::string& id,
                          const TensorSpec& output, int64_t rows, const float* data, int64_t perRow);

/// {"error": message}
std::string errorBody(const std::string& message);

/// Model metadata (GET /v2/models/NAME).
std::string modelMetadata(const std::string& model, int64_t version, const ModelSignature& signature);

}  // namespace lathe::core::serving
