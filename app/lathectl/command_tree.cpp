// Walking a command line against the command tree: "did you mean" for unknown commands and
// flags, and the candidates `lathectl __complete` prints for bash completion.
#include "command_tree.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "lathe/core/data_versions.h"
#include "lathe/core/registry.h"
#include "lathe/core/store.h"
#include "lathe/core/studies.h"
#include "suggest.h"

namespace lathe::cli {
namespace {

bool looksLikeNumber(const std::string& w) {
    if (w.empty()) return false;
    char* end = nullptr;
    std::strtod(w.c_str(), &end);
    return end != nullptr && *end == '\0';
}

/// A word CLI11 reads as a flag: `-x…` or `--name…`, but not a negative number or `-`.
bool isFlagWord(const std::string& w) { return w.size() > 1 && w[0] == '-' && !looksLikeNumber(w); }

std::vector<const CLI::App*> subcommandsOf(const CLI::App* app) {
    return app->get_subcommands(
        [](const CLI::App* s) { return !s->get_name().empty(); });  // not option groups
}

std::vector<const CLI::Option*> optionsOf(const CLI::App* app) {
    auto out = app->get_options([](const CLI::Option*) { return true; });
    // An option group (lathectl load's `--rate | --connections`) is a nameless subcommand whose
    // options CLI11 lists only for groups named "+...": they are the command's all the same.
    for (const CLI::App* sub :
         app->get_subcommands([](const CLI::App* s) { return s->get_name().empty(); })) {
        const auto more = optionsOf(sub);
        for (const CLI::Option* opt : more)
            if (std::find(out.begin(), out.end(), opt) == out.end()) out.push_back(opt);
    }
    return out;
}

const CLI::App* findSubcommand(const CLI::App* app, const std::string& word) {
    for (const CLI::App* sub : subcommandsOf(app))
        if (sub->check_name(word)) return sub;
    return nullptr;
}

const CLI::Option* findFlag(const CLI::App* app, const std::string& name) {
    for (const CLI::Option* opt : optionsOf(app))
        if (opt->nonpositional() && opt->check_name(name)) return opt;
    return nullptr;
}

bool hasPositionals(const CLI::App* app) {
    for (const CLI::Option* opt : optionsOf(app))
        if (opt->get_positional() && !opt->nonpositional()) return true;
    return false;
}

bool takesValue(const CLI::Option* opt) { return opt->get_items_expected_max() > 0; }

bool isFlag(const CLI::Option* opt, const char* longName) { return opt->check_name(longName); }

// ---- completion ----------------------------------------------------------------------------

enum class Kind { None, Run, Model, Host, DataSet, Study };

Kind valueKind(const std::string& path, const CLI::Option* opt) {
    if ((path == "train" && isFlag(opt, "--resume")) || (path == "models register" && isFlag(opt, "--run")))
        return Kind::Run;
    if (path == "serve" && isFlag(opt, "--model")) return Kind::Model;
    if (path == "tune" && isFlag(opt, "--resume")) return Kind::Study;
    return Kind::None;
}

Kind positionalKind(const std::string& path, int index) {
    if (index != 0) return Kind::None;
    for (const char* p : {"runs show", "metrics", "profile"})
        if (path == p) return Kind::Run;
    for (const char* p : {"models show", "models alias", "models register", "deploy", "rollback", "undeploy",
                          "deployments", "lineage"})
        if (path == p) return Kind::Model;
    for (const char* p :
         {"data add", "data show", "data diff", "data checkout", "data rollback", "data verify"})
        if (path == p) return Kind::DataSet;
    for (const char* p : {"hosts check", "hosts trust", "hosts remove"})
        if (path == p) return Kind::Host;
    for (const char* p : {"studies show", "studies remove"})
        if (path == p) return Kind::Study;
    return Kind::None;
}

/// Run ids (newest first), model names or host names of the workspace --db names (else the
/// default one); nothing when that file does not exist: completing must never create a workspace.
std::vector<std::string> workspaceNames(Kind kind, const std::string& db) {
    std::vector<std::string> out;
    if (kind == Kind::None) return out;
    const std::string path = core::Store::resolvePath(db);
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) return out;
    if (kind == Kind::Run) {
        const core::Store store(path);
        for (const auto& run : store.listRuns()) out.push_back(std::to_string(run.id));
    } else if (kind == Kind::Host) {
        const core::Store store(path);
        for (const auto& host : store.hosts()) out.push_back(host.name);
    } else if (kind == Kind::DataSet) {
        const core::DataSets sets(path);
        for (const auto& v : sets.list()) out.push_back(v.name);
    } else if (kind == Kind::Study) {
        const core::Studies studies(path);
        for (const auto& s : studies.list()) out.push_back(s.name);
    } else {
        const core::Registry registry(path);
        for (const auto& model : registry.listModels()) out.push_back(model.name);
    }
    return out;
}

/// The choices of a flag whose value type reads `a|b|c` (or `[true|false]`).
std::vector<std::string> choicesOf(const CLI::Option* opt) {
    std::string type = opt->get_type_name();
    if (type.size() >= 2 && type.front() == '[' && type.back() == ']') type = type.substr(1, type.size() - 2);
    if (type.find('|') == std::string::npos || type.find(' ') != std::string::npos) return {};
    std::vector<std::string> out;
    size_t start = 0;
    for (size_t bar; (bar = type.find('|', start)) != std::string::npos; start = bar + 1)
        out.push_back(type.substr(start, bar - start));
    out.push_back(type.substr(start));
    return out;
}

}  // namespace

