#include "durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace fs = std::filesystem;

namespace lathe::core {

std::string writeFileDurably(const std::string& path, std::initializer_list<std::string_view> parts) {
    const fs::path dir = fs::path(path).parent_path();
    std::error_code ec;
    if (!dir.empty()) fs::create_directories(dir, ec);
    const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return "cannot write " + tmp + ": " + std::strerror(errno);
    const auto fail = [&](const std::string& what) {
        const std::string why = what + ": " + std::strerror(errno);
        ::close(fd);
        ::unlink(tmp.c_str());
        return why;
    };
    for (const auto part : parts) {
        const char* p = part.data();
        size_t n = part.size();
        while (n > 0) {
            const ssize_t w = ::write(fd, p, n);
            if (w < 0) {
                if (errno == EINTR) continue;
                return fail("writing " + tmp + " failed");
            }
            p += w;
            n -= static_cast<size_t>(w);
        }
    }
    if (::fsync(fd) != 0) return fail("fsync of " + tmp + " failed");
    ::close(fd);
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const std::string why = "cannot move " + tmp + " into place at " + path + ": " + std::strerror(errno);
        ::unlink(tmp.c_str());
        return why;
    }
    if (const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
    return {};
}

}  // namespace lathe::core
