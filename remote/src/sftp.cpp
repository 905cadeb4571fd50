// SFTP transfers with size and SHA-256 checks. One SFTP channel per call: transfers are rare
// (a config, a checkpoint, a binary) and a fresh channel leaves nothing half-open on failure.
#include "lathe/remote/sftp.h"

#include <libssh/sftp.h>

#include <fcntl.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <vector>

#include "lathe/core/sha256.h"
#include "session_access.h"

namespace lathe::remote {

namespace {

using detail::SessionAccess;

constexpr size_t kChunk = 64 * 1024;

[[noreturn]] void fail(SshSession& s, const std::string& what) {
    throw SshError(SshError::Kind::Transfer, SessionAccess::label(s), what);
}

struct SftpDeleter {
    void operator()(sftp_session p) const noexcept { sftp_free(p); }
};
using SftpPtr = std::unique_ptr<std::remove_pointer_t<sftp_session>, SftpDeleter>;
struct FileDeleter {
    void operator()(sftp_file f) const noexcept { sftp_close(f); }
};
using FilePtr = std::unique_ptr<std::remove_pointer_t<sftp_file>, FileDeleter>;
struct AttrDeleter {
    void operator()(sftp_attributes a) const noexcept { sftp_attributes_free(a); }
};
using AttrPtr = std::unique_ptr<std::remove_pointer_t<sftp_attributes>, AttrDeleter>;

SftpPtr openSftp(SshSession& s) {
    ssh_session native = SessionAccess::native(s);
    SftpPtr sftp(sftp_new(native));
    // sftp_new() already asks for the subsystem: a server without one fails here.
    if (!sftp)
        fail(s, "cannot start SFTP (" + SessionAccess::error(s) +
                    "); the host's sshd_config needs a Subsystem sftp line (Debian's default has one)");
    if (sftp_init(sftp.get()) != SSH_OK)
        fail(s, "the SFTP subsystem did not start: " + SessionAccess::error(s));
    return sftp;
}

std::string sftpError(SshSession& s, sftp_session sftp) {
    switch (sftp_get_error(sftp)) {
        case SSH_FX_NO_SUCH_FILE:
            return "no such file";
        case SSH_FX_PERMISSION_DENIED:
            return "permission denied";
        case SSH_FX_FAILURE:
            return "failure (disk full, or a directory in the way?)";
        default:
            return SessionAccess::error(s);
    }
}

// mkdir -p over SFTP.
void makeParents(SshSession& s, sftp_session sftp, const std::string& path) {
    const auto slash = path.rfind('/');
    if (slash == std::string::npos || slash == 0) return;
    std::string dir;
    size_t pos = 0;
    const std::string parent = path.substr(0, slash);
    while (pos <= parent.size()) {
        const auto next = parent.find('/', pos);
        dir = parent.substr(0, next == std::string::npos ? parent.size() : next);
        pos = next == std::string::npos ? parent.size() + 1 : next + 1;
        if (dir.empty()) continue;
        AttrPtr st(sftp_stat(sftp, dir.c_str()));
        if (st) {
            if (st->type != SSH_FILEXFER_TYPE_DIRECTORY)
                fail(s, "cannot create " + dir + ": a file is in the way");
            continue;
        }
        if (sftp_mkdir(sftp, dir.c_str(), 0755) != SSH_OK) {
            AttrPtr again(sftp_stat(sftp, dir.c_str()));  // created meanwhile by another transfer
            if (!again) fail(s, "cannot create directory " + dir + ": " + sftpError(s, sftp));
        }
    }
}

std::string partSuffix() {
    static std::atomic<unsigned> counter{0};
    std::random_device rd;
    return std::to_string(rd() % 1000000) + "-" + std::to_string(counter.fetch_add(1));
}

std::string firstWord(const std::string& text) {
    const auto end = text.find_first_of(" \t\n");
    return text.substr(0, end);
}

}  // namespace

std::string shellQuote(const std::string& text) {
    std::string out = "'";
    for (char c : text) {
        if (c == '\'')
            out += "'\\''";
        else
            out += c;
    }
    return out + "'";
}

std::string remoteSha256(SshSession& session, const std::string& remotePath) {
    const std::string out =
        session.run("sha256sum -- " + shellQuote(remotePath), "sha256sum " + remotePath, 300);
    const std::string digest = firstWord(out);
    if (digest.size() != 64) fail(session, "sha256sum " + remotePath + " printed no digest");
    return digest;
}

TransferResult upload(SshSession& session, const std::string& localPath, const std::string& remotePath,
                      int mode) {
    std::ifstream in(localPath, std::ios::binary);
    if (!in) fail(session, "cannot read " + localPath);
    auto sftp = openSftp(session);
    makeParents(session, sftp.get(), remotePath);
    // A name of its own: two hosts sharing a home directory (NFS) upload the same file at once.
    const std::string part = remotePath + ".part-" + partSuffix();
    TransferResult result;
    {
        FilePtr file(
            sftp_open(sftp.get(), part.c_str(), O_WRONLY | O_CREAT | O_TRUNC, static_cast<mode_t>(mode)));
        if (!file) fail(session, "cannot create " + part + ": " + sftpError(session, sftp.get()));
        std::vector<char> buf(kChunk);
        while (in) {
            in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
            const auto n = static_cast<size_t>(in.gcount());
            size_t done = 0;
            while (done < n) {
                const ssize_t w = sftp_write(file.get(), buf.data() + done, n - done);
                if (w <= 0) {
                    const std::string why = sftpError(session, sftp.get());
                    file.reset();
                    sftp_unlink(sftp.get(), part.c_str());
                    fail(session, "writing " + part + " failed after " + std::to_string(result.bytes + done) +
                                      " bytes: " + why);
                }
                done += static_cast<size_t>(w);
            }
            result.bytes += n;
        }
        if (in.bad()) fail(session, "reading " + localPath + " failed");
    }
    const auto cleanup = [&] { sftp_unlink(sftp.get(), part.c_str()); };
    AttrPtr st(sftp_stat(sftp.get(), part.c_str()));
    if (!st) {
        cleanup();
        fail(session, "cannot stat " + part + " after writing it: " + sftpError(session, sftp.get()));
    }
    if (st->size != result.bytes) {
        cleanup();
        fail(session, part + " has " + std::to_string(st->size) + " bytes on the host, " +
                          std::to_string(result.bytes) + " were sent");
    }
    result.sha256 = core::sha256File(localPath);
    const std::string there = remoteSha256(session, part);
    if (there != result.sha256) {
        cleanup();
        fail(session, "upload of " + localPath + " arrived different (SHA-256 " + there + " on the host, " +
                          result.sha256 + " here)");
    }
    sftp_chmod(sftp.get(), part.c_str(), static_cast<mode_t>(mode));
    // rename(2) on the host replaces the target atomically (SFTP v3's rename does not replace, and
    // unlink-then-rename races with another host writing the same file on a shared home).
    try {
        session.run("mv -f -- " + shellQuote(part) + " " + shellQuote(remotePath), "renaming " + part, 60);
    } catch (const SshError& ex) {
        cleanup();
        fail(session, std::string("cannot put ") + remotePath + " in place: " + ex.what());
    }
    return result;
}

bool remoteFileExists(SshSession& session, const std::string& remotePath) {
    auto sftp = openSftp(session);
    AttrPtr st(sftp_stat(sftp.get(), remotePath.c_str()));
    if (st) return true;
    if (sftp_get_error(sftp.get()) == SSH_FX_NO_SUCH_FILE) return false;
    fail(session, "cannot stat " + remotePath + ": " + sftpError(session, sftp.get()));
    return false;
}

TransferResult download(SshSession& session, const std::string& remotePath, const std::string& localPath,
                        const std::string& expectedSha256) {
    auto sftp = openSftp(session);
    AttrPtr st(sftp_stat(sftp.get(), remotePath.c_str()));
    if (!st) fail(session, "cannot stat " + remotePath + ": " + sftpError(session, sftp.get()));
    const std::string part = localPath + ".part";
    std::error_code ec;
    if (const auto parent = std::filesystem::path(localPath).parent_path(); !parent.empty())
        std::filesystem::create_directories(parent, ec);
    TransferResult result;
    {
        FilePtr file(sftp_open(sftp.get(), remotePath.c_str(), O_RDONLY, 0));
        if (!file) fail(session, "cannot open " + remotePath + ": " + sftpError(session, sftp.get()));
        std::ofstream out(part, std::ios::binary | std::ios::trunc);
        if (!out) fail(session, "cannot write " + part);
        std::vector<char> buf(kChunk);
        for (;;) {
            const ssize_t n = sftp_read(file.get(), buf.data(), buf.size());
            if (n == 0) break;
            if (n < 0) {
                out.close();
                std::filesystem::remove(part, ec);
                fail(session, "reading " + remotePath + " failed after " + std::to_string(result.bytes) +
                                  " bytes: " + sftpError(session, sftp.get()));
            }
            out.write(buf.data(), n);
            result.bytes += static_cast<std::uint64_t>(n);
        }
        out.close();
        if (!out) {
            std::filesystem::remove(part, ec);
            fail(session, "writing " + part + " failed (disk full?)");
        }
    }
    const auto reject = [&](const std::string& why) {
        std::filesystem::remove(part, ec);
        fail(session, "download of " + remotePath + " refused: " + why);
    };
    if (result.bytes != st->size)
        reject(std::to_string(result.bytes) + " bytes arrived, the host has " + std::to_string(st->size));
    result.sha256 = core::sha256File(part);
    const std::string there = remoteSha256(session, remotePath);
    if (there != result.sha256) reject("SHA-256 " + result.sha256 + " here, " + there + " on the host");
    if (!expectedSha256.empty() && expectedSha256 != result.sha256)
        reject("SHA-256 " + result.sha256 + " is not the expected " + expectedSha256);
    std::filesystem::rename(part, localPath, ec);
    if (ec) reject("cannot rename " + part + " to " + localPath + ": " + ec.message());
    return result;
}

}  // namespace lathe::remote
