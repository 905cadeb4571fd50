#pragma once
// Shared pieces of the lathectl command tree: exit codes, --db handling, output helpers.
#include <CLI/CLI.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "lathe/core/registry.h"
#include "lathe/core/run_spec.h"
#include "lathe/core/store.h"

namespace lathe::cli {

enum ExitCode : int { kOk = 0, kRunFailed = 1, kUsage = 2, kInterrupted = 130 };

/// Lathe's version, "0.1.0".
inline constexpr const char* kVersion = "0.1.0";
/// What `lathectl --version` prints, without the newline: "lathectl 0.1.0" (`hosts check`
/// compares a host's lathectl with it).
std::string versionLine();

/// A usage/config problem: printed as one line, exit code 2.
struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// Options every command takes.
struct CommonOptions {
    std::string db;
    bool json = false;
};
void addCommonOptions(CLI::App* cmd, CommonOptions& opts, bool withJson = true);

/// Opens the workspace named by --db / $LATHE_DB / the XDG default; StoreError becomes UsageError.
std::unique_ptr<core::Store> openStore(const CommonOptions& opts);
/// The same workspace's model registry; StoreError becomes UsageError.
std::unique_ptr<core::Registry> openRegistry(const CommonOptions& opts);

std::string formatTime(double unixSeconds);  // local "YYYY-MM-DD HH:MM:SS", "-" for 0
std::string formatDuration(double seconds);  // "3.2 s", "4 min 05 s"
std::string formatValue(double v);           // metrics: up to 6 significant digits
nlohmann::json metricJson(double v);         // NaN/inf as strings

/// A RunSpec from flags: the optional CONFIG.toml positional and one --flag per spec key.
struct SpecFlags {
    std::string config;
    std::map<std::string, std::string> values;
    std::map<std::string, CLI::Option*> options;
};
void addSpecFlags(CLI::App* cmd, SpecFlags& flags);
/// The flag of a run key: weight_decay -> --weight-decay.
std::string flagName(const std::string& key);
/// Applies the flags that were given on top of `base` (or of CONFIG when given); throws
/// UsageError / ConfigError naming the flag or the file line.
core::RunSpec buildSpec(const SpecFlags& flags, core::RunSpec base = {});

/// `--input-shape 3,224,224`: positive integers separated by commas. Throws UsageError.
std::vector<int64_t> parseShape(const std::string& text);

/// SIGINT/SIGTERM request a clean stop through this flag while a run is in progress.
std::atomic<bool>& installStopHandler();
void removeStopHandler();

void registerWorker(CLI::App& app, int& exitCode);
void registerTrain(CLI::App& app, int& exitCode);
void registerRuns(CLI::App& app, int& exitCode);
void registerInfo(CLI::App& app, int& exitCode);
void registerHosts(CLI::App& app, int& exitCode);
void registerProfile(CLI::App& app, int& exitCode);
void registerLoad(CLI::App& app, int& exitCode);
void registerModels(CLI::App& app, int& exitCode);
void registerCompress(CLI::App& app, int& exitCode);
void registerServe(CLI::App& app, int& exitCode);
void registerGraph(CLI::App& app, int& exitCode);
void registerRollout(CLI::App& app, int& exitCode);
void registerData(CLI::App& app, int& exitCode);
void registerTune(CLI::App& app, int& exitCode);

/// "a,b,,c" → {"a", "b", "c"}.
std::vector<std::string> splitList(const std::string& text);

}  // namespace lathe::cli
