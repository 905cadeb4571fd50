#pragma once
// Reading a command line against the lathectl command tree without CLI11 parsing it: which
// command a word belongs to, which word is not a command or flag there (for "did you mean"),
// and what the word being completed can be (`lathectl __complete`).
#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>

namespace lathe::cli {

struct CommandWalk {
    const CLI::App* app = nullptr;         // the deepest command the words reached
    int positionals = 0;                   // positional words given to `app`
    const CLI::Option* pending = nullptr;  // the last word was a flag still waiting for its value
    bool positionalOnly = false;           // after `--`
    std::string db;                        // the value of --db, when given
    // The first word that is neither a command, a flag nor a value where it stands.
    enum class Unknown { None, Command, Option } unknown = Unknown::None;
    std::string unknownWord;
    const CLI::App* unknownIn = nullptr;
};

/// Walks `words` (the arguments after the program name) down from `root`.
CommandWalk walkCommandLine(const CLI::App& root, const std::vector<std::string>& words);

/// "runs show" for that subcommand, "" for the root.
std::string commandPath(const CLI::App* app);

/// Visible subcommand names (not those hidden with an empty group) and flag names of `app`.
std::vector<std::string> commandNames(const CLI::App* app);
std::vector<std::string> flagNames(const CLI::App* app);

/// The message for a command line whose first unknown command or flag `walk` found:
/// "lathectl: error: unknown command 'trian' (see lathectl --help)\n\nThe most similar command
/// is\n    train\n". Nothing when the walk found no unknown word.
std::optional<std::string> unknownArgumentMessage(const CommandWalk& walk);

/// The hidden `lathectl __complete WORDS...`: registered so that it is a known command (hidden
/// from help); main() runs it before CLI11 parses anything so that words such as `-h` are data.
void registerComplete(CLI::App& app);
/// Prints one candidate per line for the last of `words` (the word being completed; "" for a
/// new word). Never prints to stderr and never creates a workspace. Returns 0.
int runComplete(const CLI::App& root, const std::vector<std::string>& words);

}  // namespace lathe::cli
