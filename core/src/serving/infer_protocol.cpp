#include "infer_protocol.h"

#include <simdjson.h>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>

namespace lathe::core::serving {
namespace {

using nlohmann::json;
namespace od = simdjson::ondemand;

// A request refused with a message (400), thrown from deep inside the walk over the document.
struct Refusal {
    std::string message;
};

std::string shapeText(const std::vector<int64_t>& s) {
    std::string t = "[";
    for (size_t i = 0; i < s.size(); ++i)
        t += (i ? ", " : "") + (s[i] < 0 ? std::string("-1") : std::to_string(s[i]));
    return t + "]";
}

constexpr double kMaxFloat = 3.4028234663852886e38;

// Nested data is flattened row-major; depth is bounded so a hostile body cannot recurse deeply.
void flatten(od::value v, std::vector<float>& out, int depth) {
    if (depth > 16) throw Refusal{"`data` is nested too deeply"};
    switch (v.type()) {
        case od::json_type::array:
            // The usual element is a number: read it as one straight away (a failed read leaves
            // the element unread, so anything else takes the general path with its message). Asking
            // each element's type first and recursing into it took twice as long: ~60 against
            // ~30 µs for a 1024-float row (a micro-benchmark of both on this body).
            for (od::value e : v.get_array()) {
                double d;
                if (e.get_double().get(d) != simdjson::SUCCESS) {
                    flatten(e, out, depth + 1);
                    continue;
                }
                if (std::fabs(d) > kMaxFloat) throw Refusal{"a value in `data` does not fit FP32"};
                out.push_back(static_cast<float>(d));
            }
            return;
        case od::json_type::number: {
            const double d = v.get_double();
            if (std::fabs(d) > kMaxFloat) throw Refusal{"a value in `data` does not fit FP32"};
            out.push_back(static_cast<float>(d));
            return;
        }
        case od::json_type::string:
            throw Refusal{"`data` holds a string where FP32 numbers are expected"};
        case od::json_type::object:
            throw Refusal{"`data` holds an object where FP32 numbers are expected"};
        case od::json_type::boolean:
            throw Refusal{"`data` holds a boolean where FP32 numbers are expected"};
        case od::json_type::null:
            throw Refusal{"`data` holds null where FP32 numbers are expected"};
    }
}

// `s` as a JSON string. Names and ids are plain printable ASCII almost always: those are copied
// between quotes as they are, without building a json value (two allocations per string, three
// strings per answer); anything else (quotes, backslashes, control characters, UTF-8, invalid
// bytes replaced by U+FFFD) goes through nlohmann's escaping.
void appendJsonString(std::string& out, const std::string& s) {
    const bool plain = std::all_of(s.begin(), s.end(),
                                   [](char c) { return c >= 0x20 && c < 0x7f && c != '"' && c != '\\'; });
    if (!plain) {
        out += json(s).dump(-1, ' ', false, json::error_handler_t::replace);
        return;
    }
    out += '"';
    out += s;
    out += '"';
}

}  // namespace

// simdjson's On Demand parser: the request body is the server's hot path (a 1024-float request
// cost 130 µs to parse into an nlohmann tree, as much as the model's forward for its row), and
// On Demand validates while it reads the numbers straight into the batch row, without a tree.
bool parseInferRequest(std::string_view body, const ModelSignature& signature, int64_t maxRows,
                       InferRequest& out, ProtocolError& error, std::optional<std::string_view> headerLength,
                       size_t readable, std::string_view userParameter) {
    static_assert(kJsonPadding == simdjson::SIMDJSON_PADDING);
    auto fail = [&](int status, std::string msg) {
        error = {status, std::move(msg)};
        return false;
    };
    if (signature.inputs.size() != 1) return fail(500, "the model does not have exactly one input");
    const TensorSpec& spec = signature.inputs[0];
    thread_local od::parser parser;  // keeps its buffers between requests
    // Reset, keeping the buffers' capacity: a session parses every request into the same one.
    out.id.clear();
    out.rows = 0;
    out.data.clear();
    out.binaryOutput = false;
    out.userId.clear();
    thread_local std::vector<int64_t> dims;
    dims.clear();
    bool haveName = false, haveType = false, haveShape = false, haveData = false;
    size_t inputCount = 0;
    // The binary tensor data extension: JSON first, then the tensors' bytes.
    std::string_view binary;
    const bool extended = headerLength.has_value();
    if (extended) {
        uint64_t n = 0;
        const std::string_view h = *headerLength;
        const auto [end, ec] = std::from_chars(h.data(), h.data() + h.size(), n);
        if (h.empty() || ec != std::errc() || end != h.data() + h.size())
            return fail(400, std::string(kInferHeaderLength) + " must be a byte count");
        if (n > body.size())
            return fail(400, std::string(kInferHeaderLength) + " is " + std::to_string(n) +
                                 " but the body holds only " + std::to_string(body.size()) + " bytes");
        binary = body.substr(n);
        body = body.substr(0, n);
    }
    int64_t binarySize = -1;           // the input's binary_data_size, when it has one
    std::optional<bool> outputBinary;  // `outputs[].parameters.binary_data` for our output
    bool allBinary = false;            // the request's `parameters.binary_data_output`
    // A parameter value that must be a boolean.
    auto boolean = [](od::value v, const char* what) {
        if (v.type() != od::json_type::boolean)
            throw Refusal{std::string("parameter `") + what + "` must be true or false"};
        return bool(v.get_bool());
    };
    try {
        // In place when the caller's buffer has the padding past the JSON (the server's
        // bodies do), else through this thread's padded copy: no allocation either way once warm.
        const char* json = body.data();
        size_t capacity = readable;
        if (readable < body.size() + kJsonPadding) {
            thread_local std::string padded;
            padded.reserve(body.size() + kJsonPadding);
            padded.assign(body.data(), body.size());
            json = padded.data();
            capacity = padded.capacity();
        }
        od::document doc = parser.iterate(json, body.size(), capacity);
        if (doc.type() != od::json_type::object)
            throw Refusal{"the request body must be a JSON object with `inputs`"};
        bool haveInputs = false;
        for (auto field : doc.get_object()) {
            const std::string_view key = field.unescaped_key();
            od::value v = field.value();
            if (key == "id") {
                if (v.type() != od::json_type::string) throw Refusal{"`id` must be a string"};
                const std::string_view id = v.get_string();
                if (id.size() > 256) throw Refusal{"`id` is longer than 256 characters"};
                out.id.assign(id.data(), id.size());  // into the capacity it has
            } else if (key == "inputs") {
                if (v.type() != od::json_type::array) throw Refusal{"the request has no `inputs` array"};
                haveInputs = true;
                for (od::value in : v.get_array()) {
                    if (++inputCount > 1) continue;  // counted, refused below
                    if (in.type() != od::json_type::object)
                        throw Refusal{"each entry of `inputs` must be an object"};
                    for (auto f : in.get_object()) {
                        const std::string_view k = f.unescaped_key();
                        od::value x = f.value();
                        if (k == "name") {
                            if (x.type() != od::json_type::string) throw Refusal{"input has no `name`"};
                            const std::string_view name = x.get_string();
                            if (name != spec.name)
                                throw Refusal{"unknown input '" + std::string(name.substr(0, 64)) +
                                              "': the model's input is '" + spec.name + "'"};
                            haveName = true;
                        } else if (k == "datatype") {
                            if (x.type() != od::json_type::string)
                                throw Refusal{"input '" + spec.name + "' has no `datatype`"};
                            const std::string_view dt = x.get_string();
                            if (dt != spec.datatype)
                                throw Refusal{"input '" + spec.name + "' has datatype " +
                                              std::string(dt.substr(0, 16)) + "; the model expects " +
                                              spec.datatype};
                            haveType = true;
                        } else if (k == "shape") {
                            if (x.type() != od::json_type::array)
                                throw Refusal{"input '" + spec.name + "' has no `shape`"};
                            for (od::value d : x.get_array()) {
                                if (d.type() != od::json_type::number ||
                                    d.get_number_type() == od::number_type::floating_point_number)
                                    throw Refusal{"input '" + spec.name +
                                                  "' has a shape entry that is not a non-negative integer"};
                                const int64_t n = d.get_number_type() == od::number_type::unsigned_integer
                                                      ? -1
                                                      : static_cast<int64_t>(d.get_int64());
                                if (n < 0 || n > (int64_t{1} << 31) || dims.size() > 16)
                                    throw Refusal{"input '" + spec.name +
                                                  "' has a shape entry that is not a non-negative integer"};
                                dims.push_back(n);
                            }
                            haveShape = true;
                        } else if (k == "data") {
                            flatten(x, out.data, 0);
                            haveData = true;
                        } else if (k == "parameters") {
                            if (x.type() != od::json_type::object)
                                throw Refusal{"input '" + spec.name +
                                              "' has `parameters` that are not an object"};
                            for (auto pf : x.get_object()) {
                                if (pf.unescaped_key() != std::string_view("binary_data_size")) continue;
                                od::value b = pf.value();
                                // A value is read once: On Demand does not keep it.
                                const int64_t size =
                                    b.type() == od::json_type::number &&
                                            b.get_number_type() == od::number_type::signed_integer
                                        ? static_cast<int64_t>(b.get_int64())
                                        : -1;
                                if (size < 0)
                                    throw Refusal{"input '" + spec.name +
                                                  "': `binary_data_size` must be a byte count"};
                                binarySize = size;
                            }
                        }
                    }
                }
            } else if (key == "outputs") {
                if (v.type() != od::json_type::array) throw Refusal{"`outputs` must be an array"};
                for (od::value o : v.get_array()) {
                    if (o.type() != od::json_type::object)
                        throw Refusal{"each entry of `outputs` must be an object with a `name`"};
                    bool named = false;
                    std::optional<bool> binaryHere;
                    for (auto f : o.get_object()) {
                        const std::string_view ok = f.unescaped_key();
                        if (ok == "parameters") {
                            od::value pv = f.value();
                            if (pv.type() != od::json_type::object)
                                throw Refusal{
                                    "an entry of `outputs` has `parameters` that are not an object"};
                            for (auto pf : pv.get_object()) {
                                const std::string_view pk = pf.unescaped_key();
                                if (pk == "binary_data")
                                    binaryHere = boolean(pf.value(), "binary_data");
                                else if (pk == "classification")
                                    throw Refusal{
                                        "the classification extension is not supported: ask for the output "
                                        "tensor"};
                            }
                            continue;
                        }
                        if (ok != "name") continue;
                        od::value n = f.value();
                        if (n.type() != od::json_type::string)
                            throw Refusal{"each entry of `outputs` must be an object with a `name`"};
                        const std::string_view name = n.get_string();
                        bool known = false;
                        for (const auto& sp : signature.outputs) known = known || sp.name == name;
                        if (!known)
                            throw Refusal{"unknown output '" + std::string(name.substr(0, 64)) + "'" +
                                          (signature.outputs.empty() ? ""
                                                                     : "; the model's output is '" +
                                                                           signature.outputs[0].name + "'")};
                        named = true;
                    }
                    if (!named) throw Refusal{"each entry of `outputs` must be an object with a `name`"};
                    if (binaryHere) outputBinary = binaryHere;  // one output: whichever entry names it
                }
            } else if (key == "parameters") {
                if (v.type() != od::json_type::object) throw Refusal{"`parameters` must be an object"};
                for (auto pf : v.get_object()) {
                    const std::string_view pk = pf.unescaped_key();
                    if (pk == std::string_view("binary_data_output")) {
                        allBinary = boolean(pf.value(), "binary_data_output");
                    } else if (!userParameter.empty() && pk == userParameter) {
                        od::value u = pf.value();
                        if (u.type() == od::json_type::string) {
                            const std::string_view id = u.get_string();
                            out.userId.assign(id.data(), id.size());
                        } else if (u.type() == od::json_type::number &&
                                   u.get_number_type() != od::number_type::floating_point_number) {
                            std::string_view t = u.raw_json_token();
                            while (!t.empty() && (t.back() == ' ' || t.back() == '\t' || t.back() == '\n' ||
                                                  t.back() == '\r'))
                                t.remove_suffix(1);
                            out.userId.assign(t.data(), t.size());
                        } else {
                            throw Refusal{
                                "the request parameter `" + std::string(userParameter) +
                                "` names the user for the rollout: it must be a string or an integer"};
                        }
                    }
                }
            }
            // Other members are skipped unread, though still validated.
        }
        // Fully consumed documents report OUT_OF_BOUNDS: anything else is content after the object.
        if (doc.current_location().error() == simdjson::SUCCESS)
            throw Refusal{"malformed JSON: trailing content after the request object"};
        if (!haveInputs) throw Refusal{"the request has no `inputs` array"};
    } catch (const Refusal& r) {
        return fail(400, r.message);
    } catch (const simdjson::simdjson_error& ex) {
        return fail(400, std::string("malformed JSON: ") + ex.what());
    }
    if (inputCount != 1)
        return fail(400, "the model takes 1 input ('" + spec.name + "'), the request has " +
                             std::to_string(inputCount));
    if (!haveName) return fail(400, "input has no `name`");
    if (!haveType) return fail(400, "input '" + spec.name + "' has no `datatype`");
    if (!haveShape) return fail(400, "input '" + spec.name + "' has no `shape`");
    bool fits = dims.size() == spec.shape.size() && !dims.empty();
    for (size_t i = 1; fits && i < dims.size(); ++i) fits = spec.shape[i] < 0 || spec.shape[i] == dims[i];
    if (!fits)
        return fail(400, "input '" + spec.name + "' has shape " + shapeText(dims) + "; the model expects " +
                             shapeText(spec.shape) + " (the first dimension is the batch)");
    if (dims[0] < 1) return fail(400, "input '" + spec.name + "' has an empty batch");
    if (dims[0] > maxRows)
        return fail(400, "input '" + spec.name + "' has " + std::to_string(dims[0]) +
                             " rows; this server takes at most " + std::to_string(maxRows) +
                             " per request (--max-batch)");
    // Bounded: dims are at most 2^31 each, and a product beyond any body limit is refused
    // before it can overflow.
    int64_t count = 1;
    for (auto d : dims) {
        if (__builtin_mul_overflow(count, d, &count) || count > (int64_t{1} << 40))
            return fail(400, "input '" + spec.name + "' has shape " + shapeText(dims) + ": too many values");
    }
    if (binarySize >= 0) {
        if (haveData)
            return fail(400,
                        "input '" + spec.name + "' has both `data` and `binary_data_size`: send one of them");
        if (!extended)
            return fail(400, "input '" + spec.name + "' declares `binary_data_size` but the request has no " +
                                 kInferHeaderLength + " header to say where its bytes begin");
        if (binarySize != count * static_cast<int64_t>(sizeof(float)))
            return fail(400, "input '" + spec.name + "' declares " + std::to_string(binarySize) +
                                 " bytes; shape " + shapeText(dims) + " of FP32 needs " +
                                 std::to_string(count * sizeof(float)));
    }
    if (extended && static_cast<int64_t>(binary.size()) != std::max<int64_t>(binarySize, 0))
        return fail(400, "the body holds " + std::to_string(binary.size()) +
                             " bytes after its JSON header; its inputs' " +
                             "`binary_data_size` account for " +
                             std::to_string(std::max<int64_t>(binarySize, 0)));
    if (binarySize >= 0) {
        // Little-endian FP32, as the extension defines it: this build's own layout.
        static_assert(sizeof(float) == 4, "FP32 is 4 bytes");
        static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "binary tensor data is little-endian");
        out.data.resize(static_cast<size_t>(count));
        std::memcpy(out.data.data(), binary.data(), binary.size());
        haveData = true;
    }
    out.binaryOutput = outputBinary.value_or(allBinary);
    if (!haveData) return fail(400, "input '" + spec.name + "' has no `data`");
    if (static_cast<int64_t>(out.data.size()) != count)
        return fail(400, "input '" + spec.name + "' has " + std::to_string(out.data.size()) +
                             " values; shape " + shapeText(dims) + " needs " + std::to_string(count));
    out.rows = dims[0];
    return true;
}

