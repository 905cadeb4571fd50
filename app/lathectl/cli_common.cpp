#include "cli_common.h"

#include <cmath>
#include <ctime>

#include "lathe/core/error.h"

namespace lathe::cli {

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
        std::snprintf(buf, sizeof buf, "%d h %02d min", static_cast<int>(s) / 3600, static_cast<int>(s) % 3600 / 60);
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

}  // namespace lathe::cli
