#pragma once
// Where this program is, and the programs installed beside it (executable.cpp).
#include <string>

namespace lathe::core {

/// The absolute path of the running program (/proc/self/exe). Throws Error when it cannot be read.
std::string executablePath();

/// `name` (e.g. "lathectl") when this program is it, else the file of that name beside this
/// program. Throws Error naming both when there is none.
std::string siblingProgram(const std::string& name);

}  // namespace lathe::core
