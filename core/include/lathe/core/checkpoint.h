#pragma once
// Checkpoint files: a small text header (format, epoch, step, payload size, SHA-256 of epoch,
// step and payload) followed by the LibTorch archive. Written to a temporary name and renamed, so a
// crash never leaves a half-written checkpoint under the real name.
#include <cstdint>
#include <string>

namespace lathe::core {

/// Format 2 adds the owner (workspace id and run); format 1 files (no owner) are still read.
inline constexpr int kCheckpointFormat = 2;

struct CheckpointInfo {
    std::string path;
    std::string sha256;  // of "epoch E\nstep S\n" (+ "workspace W\nrun R\n"), then the payload
    int64_t epoch = 0;   // epochs completed
    int64_t step = 0;    // global steps completed
    int64_t payloadBytes = 0;
    std::string workspaceId;  // the workspace whose run wrote it (Store::workspaceId); empty: format 1
    int64_t runId = 0;        // that run; 0 with no owner
};

/// Who a checkpoint belongs to: a run of one workspace. Resuming from another's is refused.
struct CheckpointOwner {
    std::string workspaceId;
    int64_t runId = 0;
};

/// Reads the header and verifies size and checksum. Throws CheckpointError ("checkpoint X is
/// truncated", "... fails its checksum", "... is not a Lathe checkpoint").
CheckpointInfo readCheckpointInfo(const std::string& path);

}  // namespace lathe::core
