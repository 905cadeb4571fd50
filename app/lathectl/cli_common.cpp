#include "cli_common.h"

#include <cmath>
#include <csignal>
#include <ctime>
#include <sstream>

#include "lathe/core/error.h"
#include "lathe/core/registry.h"

namespace lathe::cli {

std::string versionLine() { return std::string("lathectl ") + kVersion; }

void addCommonOptions(CLI::App* cmd, CommonOptions& opts, bool withJson) {
    cmd->add_option("--db", opts.db,
                    "workspace database (default: $LATHE_DB, else $XDG_DATA_HOME/lathe/lathe.db, i.e. "
                    "~/.local/share/lathe/lathe.db)");
    if (withJson) cmd->add_flag("--json", opts.json, "print machine-readable JSON");
}

std::unique_ptr<core::Store> openStore(const CommonOptions& opts) {
    try {
        return std::make_unique<core::Store>(core::Store::resolvePath(opts.db));
    } catch (const core::StoreError& ex) {
        throw UsageError(ex.what());
    }
}

std::string flagName(const std::string& key) {
    std::string f = "--" + key;
    for (auto& c : f)
        if (c == '_') c = '-';
    return f;
}

namespace {

std::atomic<bool> g_stop{false};

extern "C" void onInterrupt(int) {
    // First Ctrl+C: finish the current step and record the run as stopped. Second: the default.
    g_stop.store(true);
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
}

}  // namespace

std::atomic<bool>& installStopHandler() {
    g_stop.store(false);
    std::signal(SIGINT, onInterrupt);
    std::signal(SIGTERM, onInterrupt);
    return g_stop;
}

void removeStopHandler() {
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
}

void addSpecFlags(CLI::App* cmd, SpecFlags& flags) {
    cmd->add_option("config", flags.config, "TOML run configuration; flags override its keys");
    for (const auto& k : core::specKeys()) {
        std::string typeName = k.kind == "int"        ? "INT"
                               : k.kind == "float"    ? "X"
                               : k.kind == "int-list" ? "N,N,..."
                                                      : "TEXT";
        if (k.kind == "choice") {
            typeName.clear();
            for (const auto& c : k.choices) typeName += (typeName.empty() ? "" : "|") + c;
        }
        if (k.kind == "bool") {
            // `--profile` alone means true; `--profile false` is accepted too.
            flags.options[k.name] = cmd->add_option(flagName(k.name), flags.values[k.name], k.help)
                                        ->expected(0, 1)
                                        ->type_name("[true|false]");
            continue;
        }
        flags.options[k.name] =
            cmd->add_option(flagName(k.name), flags.values[k.name], k.help)->type_name(typeName);
    }
}

core::RunSpec buildSpec(const SpecFlags& flags, core::RunSpec base) {
    core::RunSpec spec = flags.config.empty() ? std::move(base) : core::loadRunSpec(flags.config);
    for (const auto& [key, opt] : flags.options) {
        if (opt->count() == 0) continue;
        try {
            const std::string& value = flags.values.at(key);
            const bool isBool = opt->get_expected_min() == 0;
            core::setSpecValue(spec, key, value.empty() && isBool ? "true" : value);
        } catch (const core::ConfigError& ex) {
            throw UsageError(flagName(key) + ": " + ex.what());
        }
    }
    core::validateOrThrow(spec);
    return spec;
}

std::string formatTime(double t) {
    if (t <= 0) return "-";
    const std::time_t secs = static_cast<std::time_t>(t);
    std::tm tm{};
    localtime_r(&secs, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
    return buf;
}

std::string formatDuration(double s) {
    char buf[64];
    if (s < 0) return "-";
    if (s < 60)
        std::snprintf(buf, sizeof buf, "%.1f s", s);
    else if (s < 3600)
        std::snprintf(buf, sizeof buf, "%d min %02d s", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
    else
        std::snprintf(buf, sizeof buf, "%d h %02d min", static_cast<int>(s) / 3600,
                      static_cast<int>(s) % 3600 / 60);
    return buf;
}

std::string formatValue(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return buf;
}

nlohmann::json metricJson(double v) {
    if (std::isfinite(v)) return v;
    return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
}

std::vector<int64_t> parseShape(const std::string& text) {
    std::vector<int64_t> out;
    std::stringstream ss(text);
    for (std::string part; std::getline(ss, part, ',');) {
        try {
            size_t used = 0;
            const auto v = std::stoll(part, &used);
            if (used != part.size() || v <= 0) throw std::invalid_argument("");
            out.push_back(v);
        } catch (const std::exception&) {
            throw UsageError("--input-shape '" + text +
                             "' must be positive integers separated by commas (e.g. 3,224,224)");
        }
    }
    return out;
}

std::unique_ptr<core::Registry> openRegistry(const CommonOptions& c) {
    try {
        return std::make_unique<core::Registry>(core::Store::resolvePath(c.db));
    } catch (const core::StoreError& ex) {
        throw UsageError(ex.what());
    }
}

}  // namespace lathe::cli