CommandWalk walkCommandLine(const CLI::App& root, const std::vector<std::string>& words) {
    CommandWalk walk;
    walk.app = &root;
    auto noteUnknown = [&walk](CommandWalk::Unknown kind, const std::string& word) {
        if (walk.unknown != CommandWalk::Unknown::None) return;
        walk.unknown = kind;
        walk.unknownWord = word;
        walk.unknownIn = walk.app;
    };
    for (const std::string& w : words) {
        if (walk.pending) {
            if (w == "=") continue;  // bash splits `--db=PATH` into `--db`, `=`, `PATH`
            const CLI::Option* opt = walk.pending;
            walk.pending = nullptr;
            // A flag whose value is optional (`--profile [true|false]`) leaves a following flag alone.
            if (!(opt->get_items_expected_min() == 0 && isFlagWord(w))) {
                if (isFlag(opt, "--db")) walk.db = w;
                continue;
            }
        }
        if (!walk.positionalOnly && w == "--") {
            walk.positionalOnly = true;
            continue;
        }
        if (!walk.positionalOnly && isFlagWord(w)) {
            std::string name = w, value;
            bool attached = false;
            if (w.rfind("--", 0) == 0) {
                const auto eq = w.find('=');
                if (eq != std::string::npos) {
                    name = w.substr(0, eq);
                    value = w.substr(eq + 1);
                    attached = true;
                }
            } else if (w.size() > 2) {  // -iKEY, or a cluster of short flags -qv
                name = w.substr(0, 2);
                value = w.substr(2);
                attached = true;
            }
            const CLI::Option* opt = findFlag(walk.app, name);
            if (!opt) {
                noteUnknown(CommandWalk::Unknown::Option, w.rfind("--", 0) == 0 ? name : w);
                continue;
            }
            if (takesValue(opt)) {
                if (!attached)
                    walk.pending = opt;
                else if (isFlag(opt, "--db"))
                    walk.db = value;
            }
            continue;
        }
        if (!walk.positionalOnly) {
            if (const CLI::App* sub = findSubcommand(walk.app, w)) {
                walk.app = sub;
                walk.positionals = 0;
                continue;
            }
            if (!subcommandsOf(walk.app).empty() && !hasPositionals(walk.app)) {
                noteUnknown(CommandWalk::Unknown::Command, w);
                continue;
            }
        }
        ++walk.positionals;
    }
    return walk;
}

