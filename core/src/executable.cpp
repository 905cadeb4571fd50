#include "lathe/core/executable.h"

#include <unistd.h>

#include <filesystem>

#include "lathe/core/error.h"

namespace lathe::core {

std::string executablePath() {
    char buf[4096];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) throw Error("cannot find the path of this program (/proc/self/exe)");
    return std::string(buf, static_cast<size_t>(n));
}

std::string siblingProgram(const std::string& name) {
    const std::filesystem::path self(executablePath());
    if (self.filename() == name) return self.string();
    const auto sibling = self.parent_path() / name;
    std::error_code ec;
    if (std::filesystem::exists(sibling, ec)) return sibling.string();
    throw Error("cannot find " + name + " next to " + self.string());
}

}  // namespace lathe::core
