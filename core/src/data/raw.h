#pragma once
// Torch-free data set parsing: files become plain float/label arrays here, and only the trainer
// (training/trainer.cpp) turns them into tensors. Parsers treat files as untrusted input.
#include <cstdint>
#include <string>
#include <vector>

namespace lathe::core::data {

struct RawSet {
    std::vector<float> x;        // n * prod(shape), row-major
    std::vector<int64_t> y;      // n labels in [0, classNames.size())
    std::vector<int64_t> shape;  // one sample's shape, e.g. {64}, {1, 8, 8}, {1, 28, 28}
    std::vector<std::string> classNames;
    int64_t size() const { return static_cast<int64_t>(y.size()); }
};

/// Reads a whole file, transparently gunzipping `.gz` content. Throws DataError.
std::string readFileMaybeGz(const std::string& path, size_t maxBytes = size_t{1} << 31);

/// The built-in digits set (64 pixel columns 0..16 and a label, no header). Pixels are scaled to 0..1.
RawSet parseDigits(const std::string& text, const std::string& source);
/// A CSV with a header row: every column numeric except that the label column (by name) may hold
/// any text; labels are mapped to classes in sorted order.
RawSet parseCsv(const std::string& text, const std::string& labelColumn, const std::string& source);

struct IdxPair {
    RawSet train;
    RawSet test;  // empty when the directory has no t10k files
};
/// MNIST-style IDX files in `dir`: train-images-idx3-ubyte / train-labels-idx1-ubyte (optionally
/// .gz) and, if present, t10k-images-idx3-ubyte / t10k-labels-idx1-ubyte. Pixels scaled to 0..1.
IdxPair readIdxDir(const std::string& dir);
/// Parses one IDX images file + labels file from memory.
RawSet parseIdx(const std::string& images, const std::string& labels, const std::string& source);

/// Two-dimensional interleaved spirals, `classes` arms of `perClass` points, seeded.
RawSet makeSpirals(int64_t perClass, int64_t classes, uint64_t seed);

/// Finds a file under the runtime resources (bin/../share/lathe, then the source tree).
std::string findResource(const std::string& relative);

}  // namespace lathe::core::data

namespace lathe::core {
struct RunSpec;
}

namespace lathe::core::data {

struct SplitSet {
    RawSet train;
    RawSet val;
    // Per-feature standardisation applied to both splits (csv only; empty otherwise): a served
    // model must apply the same to raw inputs.
    std::vector<float> mean, stddev;
};
/// Loads spec.data and splits it deterministically by spec.seed (an IDX directory's t10k files
/// are its validation set). csv features are standardised with the training split's statistics.
SplitSet loadSplit(const RunSpec& spec);

/// Parses spec's data file now (digits and csv:, the data sets read whole from one file) and
/// keeps it for the life of this process: loadSplit here, and in any process forked from here
/// later, then skips the parse while the file is unchanged (same device, inode, size and
/// modification time). A study's fork server calls it once for the study's data set, which every
/// trial would otherwise parse again (about 10 ms of a digits trial of 0.15 s). Returns whether it
/// kept something new; false for the other data sets and for a file that is missing. Not
/// thread-safe: call it before other threads load data, as the fork server does before it forks.
bool preloadData(const RunSpec& spec);

}  // namespace lathe::core::data
