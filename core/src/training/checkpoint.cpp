#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "durable_file.h"
#include "lathe/core/error.h"
#include "lathe/core/sha256.h"
#include "training/checkpoint_file.h"

namespace fs = std::filesystem;

namespace lathe::core {
namespace {

constexpr const char* kMagic = "LATHE-CHECKPOINT";
constexpr size_t kMaxHeader = 4096;

// The checksum covers the header's epoch and step as well as the payload, so a flipped digit
// in the header is caught too.
// The owner's fields are covered too, so a checkpoint cannot be passed off as another run's.
std::string checksum(int64_t epoch, int64_t step, const std::string& workspaceId, int64_t runId,
                     const std::string& payload) {
    std::string fields = "epoch " + std::to_string(epoch) + "\nstep " + std::to_string(step) + "\n";
    if (!workspaceId.empty()) fields += "workspace " + workspaceId + "\nrun " + std::to_string(runId) + "\n";
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
    if (line.rfind(kMagic, 0) != 0)
        throw CheckpointError("checkpoint " + path + " is not a Lathe checkpoint");
    const int format = std::atoi(line.c_str() + std::strlen(kMagic));
    if (format < 1 || format > kCheckpointFormat)
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
        if (key == "epoch")
            ls >> info.epoch;
        else if (key == "step")
            ls >> info.step;
        else if (key == "sha256")
            ls >> info.sha256;
        else if (key == "workspace" && format >= 2)
            ls >> info.workspaceId;
        else if (key == "run" && format >= 2)
            ls >> info.runId;
        else if (key == "size")
            haveSize = static_cast<bool>(ls >> info.payloadBytes);
    }
    if (!in || !haveSize || info.sha256.size() != 64 || info.payloadBytes < 0 ||
        info.workspaceId.size() > 64 || (info.workspaceId.empty() != (info.runId == 0)))
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
    if (checksum(info.epoch, info.step, info.workspaceId, info.runId, payload) != info.sha256)
        throw CheckpointError("checkpoint " + path + " fails its SHA-256 checksum (corrupt file)");
    return payload;
}

}  // namespace

CheckpointInfo readCheckpointInfo(const std::string& path) {
    CheckpointInfo info;
    readVerified(path, info);
    return info;
}

std::string readCheckpointPayload(const std::string& path, CheckpointInfo& info) {
    return readVerified(path, info);
}

CheckpointInfo writeCheckpointFile(const std::string& path, int64_t epoch, int64_t step,
                                   const std::string& payload, const CheckpointOwner& owner) {
    if (owner.workspaceId.find_first_of(" \t\r\n") != std::string::npos || owner.workspaceId.size() > 64 ||
        (owner.workspaceId.empty() != (owner.runId == 0)))
        throw CheckpointError(
            "checkpoint owner must be a workspace id (no spaces, at most 64 characters) and a run");
    CheckpointInfo info;
    info.path = path;
    info.epoch = epoch;
    info.step = step;
    info.workspaceId = owner.workspaceId;
    info.runId = owner.runId;
    info.payloadBytes = static_cast<int64_t>(payload.size());
    info.sha256 = checksum(epoch, step, owner.workspaceId, owner.runId, payload);
    std::ostringstream header;
    header << kMagic << ' ' << kCheckpointFormat << "\nepoch " << epoch << "\nstep " << step << "\nsize "
           << payload.size();
    if (!owner.workspaceId.empty()) header << "\nworkspace " << owner.workspaceId << "\nrun " << owner.runId;
    header << "\nsha256 " << info.sha256 << "\n\n";
    const std::string head = header.str();

    if (const auto failed = writeFileDurably(path, {head, payload}); !failed.empty())
        throw CheckpointError("checkpoint: " + failed);
    std::error_code ec;
    const auto dir = fs::path(path).parent_path();
    const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
    // Temporaries of writers that were killed mid-write (another pid) are of no use to anyone.
    for (const auto& entry : fs::directory_iterator(dir.empty() ? fs::path(".") : dir, ec)) {
        const auto name = entry.path().filename().string();
        const auto base = fs::path(path).filename().string() + ".tmp-";
        if (name.rfind(base, 0) == 0 && name != fs::path(tmp).filename().string())
            fs::remove(entry.path(), ec);
    }
    return info;
}

std::string shardCheckpointPath(const std::string& firstPath, int stage, int shard) {
    if (stage == 0 && shard == 0) return firstPath;
    const std::string ext = ".ckpt";
    const bool hasExt = firstPath.size() > ext.size() &&
                        firstPath.compare(firstPath.size() - ext.size(), ext.size(), ext) == 0;
    std::string path = hasExt ? firstPath.substr(0, firstPath.size() - ext.size()) : firstPath;
    if (stage > 0) path += ".stage" + std::to_string(stage);
    if (shard > 0) path += ".tp" + std::to_string(shard);
    return path + ext;
}

std::vector<std::string> checkpointCompanions(const std::string& firstPath) {
    std::vector<std::string> out;
    std::error_code ec;
    // Stage s's shards are 0, 1, … until one is missing; the stages end at the first stage
    // without a file.
    for (int stage = 0;; ++stage) {
        int shard = stage == 0 ? 1 : 0;
        if (stage > 0 && !std::filesystem::exists(shardCheckpointPath(firstPath, stage, 0), ec)) break;
        for (;; ++shard) {
            const auto path = shardCheckpointPath(firstPath, stage, shard);
            if (!std::filesystem::exists(path, ec)) break;
            out.push_back(path);
        }
    }
    return out;
}

}  // namespace lathe::core
