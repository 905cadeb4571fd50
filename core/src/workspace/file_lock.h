#pragma once
// An exclusive flock on a file, held until destruction: one deploy of a model, one training
// process of a run. O_CLOEXEC, so a server or worker started by exec never inherits it. The
// holder's pid is written into the file, so a process that finds it taken can say who has it.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "lathe/core/error.h"

namespace lathe::core {

class FileLock {
public:
    /// Creates `path` (and its directory). `wait`: block until the lock is free; otherwise
    /// return at once, with held() false when another process has it. Throws Error when the
    /// file cannot be opened or locked.
    FileLock(const std::string& path, bool wait) {
        std::error_code ec;
        std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
        m_fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (m_fd < 0) throw Error("cannot open " + path + ": " + std::strerror(errno));
        if (::flock(m_fd, LOCK_EX | (wait ? 0 : LOCK_NB)) != 0) {
            if (!wait && errno == EWOULDBLOCK) {
                char pid[32] = {};
                (void)!::pread(m_fd, pid, sizeof pid - 1, 0);
                m_holder = pid;
                return;
            }
            const int err = errno;
            ::close(m_fd);
            throw Error("cannot lock " + path + ": " + std::strerror(err));
        }
        m_held = true;
        const auto text = std::to_string(::getpid());
        if (::ftruncate(m_fd, 0) == 0) (void)!::pwrite(m_fd, text.data(), text.size(), 0);
    }
    ~FileLock() { ::close(m_fd); }
    FileLock(const FileLock&) = delete;
    FileLock& operator=(const FileLock&) = delete;

    bool held() const { return m_held; }
    /// The pid the holder wrote, when held() is false (may be empty).
    const std::string& holder() const { return m_holder; }

private:
    int m_fd = -1;
    bool m_held = false;
    std::string m_holder;
};

}  // namespace lathe::core
