#include "infer_protocol.h"

#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

namespace lathe::core::serving {
namespace {

using nlohmann::json;

std::string shapeText(const std::vector<int64_t>& s) {
    std::string t = "[";
    for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + (s[i] < 0 ? std::string("-1") : std::to_string(s[i]));
    return t + "]";
}

// Nested data is flattened row-major; depth is bounded so a hostile body cannot recurse deeply
// (nlohmann's parser has already bounded nothing: depth is checked here as we walk).
bool flatten(const json& j, std::vector<float>& out, int depth, std::string& why) {
    if (depth > 16) {
        why = "`data` is nested too deeply";
        return false;
    }
    if (j.is_array()) {
        for (const auto& e : j)
            if (!flatten(e, out, depth + 1, why)) return false;
        return true;
    }
    if (j.is_number()) {
        const double v = j.get<double>();
        if (std::isfinite(v) && std::fabs(v) > 3.4028234663852886e38) {
            why = "a value in `data` does not fit FP32";
            return false;
        }
        out.push_back(static_cast<float>(v));
        return true;
    }
    why = std::string("`data` holds a ") + j.type_name() + " where FP32 numbers are expected";
    return false;
}

void appendJsonString(std::string& out, const std::string& s) {
    out += json(s).dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

bool parseInferRequest(std::string_view body, const ModelSignature& signature, int64_t maxRows, InferRequest& out,
                       ProtocolError& error) {
    auto fail = [&](int status, std::string msg) {
        error = {status, std::move(msg)};
        return false;
    };
    if (signature.inputs.size() != 1) return fail(500, "the model does not have exactly one input");
    const TensorSpec& spec = signature.inputs[0];
    // A callback that refuses depth beyond 64 keeps a body of "[[[[..." from exhausting the stack
    // inside the parser itself.
    int depth = 0;
    bool tooDeep = false;
    json::parser_callback_t cb = [&](int d, json::parse_event_t ev, json&) {
        if (ev == json::parse_event_t::object_start || ev == json::parse_event_t::array_start) {
            depth = d;
            if (d > 64) tooDeep = true;
        }
        return !tooDeep;
    };
    json j;
    try {
        j = json::parse(body.begin(), body.end(), cb, /*allow_exceptions=*/true);
    } catch (const json::exception& ex) {
        // parse_error, and out_of_range for numbers such as 1e400 (found by the fuzz test).
        return fail(400, std::string("malformed JSON: ") + ex.what());
    }
    if (tooDeep) return fail(400, "request JSON is nested too deeply");
    if (!j.is_object()) return fail(400, "the request body must be a JSON object with `inputs`");
    out = InferRequest{};
    if (auto it = j.find("id"); it != j.end()) {
        if (!it->is_string()) return fail(400, "`id` must be a string");
        out.id = it->get<std::string>();
        if (out.id.size() > 256) return fail(400, "`id` is longer than 256 characters");
    }
    auto inputs = j.find("inputs");
    if (inputs == j.end() || !inputs->is_array()) return fail(400, "the request has no `inputs` array");
    if (inputs->size() != 1)
        return fail(400, "the model takes 1 input ('" + spec.name + "'), the request has " +
                             std::to_string(inputs->size()));
    const json& in = (*inputs)[0];
    if (!in.is_object()) return fail(400, "each entry of `inputs` must be an object");
    auto name = in.find("name");
    if (name == in.end() || !name->is_string()) return fail(400, "input has no `name`");
    if (name->get<std::string>() != spec.name)
        return fail(400, "unknown input '" + name->get<std::string>() + "': the model's input is '" + spec.name + "'");
    auto dt = in.find("datatype");
    if (dt == in.end() || !dt->is_string()) return fail(400, "input '" + spec.name + "' has no `datatype`");
    if (dt->get<std::string>() != spec.datatype)
        return fail(400, "input '" + spec.name + "' has datatype " + dt->get<std::string>() + "; the model expects " +
                             spec.datatype);
    auto shape = in.find("shape");
    if (shape == in.end() || !shape->is_array()) return fail(400, "input '" + spec.name + "' has no `shape`");
    std::vector<int64_t> dims;
    for (const auto& d : *shape) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > (int64_t{1} << 31))
            return fail(400, "input '" + spec.name + "' has a shape entry that is not a non-negative integer");
        dims.push_back(d.get<int64_t>());
    }
    bool fits = dims.size() == spec.shape.size() && !dims.empty();
    for (size_t i = 1; fits && i < dims.size(); ++i) fits = spec.shape[i] < 0 || spec.shape[i] == dims[i];
    if (!fits)
        return fail(400, "input '" + spec.name + "' has shape " + shapeText(dims) + "; the model expects " +
                             shapeText(spec.shape) + " (the first dimension is the batch)");
    if (dims[0] < 1) return fail(400, "input '" + spec.name + "' has an empty batch");
    if (dims[0] > maxRows)
        return fail(400, "input '" + spec.name + "' has " + std::to_string(dims[0]) +
                             " rows; this server takes at most " + std::to_string(maxRows) + " per request (--max-batch)");
    int64_t count = 1;
    for (auto d : dims) count *= d;
    auto data = in.find("data");
    if (data == in.end()) return fail(400, "input '" + spec.name + "' has no `data`");
    out.data.reserve(static_cast<size_t>(count));
    std::string why;
    if (!flatten(*data, out.data, 0, why)) return fail(400, "input '" + spec.name + "': " + why);
    if (static_cast<int64_t>(out.data.size()) != count)
        return fail(400, "input '" + spec.name + "' has " + std::to_string(out.data.size()) +
                             " values; shape " + shapeText(dims) + " needs " + std::to_string(count));
    out.rows = dims[0];
    if (auto outs = j.find("outputs"); outs != j.end()) {
        if (!outs->is_array()) return fail(400, "`outputs` must be an array");
        for (const auto& o : *outs) {
            if (!o.is_object() || !o.contains("name") || !o["name"].is_string())
                return fail(400, "each entry of `outputs` must be an object with a `name`");
            bool known = false;
            for (const auto& s : signature.outputs) known = known || s.name == o["name"].get<std::string>();
            if (!known)
                return fail(400, "unknown output '" + o["name"].get<std::string>() + "'" +
                                     (signature.outputs.empty() ? "" : "; the model's output is '" +
                                                                           signature.outputs[0].name + "'"));
        }
    }
    return true;
}

std::string inferResponse(const std::string& model, int64_t version, const std::string& id, const TensorSpec& output,
                          int64_t rows, const float* data, int64_t perRow) {
    // Written by hand: dumping a json tree of thousands of floats would cost more than the model.
    std::string out;
    out.reserve(static_cast<size_t>(rows * perRow) * 12 + 160);
    out += "{\"model_name\":";
    appendJsonString(out, model);
    out += ",\"model_version\":\"" + std::to_string(version) + "\"";
    if (!id.empty()) {
        out += ",\"id\":";
        appendJsonString(out, id);
    }
    out += ",\"outputs\":[{\"name\":";
    appendJsonString(out, output.name);
    out += ",\"datatype\":\"" + output.datatype + "\",\"shape\":[" + std::to_string(rows);
    for (size_t i = 1; i < output.shape.size(); ++i) out += "," + std::to_string(output.shape[i]);
    out += "],\"data\":[";
    char buf[32];
    const int64_t n = rows * perRow;
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
    return out;
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
