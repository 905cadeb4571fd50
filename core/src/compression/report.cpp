// CompressReport as JSON (compress.h): what the registry keeps per compressed version and what
// `lathectl compress ... --json` and `models compare` print.
#include <nlohmann/json.hpp>

#include "lathe/core/compress.h"

namespace lathe::core {

using nlohmann::json;

std::string CompressReport::toJson() const {
    json layersJson = json::array();
    for (const auto& l : layers)
        layersJson.push_back({{"name", l.name},
                              {"kind", l.kind},
                              {"in_features", l.inFeatures},
                              {"out_features", l.outFeatures},
                              {"parent_out_features", l.parentOutFeatures},
                              {"change", l.change}});
    json roundsJson = json::array();
    for (const auto& r : rounds)
        roundsJson.push_back({{"round", r.round},
                              {"run_id", r.runId},
                              {"kept", r.kept},
                              {"accuracy", r.accuracy},
                              {"parameters", r.parameters}});
    return json{{"method", method},
                {"settings", settings},
                {"data", data},
                {"samples", samples},
                {"accuracy", accuracy},
                {"parent_accuracy", parentAccuracy},
                {"size_bytes", sizeBytes},
                {"parent_size_bytes", parentSizeBytes},
                {"latency_ms_b1", latencyMsB1},
                {"latency_ms_b32", latencyMsB32},
                {"parent_latency_ms_b1", parentLatencyMsB1},
                {"parent_latency_ms_b32", parentLatencyMsB32},
                {"class_names", classNames},
                {"per_class_accuracy", perClassAccuracy},
                {"parent_per_class_accuracy", parentPerClassAccuracy},
                {"layers", layersJson},
                {"kernel", kernel},
                {"parameters", parameters},
                {"parent_parameters", parentParameters},
                {"runs", runs},
                {"rounds", roundsJson}}
        .dump();
}

CompressReport CompressReport::fromJson(const std::string& text) {
    CompressReport r;
    try {
        const auto j = json::parse(text, [](int depth, json::parse_event_t, json&) {
            if (depth > 8) throw ConfigError("compression report nested too deeply");
            return true;
        });
        if (!j.is_object()) throw ConfigError("compression report is not a JSON object");
        r.method = j.value("method", std::string());
        if (j.contains("settings") && j["settings"].is_object())
            for (const auto& [k, v] : j["settings"].items())
                if (v.is_string()) r.settings[k] = v.get<std::string>();
        r.data = j.value("data", std::string());
        r.samples = j.value("samples", int64_t{0});
        r.accuracy = j.value("accuracy", 0.0);
        r.parentAccuracy = j.value("parent_accuracy", 0.0);
        r.sizeBytes = j.value("size_bytes", int64_t{0});
        r.parentSizeBytes = j.value("parent_size_bytes", int64_t{0});
        r.latencyMsB1 = j.value("latency_ms_b1", 0.0);
        r.latencyMsB32 = j.value("latency_ms_b32", 0.0);
        r.parentLatencyMsB1 = j.value("parent_latency_ms_b1", 0.0);
        r.parentLatencyMsB32 = j.value("parent_latency_ms_b32", 0.0);
        r.classNames = j.value("class_names", std::vector<std::string>{});
        r.perClassAccuracy = j.value("per_class_accuracy", std::vector<double>{});
        r.parentPerClassAccuracy = j.value("parent_per_class_accuracy", std::vector<double>{});
        r.kernel = j.value("kernel", std::string());
        r.parameters = j.value("parameters", int64_t{0});
        r.parentParameters = j.value("parent_parameters", int64_t{0});
        r.runs = j.value("runs", std::vector<int64_t>{});
        if (j.contains("rounds") && j["rounds"].is_array())
            for (const auto& x : j["rounds"]) {
                if (!x.is_object()) continue;
                Round round;
                round.round = x.value("round", int64_t{0});
                round.runId = x.value("run_id", int64_t{0});
                round.kept = x.value("kept", 0.0);
                round.accuracy = x.value("accuracy", 0.0);
                round.parameters = x.value("parameters", int64_t{0});
                r.rounds.push_back(round);
            }
        if (j.contains("layers") && j["layers"].is_array())
            for (const auto& l : j["layers"]) {
                if (!l.is_object()) continue;
                Layer x;
                x.name = l.value("name", std::string());
                x.kind = l.value("kind", std::string());
                x.inFeatures = l.value("in_features", int64_t{0});
                x.outFeatures = l.value("out_features", int64_t{0});
                x.parentOutFeatures = l.value("parent_out_features", int64_t{0});
                x.change = l.value("change", std::string());
                r.layers.push_back(std::move(x));
            }
    } catch (const json::exception& ex) {
        throw ConfigError(std::string("malformed compression report: ") + ex.what());
    }
    return r;
}

}  // namespace lathe::core
