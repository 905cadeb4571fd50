#pragma once
// "Did you mean": the nearest names to a mistyped command or flag, as git suggests them.
// Pure functions; no CLI11 here (command_tree.h walks the command tree).
#include <cstddef>
#include <string>
#include <vector>

namespace lathe::cli {

/// Damerau–Levenshtein distance (optimal string alignment: insert, delete, substitute, swap two
/// neighbours), case-insensitive.
std::size_t editDistance(const std::string& a, const std::string& b);

/// The candidates nearest to `typed`, best first, in candidate order among equals:
/// - candidates that start with `typed` (a prefix, e.g. `dep` -> deploy, deployments) rank first;
/// - otherwise the smallest edit distance d, accepted when d <= max(2, |typed| / 3) and d is
///   shorter than both words (so `x` does not suggest `db`).
/// Leading dashes are ignored on both sides (`-epochs` -> `--epochs`). Empty when nothing is near.
std::vector<std::string> nearestNames(const std::string& typed, const std::vector<std::string>& candidates);

/// "The most similar command is\n    train" / "The most similar commands are\n    a\n    b"
/// (`what` = "command", "option"); empty for no names. No trailing newline.
std::string similarText(const std::string& what, const std::vector<std::string>& names);

}  // namespace lathe::cli
