// libFuzzer target: the KServe v2 infer request parser on arbitrary bytes. Besides crashes and
// sanitizer reports, it checks the parser's promises: an accepted request holds exactly
// rows × 64 values with 1 <= rows <= max batch; a refused one carries a 4xx status and a message;
// both response forms (JSON, binary tensor data) are well framed.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "serving/infer_protocol.h"

using namespace lathe::core;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const ModelSignature signature = [] {
        ModelSignature s;
        s.inputs = {{"input", "FP32", {-1, 1, 8, 8}}};
        s.outputs = {{"logits", "FP32", {-1, 10}}};
        return s;
    }();
    serving::InferRequest req;
    serving::ProtocolError err;
    std::string_view body(reinterpret_cast<const char*>(data), size);
    // An input starting with byte 1 is a binary tensor data request: the bytes up to the next
    // newline are the Inference-Header-Content-Length value as sent (any bytes, empty too), the
    // rest is the body.
    std::optional<std::string_view> headerLength;
    if (size >= 1 && data[0] == 1) {
        body.remove_prefix(1);
        const auto nl = body.find('\n');
        headerLength = body.substr(0, std::min(nl, body.size()));
        body.remove_prefix(std::min(nl == std::string_view::npos ? body.size() : nl + 1, body.size()));
    }
    const bool ok = serving::parseInferRequest(body, signature, 8, req, err, headerLength);
    {
        // The server parses its bodies in place, where the buffer has simdjson's padding past
        // the end (of unrelated bytes): that must decide as the padded copy does.
        std::string padded(body);
        padded.reserve(body.size() + serving::kJsonPadding);
        std::fill(padded.data() + padded.size() + 1, padded.data() + padded.capacity(), '"');
        serving::InferRequest inPlace;
        serving::ProtocolError inPlaceErr;
        const bool ok2 = serving::parseInferRequest(padded, signature, 8, inPlace, inPlaceErr, headerLength,
                                                    padded.capacity());
        if (ok2 != ok) std::abort();
        if (ok &&
            (inPlace.rows != req.rows || inPlace.id != req.id || inPlace.data.size() != req.data.size() ||
             !std::equal(inPlace.data.begin(), inPlace.data.end(), req.data.begin(),
                         [](float a, float b) { return a == b || (a != a && b != b); })))
            std::abort();
        // The same refusal; not always the same words: for malformed JSON, simdjson's reason can
        // depend on the padding's bytes ("improper structure" or "ended early").
        if (!ok && inPlaceErr.status != err.status) std::abort();
    }
    if (ok) {
        if (req.rows < 1 || req.rows > 8 || req.data.size() != static_cast<size_t>(req.rows) * 64)
            std::abort();
        // The response writer must cope with whatever values came in (NaN is not JSON).
        std::vector<float> out(static_cast<size_t>(req.rows) * 10, req.data.empty() ? 0.0f : req.data[0]);
        const auto text =
            serving::inferResponse("digits", 1, req.id, signature.outputs[0], req.rows, out.data(), 10).body;
        if (text.empty() || text.front() != '{' || text.back() != '}') std::abort();
        const auto bin =
            serving::inferResponse("digits", 1, req.id, signature.outputs[0], req.rows, out.data(), 10, true);
        if (bin.jsonLength < 2 ||
            bin.body.size() != static_cast<size_t>(bin.jsonLength) + out.size() * sizeof(float) ||
            bin.body[static_cast<size_t>(bin.jsonLength) - 1] != '}')
            std::abort();
    } else {
        if (err.status < 400 || err.status > 499 || err.message.empty()) std::abort();
        if (serving::errorBody(err.message).empty()) std::abort();
    }
    return 0;
}
