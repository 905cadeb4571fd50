#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

#include "data/raw.h"
#include "lathe/core/error.h"

namespace fs = std::filesystem;

namespace lathe::core::data {
namespace {

uint32_t be32(const std::string& b, size_t off) {
    const auto* p = reinterpret_cast<const unsigned char*>(b.data() + off);
    return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

// Returns the dimensions of an unsigned-byte IDX buffer after checking its header and length.
std::vector<uint32_t> idxDims(const std::string& buf, int expectedRank, const std::string& what) {
    if (buf.size() < 4)
        throw DataError(what + ": too short for an IDX header (" + std::to_string(buf.size()) + " bytes)");
    const auto* p = reinterpret_cast<const unsigned char*>(buf.data());
    if (p[0] != 0 || p[1] != 0) throw DataError(what + ": not an IDX file (bad magic number)");
    if (p[2] != 0x08)
        throw DataError(what + ": IDX data type 0x" + std::to_string(p[2]) + " is not unsigned bytes (0x08)");
    const int rank = p[3];
    if (rank != expectedRank)
        throw DataError(what + ": expected " + std::to_string(expectedRank) + " dimensions, file has " +
                        std::to_string(rank));
    const size_t headerSize = 4 + 4 * static_cast<size_t>(rank);
    if (buf.size() < headerSize) throw DataError(what + ": truncated IDX header");
    std::vector<uint32_t> dims;
    unsigned long long total = 1;
    constexpr unsigned long long kMaxElements = 1ull << 34;  // 16 GiB of pixels
    for (int i = 0; i < rank; ++i) {
        dims.push_back(be32(buf, 4 + 4 * static_cast<size_t>(i)));
        if (dims.back() == 0 && i > 0)
            throw DataError(what + ": IDX dimension " + std::to_string(i) + " is zero");
        // Checked before multiplying, so crafted dimensions cannot wrap the product around.
        if (dims.back() != 0 && total > kMaxElements / dims.back())
            throw DataError(what + ": IDX dimensions are implausibly large");
        total *= dims.back();
    }
    if (buf.size() - headerSize != total)
        throw DataError(what + ": truncated or padded (header promises " + std::to_string(total) +
                        " bytes of data, file has " + std::to_string(buf.size() - headerSize) + ")");
    return dims;
}

std::string firstExisting(const fs::path& dir, std::initializer_list<const char*> names) {
    for (const char* n : names) {
        for (const char* suffix : {"", ".gz"}) {
            const auto p = dir / (std::string(n) + suffix);
            std::error_code ec;
            if (fs::exists(p, ec)) return p.string();
        }
    }
    return {};
}

}  // namespace

RawSet parseIdx(const std::string& images, const std::string& labels, const std::string& source) {
    const auto idims = idxDims(images, 3, source + " images");
    const auto ldims = idxDims(labels, 1, source + " labels");
    if (idims[0] != ldims[0])
        throw DataError(source + ": " + std::to_string(idims[0]) + " images but " + std::to_string(ldims[0]) +
                        " labels");
    if (idims[0] == 0) throw DataError(source + ": no samples");
    RawSet s;
    s.shape = {1, static_cast<int64_t>(idims[1]), static_cast<int64_t>(idims[2])};
    const size_t pixels = static_cast<size_t>(idims[1]) * idims[2];
    s.x.resize(static_cast<size_t>(idims[0]) * pixels);
    const auto* px = reinterpret_cast<const unsigned char*>(images.data() + 16);
    for (size_t i = 0; i < s.x.size(); ++i) s.x[i] = static_cast<float>(px[i]) / 255.0f;
    const auto* lb = reinterpret_cast<const unsigned char*>(labels.data() + 8);
    int maxLabel = 0;
    uint32_t maxAt = 0;
    std::vector<int64_t> counts(256, 0);
    for (uint32_t i = 0; i < ldims[0]; ++i) {
        s.y.push_back(lb[i]);
        ++counts[lb[i]];
        if (lb[i] > maxLabel) {
            maxLabel = lb[i];
            maxAt = i;
        }
    }
    // Labels 0..9 are MNIST's classes, some of which a subset may lack. Beyond 9 every class up to
    // the largest label must occur: one corrupt byte (a 200) would otherwise add 190 empty classes
    // and a 201-wide output layer without a word.
    if (maxLabel > 9)
        for (int c = 10; c < maxLabel; ++c)
            if (counts[static_cast<size_t>(c)] == 0)
                throw DataError(source + " labels: sample " + std::to_string(maxAt) + " has label " +
                                std::to_string(maxLabel) + ", but no sample has label " + std::to_string(c) +
                                " (labels must number the classes 0..N-1; is the labels file damaged?)");
    for (int c = 0; c <= std::max(maxLabel, 9); ++c) s.classNames.push_back(std::to_string(c));
    return s;
}

IdxPair readIdxDir(const std::string& dir) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) throw DataError("idx data: " + dir + " is not a directory");
    const fs::path d(dir);
    const auto trainImages = firstExisting(d, {"train-images-idx3-ubyte", "train-images.idx3-ubyte"});
    const auto trainLabels = firstExisting(d, {"train-labels-idx1-ubyte", "train-labels.idx1-ubyte"});
    if (trainImages.empty() || trainLabels.empty())
        throw DataError("idx data: " + dir +
                        " needs train-images-idx3-ubyte and train-labels-idx1-ubyte (optionally .gz), as "
                        "MNIST and Fashion-MNIST ship them");
    IdxPair out;
    out.train = parseIdx(readFileMaybeGz(trainImages), readFileMaybeGz(trainLabels), trainImages);
    const auto testImages = firstExisting(d, {"t10k-images-idx3-ubyte", "t10k-images.idx3-ubyte"});
    const auto testLabels = firstExisting(d, {"t10k-labels-idx1-ubyte", "t10k-labels.idx1-ubyte"});
    if (!testImages.empty() && !testLabels.empty()) {
        out.test = parseIdx(readFileMaybeGz(testImages), readFileMaybeGz(testLabels), testImages);
        if (out.test.shape != out.train.shape)
            throw DataError("idx data: test images differ in size from training images");
        if (out.test.classNames.size() > out.train.classNames.size())
            out.train.classNames = out.test.classNames;
    }
    return out;
}

}  // namespace lathe::core::data
