#pragma once
// Data sets by name: digits (built in), csv:PATH, idx:DIR, synthetic:spirals.
#include <cstdint>
#include <string>
#include <vector>

#include "lathe/core/run_spec.h"

namespace lathe::core {

struct DatasetSummary {
    std::string name;  // spec.data
    int64_t trainSize = 0;
    int64_t valSize = 0;
    std::vector<int64_t> sampleShape;  // {64}... or {C, H, W} for images
    std::vector<std::string> classNames;
    bool isImage() const { return sampleShape.size() == 3; }
};

/// Loads and splits the data set named by spec.data (using spec.valSplit, spec.seed,
/// spec.labelColumn) and describes it. Throws DataError with the file, line and column of a
/// malformed record.
DatasetSummary describeDataset(const RunSpec& spec);

}  // namespace lathe::core
