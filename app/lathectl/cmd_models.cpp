// lathectl models: register versions, list and show them, point aliases.
#include <cstdio>
#include <iostream>
#include <sstream>

#include "cli_common.h"
#include "lathe/core/compress.h"
#include "lathe/core/model_artifact.h"
#include "lathe/core/registry.h"

namespace lathe::cli {
namespace {

struct ModelsState {
    CommonOptions common;
    std::string name;
    std::string ref;
    std::string other;
    int64_t run = 0;
    std::string file;
    std::string inputShape;
    int64_t parent = 0;
    std::string alias;
    std::string aliasName;
    int64_t aliasVersion = 0;
    bool remove = false;
};

std::string sizeText(int64_t bytes) {
    char buf[32];
    if (bytes >= (1 << 20))
        std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
    else
        std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(bytes) / 1024);
    return buf;
}

std::string shapeText(const std::vector<int64_t>& s) {
    std::string t = "[";
    for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + "]";
}

// A stored JSON column as JSON (null when empty or, for a damaged row, unreadable).
nlohmann::json jsonOrNull(const std::string& text) {
    if (text.empty()) return nullptr;
    try {
        return nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception&) {
        return nullptr;
    }
}

nlohmann::json versionJson(const core::ModelVersion& v) {
    nlohmann::json metrics = nlohmann::json::object();
    for (const auto& [k, x] : v.metrics) metrics[k] = metricJson(x);
    return {{"name", v.name},
            {"version", v.version},
            {"path", v.path},
            {"sha256", v.sha256},
            {"size_bytes", v.sizeBytes},
            {"signature", nlohmann::json::parse(core::signatureToJson(v.signature))},
            {"metrics", metrics},
            {"run_id", v.runId},
            {"data", v.data},
            {"parent_version", v.parentVersion},
            {"parent_model", v.parentModel.empty() && v.parentVersion > 0 ? v.name : v.parentModel},
            {"derivation", jsonOrNull(v.derivation)},
            {"report", jsonOrNull(v.report)},
            {"source", v.source},
            {"created_at", v.createdAt},
            {"aliases", v.aliases}};
}

void runRegister(const ModelsState& st) {
    if ((st.run > 0) == !st.file.empty())
        throw UsageError("give exactly one of --run RUN_ID and --file MODEL.pt");
    if (!st.alias.empty()) core::checkModelName(st.alias, "alias");
    auto registry = openRegistry(st.common);
    std::unique_ptr<core::Store> store;
    if (st.run > 0) store = openStore(st.common);
    const auto v = core::registerModel(
        *registry, store.get(), st.name, st.run, st.file,
        st.inputShape.empty() ? std::vector<int64_t>{} : parseShape(st.inputShape), st.parent);
    if (!st.alias.empty()) registry->setAlias(v.name, st.alias, v.version);
    if (st.common.json) {
        auto j = versionJson(v);
        if (!st.alias.empty()) j["aliases"] = {st.alias};
        std::cout << j.dump() << std::endl;
        return;
    }
    std::printf("registered %s v%lld from %s\n  artifact %s (%s, sha256 %s)\n  input %s %s -> output %s %s\n",
                v.name.c_str(), static_cast<long long>(v.version), v.source.c_str(), v.path.c_str(),
                sizeText(v.sizeBytes).c_str(), v.sha256.substr(0, 16).c_str(),
                v.signature.inputs[0].datatype.c_str(), shapeText(v.signature.inputs[0].shape).c_str(),
                v.signature.outputs[0].datatype.c_str(), shapeText(v.signature.outputs[0].shape).c_str());
    if (!st.alias.empty())
        std::printf("  alias %s -> v%lld\n", st.alias.c_str(), static_cast<long long>(v.version));
}

void runList(const ModelsState& st) {
    auto registry = openRegistry(st.common);
    const auto models = registry->listModels();
    if (st.common.json) {
        auto a = nlohmann::json::array();
        for (const auto& m : models)
            a.push_back({{"name", m.name},
                         {"versions", m.versions},
                         {"latest", m.latestVersion},
                         {"aliases", m.aliases}});
        std::cout << a.dump() << std::endl;
        return;
    }
    if (models.empty()) {
        std::printf("no models registered (lathectl models register NAME --run RUN_ID)\n");
        return;
    }
    std::printf("%-24s %8s %7s  %s\n", "NAME", "VERSIONS", "LATEST", "ALIASES");
    for (const auto& m : models) {
        std::string aliases;
        for (const auto& [a, v] : m.aliases)
            aliases += (aliases.empty() ? "" : ", ") + a + "=v" + std::to_string(v);
        std::printf("%-24s %8lld %7s  %s\n", m.name.c_str(), static_cast<long long>(m.versions),
                    ("v" + std::to_string(m.latestVersion)).c_str(), aliases.c_str());
    }
}

void runShow(const ModelsState& st) {
    auto registry = openRegistry(st.common);
    const auto ref = core::parseModelRef(st.ref);
    std::vector<core::ModelVersion> versions;
    if (ref.version > 0 || !ref.alias.empty())
        versions.push_back(registry->resolve(ref));
    else {
        versions = registry->versions(ref.name);
        if (versions.empty()) registry->resolve(ref);  // throws the not-found message
    }
    if (st.common.json) {
        auto a = nlohmann::json::array();
        for (const auto& v : versions) a.push_back(versionJson(v));
        std::cout << (versions.size() == 1 && ref.version + static_cast<int64_t>(ref.alias.size()) > 0 ? a[0]
                                                                                                       : a)
                         .dump()
                  << std::endl;
        return;
    }
    for (const auto& v : versions) {
        std::printf("%s v%lld%s\n", v.name.c_str(), static_cast<long long>(v.version),
                    v.aliases.empty() ? ""
                                      : ("  (" +
                                         [&] {
                                             std::string s;
                                             for (const auto& a : v.aliases) s += (s.empty() ? "" : ", ") + a;
                                             return s;
                                         }() +
                                         ")")
                                            .c_str());
        std::printf("  created   %s\n  source    %s\n", formatTime(v.createdAt).c_str(), v.source.c_str());
        if (v.parentVersion > 0)
            std::printf("  parent    %s:%lld\n", (v.parentModel.empty() ? v.name : v.parentModel).c_str(),
                        static_cast<long long>(v.parentVersion));
        if (const auto d = jsonOrNull(v.derivation); d.is_object()) {
            std::string how;
            for (const auto& [k, x] : d.items())
                if (k != "parent")
                    how += (how.empty() ? "" : ", ") + k + "=" +
                           (x.is_string() ? x.get<std::string>() : x.dump());
            std::printf("  derived   %s\n", how.c_str());
        }
        if (!v.data.empty()) std::printf("  data      %s\n", v.data.c_str());
        std::printf("  artifact  %s (%s)\n  sha256    %s\n", v.path.c_str(), sizeText(v.sizeBytes).c_str(),
                    v.sha256.c_str());
        for (const auto& t : v.signature.inputs)
            std::printf("  input     %s %s %s\n", t.name.c_str(), t.datatype.c_str(),
                        shapeText(t.shape).c_str());
        for (const auto& t : v.signature.outputs)
            std::printf("  output    %s %s %s\n", t.name.c_str(), t.datatype.c_str(),
                        shapeText(t.shape).c_str());
        for (const auto& [k, x] : v.metrics)
            std::printf("  metric    %s = %s\n", k.c_str(), formatValue(x).c_str());
    }
}

void runCompare(const ModelsState& st) {
    auto registry = openRegistry(st.common);
    const auto a = registry->resolve(core::parseModelRef(st.ref));
    const auto b = registry->resolve(core::parseModelRef(st.other));
    if (st.common.json) {
        std::cout << nlohmann::json{{"a", versionJson(a)}, {"b", versionJson(b)}}.dump() << std::endl;
        return;
    }
    const std::string na = a.name + ":" + std::to_string(a.version),
                      nb = b.name + ":" + std::to_string(b.version);
    auto row = [](const std::string& what, const std::string& x, const std::string& y,
                  const std::string& note = {}) {
        std::printf("%-18s %-28s %-28s %s\n", what.c_str(), x.c_str(), y.c_str(), note.c_str());
    };
    auto ratioText = [](double x, double y) {
        if (x <= 0 || y <= 0) return std::string();
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.2fx", x / y);
        return std::string(buf);
    };
    row("", na, nb, "A/B");
    row("source", a.source.substr(0, 28), b.source.substr(0, 28));
    row("size", sizeText(a.sizeBytes), sizeText(b.sizeBytes),
        ratioText(static_cast<double>(a.sizeBytes), static_cast<double>(b.sizeBytes)));
    auto parentOf = [](const core::ModelVersion& v) {
        return v.parentVersion > 0
                   ? (v.parentModel.empty() ? v.name : v.parentModel) + ":" + std::to_string(v.parentVersion)
                   : std::string("-");
    };
    row("parent", parentOf(a), parentOf(b));
    auto method = [](const core::ModelVersion& v) {
        const auto d = jsonOrNull(v.derivation);
        if (!d.is_object()) return std::string("-");
        return d.value("method", std::string("?")) +
               (d.contains("mode") ? " " + d.value("mode", std::string()) : "");
    };
    row("derivation", method(a), method(b));
    std::map<std::string, std::pair<std::string, std::string>> metrics;
    for (const auto& [k, x] : a.metrics) metrics[k].first = formatValue(x);
    for (const auto& [k, x] : b.metrics) metrics[k].second = formatValue(x);
    for (const auto& [k, ab] : metrics)
        row(k, ab.first.empty() ? "-" : ab.first, ab.second.empty() ? "-" : ab.second);
    // Latency as measured side by side when one was compressed from the other.
    for (const auto* pair : {&b, &a}) {
        const auto& child = *pair;
        const auto& parent = pair == &b ? a : b;
        if (child.report.empty() || child.parentVersion != parent.version ||
            (child.parentModel.empty() ? child.name : child.parentModel) != parent.name)
            continue;
        const auto r = core::CompressReport::fromJson(child.report);
        const bool childIsB = pair == &b;
        auto ms = [](double v) {
            char buf[32];
            std::snprintf(buf, sizeof buf, "%.3f ms", v);
            return std::string(buf);
        };
        const double pa1 = r.parentLatencyMsB1, c1 = r.latencyMsB1, pa32 = r.parentLatencyMsB32,
                     c32 = r.latencyMsB32;
        row("latency batch 1", ms(childIsB ? pa1 : c1), ms(childIsB ? c1 : pa1),
            ratioText(childIsB ? pa1 : c1, childIsB ? c1 : pa1));
        row("latency batch 32", ms(childIsB ? pa32 : c32), ms(childIsB ? c32 : pa32),
            ratioText(childIsB ? pa32 : c32, childIsB ? c32 : pa32));
        char acc[64];
        std::snprintf(acc, sizeof acc, "%.2f%% vs %.2f%% on %s", r.parentAccuracy * 100, r.accuracy * 100,
                      r.data.c_str());
        row("measured", "", "", acc);
        break;
    }
}

void runAlias(const ModelsState& st) {
    auto registry = openRegistry(st.common);
    if (st.remove) {
        registry->removeAlias(st.name, st.aliasName);
        std::printf("removed alias %s of %s\n", st.aliasName.c_str(), st.name.c_str());
        return;
    }
    if (st.aliasVersion <= 0)
        throw UsageError("give the version the alias points at: models alias NAME ALIAS V");
    registry->setAlias(st.name, st.aliasName, st.aliasVersion);
    std::printf("%s@%s -> v%lld\n", st.name.c_str(), st.aliasName.c_str(),
                static_cast<long long>(st.aliasVersion));
}

}  // namespace

