// lathectl models: register versions, list and show them, point aliases.
#include <cstdio>
#include <iostream>
#include <sstream>

#include "cli_common.h"
#include "lathe/core/model_artifact.h"
#include "lathe/core/registry.h"

namespace lathe::cli {
namespace {

struct ModelsState {
    CommonOptions common;
    std::string name;
    std::string ref;
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

std::unique_ptr<core::Registry> openRegistry(const CommonOptions& c) {
    try {
        return std::make_unique<core::Registry>(core::Store::resolvePath(c.db));
    } catch (const core::StoreError& ex) {
        throw UsageError(ex.what());
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
        if (v.parentVersion > 0) std::printf("  parent    v%lld\n", static_cast<long long>(v.parentVersion));
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
    auto* models = app.add_subcommand("models", "the model registry: register, list, show, alias");
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
