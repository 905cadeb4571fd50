#pragma once
// The checkpoint file format without LibTorch: header, checksum, atomic write (checkpoint.cpp).
// The payload is a LibTorch archive written and read by checkpoint_io.cpp.
#include <cstdint>
#include <string>

#include "lathe/core/checkpoint.h"

namespace lathe::core {

/// Reads and verifies the file (as readCheckpointInfo) and returns its payload.
std::string readCheckpointPayload(const std::string& path, CheckpointInfo& info);

/// Writes header and payload to a temporary name, fsyncs, renames into place and fsyncs the
/// directory. `owner` (when given) is written into the header and covered by the checksum.
/// Throws CheckpointError.
CheckpointInfo writeCheckpointFile(const std::string& path, int64_t epoch, int64_t step,
                                   const std::string& payload, const CheckpointOwner& owner = {});

}  // namespace lathe::core