void registerModels(CLI::App& app, int& exitCode) {
    (void)exitCode;
    auto* models = app.add_subcommand("models", "the model registry: register, list, show, compare, alias");
    models->require_subcommand(1);

    auto reg = std::make_shared<ModelsState>();
    auto* r = models->add_subcommand("register",
                                     "register a run's trained model or a TorchScript file as a new version");
    r->add_option("NAME", reg->name, "model name")->required();
    r->add_option("--run", reg->run, "a run id: its last checkpoint becomes the version");
    r->add_option("--file", reg->file,
                  "a TorchScript file (torch.jit.trace(model, x).save(path)) or Lathe artifact");
    r->add_option("--input-shape", reg->inputShape,
                  "one sample's shape for a plain TorchScript file, e.g. 64 or 3,224,224");
    r->add_option("--parent", reg->parent, "the version this one derives from (lineage)");
    r->add_option("--alias", reg->alias, "point this alias (e.g. staging) at the new version");
    addCommonOptions(r, reg->common);
    r->callback([reg] { runRegister(*reg); });

    auto list = std::make_shared<ModelsState>();
    auto* l = models->add_subcommand("list", "registered models, their versions and aliases");
    addCommonOptions(l, list->common);
    l->callback([list] { runList(*list); });

    auto show = std::make_shared<ModelsState>();
    auto* s = models->add_subcommand("show", "a model's versions (NAME) or one version (NAME:V, NAME@ALIAS)");
    s->add_option("REF", show->ref, "NAME, NAME:V or NAME@ALIAS")->required();
    addCommonOptions(s, show->common);
    s->callback([show] { runShow(*show); });

    auto compare = std::make_shared<ModelsState>();
    auto* c = models->add_subcommand("compare", "two versions side by side: size, metrics, lineage, latency");
    c->add_option("A", compare->ref, "NAME:V or NAME@ALIAS")->required();
    c->add_option("B", compare->other, "NAME:V or NAME@ALIAS")->required();
    addCommonOptions(c, compare->common);
    c->callback([compare] { runCompare(*compare); });

    auto alias = std::make_shared<ModelsState>();
    auto* a = models->add_subcommand("alias", "point ALIAS (e.g. production) at version V of NAME");
    a->add_option("NAME", alias->name, "model name")->required();
    a->add_option("ALIAS", alias->aliasName, "alias")->required();
    a->add_option("V", alias->aliasVersion, "version");
    a->add_flag("--remove", alias->remove, "remove the alias");
    addCommonOptions(a, alias->common, false);
    a->callback([alias] { runAlias(*alias); });
}

}  // namespace lathe::cli
