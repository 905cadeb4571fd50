// lathectl: Lathe's capabilities without a display (also what runs on remote hosts).
#include <iostream>

#include "cli_common.h"
#include "lathe/core/error.h"

int main(int argc, char** argv) {
    CLI::App app{"lathectl — train, inspect and manage Lathe runs without a display", "lathectl"};
    app.require_subcommand(1);
    app.set_version_flag("--version", "lathectl 0.1.0");
    int exitCode = lathe::cli::kOk;
    lathe::cli::registerTrain(app, exitCode);
    lathe::cli::registerRuns(app, exitCode);
    lathe::cli::registerWorker(app, exitCode);
    lathe::cli::registerHosts(app, exitCode);
    lathe::cli::registerProfile(app, exitCode);
    lathe::cli::registerLoad(app, exitCode);
    lathe::cli::registerInfo(app, exitCode);
    lathe::cli::registerModels(app, exitCode);
    lathe::cli::registerServe(app, exitCode);
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
        std::cout << app.help();
        return 0;
    } catch (const CLI::CallForAllHelp&) {
        std::cout << app.help("", CLI::AppFormatMode::All);
        return 0;
    } catch (const CLI::CallForVersion&) {
        std::cout << "lathectl 0.1.0\n";
        return 0;
    } catch (const CLI::ParseError& ex) {
        std::cerr << "lathectl: error: " << ex.what() << " (see lathectl --help)\n";
        return lathe::cli::kUsage;
    } catch (const lathe::cli::UsageError& ex) {
        std::cerr << "lathectl: error: " << ex.what() << "\n";
        return lathe::cli::kUsage;
    } catch (const lathe::core::ConfigError& ex) {
        std::cerr << "lathectl: error: " << ex.what() << "\n";
        return lathe::cli::kUsage;
    } catch (const lathe::core::Error& ex) {
        std::cerr << "lathectl: error: " << ex.what() << "\n";
        return lathe::cli::kRunFailed;
    } catch (const std::exception& ex) {
        std::cerr << "lathectl: internal error: " << ex.what() << "\n";
        return lathe::cli::kRunFailed;
    }
    return exitCode;
}
