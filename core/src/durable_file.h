#pragma once
// Replacing a file so that a crash or power cut leaves the old content or the new, never part of
// it: written to a temporary beside it, synced, renamed over it, and the directory synced (the
// rename is durable only then). Checkpoints and the PPO agent's policy are written this way.
#include <initializer_list>
#include <string>
#include <string_view>

namespace lathe::core {

/// Writes the concatenation of `parts` to `path` as above (creating its directory), through
/// `path.tmp-PID`. Returns an empty string, or what failed ("cannot write X: reason"), the
/// temporary removed; the caller throws its own error type with it.
std::string writeFileDurably(const std::string& path, std::initializer_list<std::string_view> parts);

}  // namespace lathe::core
