#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <algorithm>

#include "checkpoint_io.h"
#include "lathe/core/error.h"
#include "sha256.h"

namespace fs = std::filesystem;

namespace lathe::core {
namespace {

constexpr const char* kMagic = "LATHE-CHECKPOINT";
constexpr size_t kMaxHeader = 4096;

void writeAll(int fd, const char* p, size_t n, const std::string& path) {
    while (n > 0) {
        const ssize_t w = ::write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            throw CheckpointError("writing checkpoint " + path + " failed: " + std::strerror(errno));
        }
        p += w;
        n -= static_cast<size_t>(w);
    }
}

// The checksum covers the header's epoch and step as well as the payload, so a flipped digit
// in the header is caught too.
std::string checksum(int64_t epoch, int64_t step, const std::string& payload) {
    const std::string fields = "epoch " + std::to_string(epoch) + "\nstep " + std::to_string(step) + "\n";
    return sha256Hex((fields + payload).data(), fields.size() + payload.size());
}

// Reads the header, checks size and checksum, and returns the payload.
std::string readVerified(const std::string& path, CheckpointInfo& info) {
    std::error_code ec;
    const auto fileSize = fs::file_size(path, ec);
    if (ec) throw CheckpointError("checkpoint " + path + " cannot be read: " + ec.message());
    std::ifstream in(path, std::ios::binary);
    if (!in) throw CheckpointError("checkpoint " + path + " cannot be read: " + std::strerror(errno));
    std::string line;
    std::getline(in, line);
    if (line.rfind(kMagic, 0) != 0) throw CheckpointError("checkpoint " + path + " is not a Lathe checkpoint");
    const int format = std::atoi(line.c_str() + std::strlen(kMagic));
    if (format != kCheckpointFormat)
        throw CheckpointError("checkpoint " + path + " has format " + std::to_string(format) +
                              "; this Lathe reads format " + std::to_string(kCheckpointFormat));
    info = CheckpointInfo{};
    info.path = path;
    bool haveSize = false;
    size_t headerBytes = line.size() + 1;
    while (std::getline(in, line) && !line.empty()) {
        headerBytes += line.size() + 1;
        if (headerBytes > kMaxHeader) throw CheckpointError("checkpoint " + path + " has a malformed header");
        std::istringstream ls(line);
        std::string key;
        ls >> key;
        if (key == "epoch") ls >> info.epoch;
        else if (key == "step") ls >> info.step;
        else if (key == "sha256") ls >> info.sha256;
        else if (key == "size") haveSize = static_cast<bool>(ls >> info.payloadBytes);
    }
    if (!in || !haveSize || info.sha256.size() != 64 || info.payloadBytes < 0)
        throw CheckpointError("checkpoint " + path + " has a malformed or truncated header");
    headerBytes += 1;  // the blank line
    // Check the promised size against the file before allocating: a damaged header must not
    // make us allocate gigabytes.
    if (static_cast<uint64_t>(info.payloadBytes) != fileSize - std::min<uint64_t>(fileSize, headerBytes)) {
        if (static_cast<uint64_t>(info.payloadBytes) > fileSize - std::min<uint64_t>(fileSize, headerBytes))
            throw CheckpointError("checkpoint " + path + " is truncated (header promises " +
                                  std::to_string(info.payloadBytes) + " bytes, file holds " +
                                  std::to_string(fileSize - std::min<uint64_t>(fileSize, headerBytes)) + ")");
        throw CheckpointError("checkpoint " + path + " has trailing bytes after its payload");
    }
    std::string payload(static_cast<size_t>(info.payloadBytes), '\0');
    in.read(payload.data(), info.payloadBytes);
    if (in.gcount() != info.payloadBytes)
        throw CheckpointError("checkpoint " + path + " is truncated (header promises " +
                              std::to_string(info.payloadBytes) + " bytes, file holds " +
                              std::to_string(in.gcount()) + ")");
    if (in.peek() != std::char_traits<char>::eof())
        throw CheckpointError("checkpoint " + path + " has trailing bytes after its payload");
    if (checksum(info.epoch, info.step, payload) != info.sha256)
        throw CheckpointError("checkpoint " + path + " fails its SHA-256 checksum (corrupt file)");
    return payload;
}

}  // namespace

