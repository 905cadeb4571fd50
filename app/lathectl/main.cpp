// lathectl: Lathe's capabilities without a display (also what runs on remote hosts).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "cli_common.h"
#include "command_tree.h"
#include "lathe/core/error.h"
#include "lathe/core/fork_server.h"
#include "lathe/core/torch_runtime.h"

namespace {

int runCommandLine(int argc, char** argv) {
    CLI::App app{"lathectl — train, inspect and manage Lathe runs without a display", "lathectl"};
    app.require_subcommand(1);
    app.set_version_flag("--version", lathe::cli::versionLine());
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
    lathe::cli::registerCompress(app, exitCode);
    lathe::cli::registerGraph(app, exitCode);
    lathe::cli::registerRollout(app, exitCode);
    lathe::cli::registerData(app, exitCode);
    lathe::cli::registerTune(app, exitCode);
    lathe::cli::registerComplete(app);
    const std::vector<std::string> args(argv + 1, argv + argc);
    // Before CLI11 sees anything: the words to complete are data, `-h` among them included.
    if (!args.empty() && args.front() == "__complete")
        return lathe::cli::runComplete(app, std::vector<std::string>(args.begin() + 1, args.end()));
    if (args.empty()) {  // `lathectl` alone: what it can do, not an error
        std::cout << app.help();
        return 0;
    }
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
        std::cout << app.help();
        return 0;
    } catch (const CLI::CallForAllHelp&) {
        std::cout << app.help("", CLI::AppFormatMode::All);
        return 0;
    } catch (const CLI::CallForVersion&) {
        std::cout << lathe::cli::versionLine() << "\n";
        return 0;
    } catch (const CLI::ParseError& ex) {
        // An unknown command or flag: name it and the nearest ones, as git does.
        if (const auto message = lathe::cli::unknownArgumentMessage(lathe::cli::walkCommandLine(app, args))) {
            std::cerr << *message;
            return lathe::cli::kUsage;
        }
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

}  // namespace

int main(int argc, char** argv) {
    // `lathectl __fork-server FD`, started by lathectl tune: LibTorch loaded once, then each trial a
    // forked copy running the command line it was sent (lathe/core/fork_server.h).
    if (argc >= 3 && std::string(argv[1]) == "__fork-server") {
        // Its argv strings lie end to end (as the kernel lays them out): the room ps shows.
        lathe::core::ArgvArea area{
            argv[0], static_cast<size_t>(argv[argc - 1] + std::strlen(argv[argc - 1]) - argv[0])};
        return lathe::core::serveForks(std::atoi(argv[2]), area, [](std::vector<std::string> args) {
            std::vector<char*> v;
            for (auto& a : args) v.push_back(a.data());
            v.push_back(nullptr);
            return runCommandLine(static_cast<int>(args.size()), v.data());
        });
    }
    const int code = runCommandLine(argc, argv);
    // A command that loaded LibTorch leaves without running its static destructors: they
    // deregister thousands of operators, about 0.3 s of every `lathectl train`. The command has
    // closed its workspace and joined its threads by now; only the streams need flushing.
    if (lathe::core::torchRuntimeLoaded()) {
        std::cout.flush();
        std::cerr.flush();
        std::fflush(nullptr);
        ::_exit(code);
    }
    return code;
}
