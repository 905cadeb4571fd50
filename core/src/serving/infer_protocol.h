#pragma once
// The Open Inference (KServe v2) request and response bodies. Torch-free and self-contained
// (simdjson and nlohmann JSON only) so the fuzz target can build it alone: request bodies are untrusted
// input.
#include <cstdint>
#include <optional>
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
    int64_t rows = 0;           // the batch dimension of the input
    std::vector<float> data;    // rows × prod(sample shape), row-major
    bool binaryOutput = false;  // the output goes back as binary tensor data (Triton's extension)
    std::string userId;         // the request parameter a rollout names as the user's id, if any
};

/// The header of the binary tensor data extension: the length of the JSON part of the body.
inline constexpr const char* kInferHeaderLength = "Inference-Header-Content-Length";
/// The header that names the user during a rollout (the split is sticky per user).
inline constexpr const char* kUserIdHeader = "X-User-Id";

/// Parses and validates an infer request against the model's signature (one FP32 input).
/// Accepts flat or nested `data`, or, with the binary tensor data extension (as Triton's
/// clients send by default), the input's bytes after the JSON part of the body.
/// `headerLength` is the raw Inference-Header-Content-Length value when the request has that
/// header (the JSON part's length in bytes), nullopt when it has none (the body is all JSON).
/// `readable`: how many bytes from body.data() may be read (allocated, of any value). When that
/// leaves simdjson's padding (kJsonPadding) past the JSON, the JSON is parsed where it lies;
/// otherwise it is first copied into a padded buffer of the calling thread (kept between calls).
/// `userParameter`: the name of a top-level request parameter holding the user's id (a string or
/// an integer) during a rollout; read into out.userId. Empty: none is read.
/// Returns false and fills `error` when the request is bad.
bool parseInferRequest(std::string_view body, const ModelSignature& signature, int64_t maxRows,
                       InferRequest& out, ProtocolError& error,
                       std::optional<std::string_view> headerLength = std::nullopt, size_t readable = 0,
                       std::string_view userParameter = {});

/// The bytes simdjson may read past the end of a JSON text (SIMDJSON_PADDING): a body buffer
/// with this much spare capacity is parsed without a copy.
inline constexpr size_t kJsonPadding = 64;

struct InferResponse {
    std::string body;
    int64_t jsonLength = -1;  // >= 0: binary tensor data follows this many bytes of JSON
};

/// {"model_name":..., "model_version":..., "id":..., "outputs":[{name, datatype, shape, data}]};
/// with `binary`, the output's data is sent as little-endian bytes after the JSON, which
/// names their size in the output's `parameters.binary_data_size`.
InferResponse inferResponse(const std::string& model, int64_t version, const std::string& id,
                            const TensorSpec& output, int64_t rows, const float* data, int64_t perRow,
                            bool binary = false);

/// inferResponse written into `out` (replacing what it held, keeping its capacity); returns
/// the JSON part's length with `binary`, else -1.
int64_t inferResponseInto(std::string& out, const std::string& model, int64_t version, const std::string& id,
                          const TensorSpec& output, int64_t rows, const float* data, int64_t perRow,
                          bool binary = false);

/// {"error": message}
std::string errorBody(const std::string& message);

/// Model metadata (GET /v2/models/NAME).
std::string modelMetadata(const std::string& model, int64_t version, const ModelSignature& signature);

}  // namespace lathe::core::serving