int64_t inferResponseInto(std::string& out, const std::string& model, int64_t version, const std::string& id,
                          const TensorSpec& output, int64_t rows, const float* data, int64_t perRow,
                          bool binary) {
    // Written by hand: dumping a json tree of thousands of floats would cost more than the model.
    const int64_t n = rows * perRow;
    out.clear();
    out.reserve(static_cast<size_t>(n) * (binary ? 4 : 12) + 200);
    char buf[32];
    auto number = [&](int64_t v) {
        const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
        out.append(buf, end);
    };
    out += "{\"model_name\":";
    appendJsonString(out, model);
    out += ",\"model_version\":\"";
    number(version);
    out += '"';
    if (!id.empty()) {
        out += ",\"id\":";
        appendJsonString(out, id);
    }
    out += ",\"outputs\":[{\"name\":";
    appendJsonString(out, output.name);
    out += ",\"datatype\":\"";
    out += output.datatype;
    out += "\",\"shape\":[";
    number(rows);
    for (size_t i = 1; i < output.shape.size(); ++i) {
        out += ',';
        number(output.shape[i]);
    }
    if (binary) {
        // NaN and infinities survive here, unlike in JSON.
        out += "],\"parameters\":{\"binary_data_size\":";
        number(static_cast<int64_t>(n * sizeof(float)));
        out += "}}]}";
        const auto jsonLength = static_cast<int64_t>(out.size());
        out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n) * sizeof(float));
        return jsonLength;
    }
    out += "],\"data\":[";
    for (int64_t i = 0; i < n; ++i) {
        if (i) out += ',';
        const float v = data[i];
        if (!std::isfinite(v)) {
            out += "null";  // JSON has no NaN/inf
            continue;
        }
        auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
        out.append(buf, ec == std::errc() ? end : buf);
    }
    out += "]}]}";
    return -1;
}

InferResponse inferResponse(const std::string& model, int64_t version, const std::string& id,
                            const TensorSpec& output, int64_t rows, const float* data, int64_t perRow,
                            bool binary) {
    InferResponse res;
    res.jsonLength = inferResponseInto(res.body, model, version, id, output, rows, data, perRow, binary);
    return res;
}

std::string errorBody(const std::string& message) {
    return json{{"error", message}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string modelMetadata(const std::string& model, int64_t version, const ModelSignature& signature) {
    auto specs = [](const std::vector<TensorSpec>& v) {
        json a = json::array();
        for (const auto& t : v) a.push_back({{"name", t.name}, {"datatype", t.datatype}, {"shape", t.shape}});
        return a;
    };
    json j{{"name", model},
           {"versions", json::array({std::to_string(version)})},
           {"platform", "pytorch_torchscript"},
           {"inputs", specs(signature.inputs)},
           {"outputs", specs(signature.outputs)}};
    if (!signature.classNames.empty()) j["parameters"] = {{"classes", signature.classNames}};
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace lathe::core::serving
