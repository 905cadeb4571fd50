#pragma once
// Checkpoint files: a small text header (format, epoch, step, payload size, SHA-256 of epoch,
// step and payload) followed by the LibTorch archive. Written to a temporary name and renamed, so a
// crash never leaves a half-written checkpoint under the real name.
#include <cstdint>
#include <string>
#include <vector>

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

/// A model-parallel run's checkpoint is one file per pipeline stage and tensor-parallel shard:
/// `firstPath` (e.g. `<dir>/last.ckpt`) for stage 0's first shard, and beside it
/// `last.stage<s>.ckpt`, `last.tp<t>.ckpt` or `last.stage<s>.tp<t>.ckpt` for the others.
std::string shardCheckpointPath(const std::string& firstPath, int stage, int shard = 0);
/// The files of the other stages and shards that exist beside `firstPath` (none for a run of one
/// stage and shard), stage by stage, shard by shard.
std::vector<std::string> checkpointCompanions(const std::string& firstPath);

}  // namespace lathe::core