std::string commandPath(const CLI::App* app) {
    std::string path;
    for (; app && app->get_parent(); app = app->get_parent())
        path = app->get_name() + (path.empty() ? "" : " " + path);
    return path;
}

std::vector<std::string> commandNames(const CLI::App* app) {
    std::vector<std::string> out;
    for (const CLI::App* sub : subcommandsOf(app))
        if (!sub->get_group().empty() && !sub->get_disabled()) out.push_back(sub->get_name());
    return out;
}

std::vector<std::string> flagNames(const CLI::App* app) {
    std::vector<std::string> out;
    for (const CLI::Option* opt : optionsOf(app)) {
        if (!opt->nonpositional() || opt->get_group().empty()) continue;
        for (const auto& l : opt->get_lnames()) out.push_back("--" + l);
        for (const auto& s : opt->get_snames()) out.push_back("-" + s);
    }
    return out;
}

std::optional<std::string> unknownArgumentMessage(const CommandWalk& walk) {
    if (walk.unknown == CommandWalk::Unknown::None) return std::nullopt;
    const bool command = walk.unknown == CommandWalk::Unknown::Command;
    const std::string what = command ? "command" : "option";
    const std::string path = commandPath(walk.unknownIn);
    std::string msg = "lathectl: error: unknown " + what + " '" + walk.unknownWord + "'";
    if (!path.empty()) msg += " for 'lathectl " + path + "'";
    msg += " (see lathectl " + (path.empty() ? "" : path + " ") + "--help)\n";
    const auto names =
        nearestNames(walk.unknownWord, command ? commandNames(walk.unknownIn) : flagNames(walk.unknownIn));
    if (!names.empty()) msg += "\n" + similarText(what, names) + "\n";
    return msg;
}

void registerComplete(CLI::App& app) {
    auto* cmd = app.add_subcommand("__complete",
                                   "print completion candidates for the last of WORDS (bash completion)");
    cmd->group("");  // hidden from help and from suggestions
    cmd->prefix_command();
    cmd->allow_extras();
}

int runComplete(const CLI::App& root, const std::vector<std::string>& words) {
    // Whatever happens below, nothing reaches the terminal but candidates.
    const int devNull = ::open("/dev/null", O_WRONLY);
    if (devNull >= 0) {
        ::dup2(devNull, STDERR_FILENO);
        ::close(devNull);
    }
    try {
        const std::vector<std::string> before(words.begin(), words.empty() ? words.end() : words.end() - 1);
        std::string cur = words.empty() ? std::string() : words.back();
        const CommandWalk walk = walkCommandLine(root, before);
        const std::string path = commandPath(walk.app);

        const CLI::Option* valueOf = walk.pending;
        std::string prefix;  // `--resume=` when the word being completed holds it
        if (valueOf && cur == "=") cur.clear();
        if (!valueOf && !walk.positionalOnly && cur.rfind("--", 0) == 0 &&
            cur.find('=') != std::string::npos) {
            const auto eq = cur.find('=');
            const CLI::Option* opt = findFlag(walk.app, cur.substr(0, eq));
            if (!opt || !takesValue(opt)) return 0;
            valueOf = opt;
            prefix = cur.substr(0, eq + 1);
            cur = cur.substr(eq + 1);
        }

        std::vector<std::string> candidates;
        if (valueOf) {
            const Kind kind = valueKind(path, valueOf);
            candidates = kind != Kind::None ? workspaceNames(kind, walk.db) : choicesOf(valueOf);
        } else if (!walk.positionalOnly && !cur.empty() && cur[0] == '-') {
            candidates = flagNames(walk.app);
        } else {
            if (!walk.positionalOnly) candidates = commandNames(walk.app);
            if (candidates.empty())
                candidates = workspaceNames(positionalKind(path, walk.positionals), walk.db);
        }
        std::string out;
        for (const auto& c : candidates)
            if (c.rfind(cur, 0) == 0) out += prefix + c + "\n";
        std::cout << out << std::flush;
    } catch (...) {
        // Completing must never fail loudly: no candidates.
    }
    return 0;
}

}  // namespace lathe::cli