CheckpointInfo readCheckpointInfo(const std::string& path) {
    CheckpointInfo info;
    readVerified(path, info);
    return info;
}

CheckpointInfo saveCheckpoint(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                              int64_t epoch, int64_t step, const CheckpointExtras& extras) {
    torch::serialize::OutputArchive archive;
    model.save(archive);
    for (const auto& [name, t] : extras) archive.write("lathe." + name, t.cpu());
    torch::serialize::OutputArchive optimArchive;
    optimizer.save(optimArchive);
    archive.write("optimizer", optimArchive);
    std::ostringstream buf;
    archive.save_to(buf);
    const std::string payload = buf.str();

    CheckpointInfo info;
    info.path = path;
    info.epoch = epoch;
    info.step = step;
    info.payloadBytes = static_cast<int64_t>(payload.size());
    info.sha256 = checksum(epoch, step, payload);
    std::ostringstream header;
    header << kMagic << ' ' << kCheckpointFormat << "\nepoch " << epoch << "\nstep " << step << "\nsize "
           << payload.size() << "\nsha256 " << info.sha256 << "\n\n";
    const std::string head = header.str();

    std::error_code ec;
    fs::create_directories(fs::path(path).parent_path(), ec);
    const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw CheckpointError("cannot write checkpoint " + tmp + ": " + std::strerror(errno));
    try {
        writeAll(fd, head.data(), head.size(), tmp);
        writeAll(fd, payload.data(), payload.size(), tmp);
        if (::fsync(fd) != 0) throw CheckpointError("fsync of " + tmp + " failed: " + std::strerror(errno));
    } catch (...) {
        ::close(fd);
        ::unlink(tmp.c_str());
        throw;
    }
    ::close(fd);
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const std::string err = std::strerror(errno);
        ::unlink(tmp.c_str());
        throw CheckpointError("cannot move checkpoint into place at " + path + ": " + err);
    }
    // The rename itself is durable only once the directory is: without this a power cut may
    // bring the previous checkpoint back.
    const auto dir = fs::path(path).parent_path();
    if (const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
    // Temporaries of writers that were killed mid-write (another pid) are of no use to anyone.
    for (const auto& entry : fs::directory_iterator(dir.empty() ? fs::path(".") : dir, ec)) {
        const auto name = entry.path().filename().string();
        const auto base = fs::path(path).filename().string() + ".tmp-";
        if (name.rfind(base, 0) == 0 && name != fs::path(tmp).filename().string()) fs::remove(entry.path(), ec);
    }
    return info;
}

namespace {

// Verifies the file, opens its archive and hands it to `restore`; LibTorch's complaints (a
// missing key, a shape that does not fit) become one CheckpointError line.
template <class Restore>
CheckpointInfo restoreFrom(const std::string& path, const char* what, Restore&& restore) {
    CheckpointInfo info;
    const std::string payload = readVerified(path, info);
    try {
        std::istringstream in(payload);
        torch::serialize::InputArchive archive;
        archive.load_from(in);
        restore(archive);
    } catch (const c10::Error& ex) {
        std::string msg = ex.what_without_backtrace();
        throw CheckpointError("checkpoint " + path + " does not fit " + what + ": " + msg.substr(0, msg.find('\n')));
    }
    return info;
}

}  // namespace

CheckpointInfo loadCheckpoint(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                              CheckpointExtras* extras) {
    return restoreFrom(path, "this model and optimizer", [&](torch::serialize::InputArchive& archive) {
        model.load(archive);
        torch::serialize::InputArchive optimArchive;
        archive.read("optimizer", optimArchive);
        optimizer.load(optimArchive);
        if (!extras) return;
        for (auto it = extras->begin(); it != extras->end();) {
            torch::Tensor t;
            if (archive.try_read("lathe." + it->first, t)) {
                it->second = t;
                ++it;
            } else {
                it = extras->erase(it);
            }
        }
    });
}

CheckpointInfo loadModelWeights(const std::string& path, torch::nn::Module& model) {
    return restoreFrom(path, "this model", [&](torch::serialize::InputArchive& archive) { model.load(archive); });
}

}  // namespace lathe::core
