#pragma once
// The data pipeline's samples (torch-free): where a training or validation sample comes from and
// how it becomes floats. A source splits each sample's preparation in two: a deterministic part
// (an image's decode and resize) that the sample caches (cache.h) keep, and the rest (crops,
// flips, normalisation) applied on every read, seeded by (seed, epoch, sample) so that a batch is
// the same bytes whatever thread prepared it. The loader (loader.h) runs sources on threads.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/cache.h"
#include "data/images.h"
#include "data/raw.h"

namespace lathe::core {
struct RunSpec;
}

namespace lathe::core::data {

/// The image steps of a run spec (resize, crop, random_crop, hflip, normalize, color).
struct ImageSteps {
    int resize = 0;           // the shorter side, in pixels (0: as stored)
    int crop = 0;             // a square crop's side (0: none; then every image must have one size)
    bool randomCrop = false;  // training samples: a random crop (validation: the centre)
    bool hflip = false;       // training samples: flipped left-right with probability 1/2
    int channels = 3;         // 3: RGB, 1: gray
    float mean[3] = {0, 0, 0};
    float std[3] = {1, 1, 1};
    /// What the cached part depends on: a changed step never meets an old entry.
    std::string cachedStepsKey() const;
};
/// Throws ConfigError naming a bad `normalize` value.
ImageSteps imageSteps(const RunSpec& spec);
/// Parses `normalize`: none, imagenet, or "M,M,M/S,S,S" (1 or 3 values each). Throws ConfigError.
void parseNormalize(const std::string& text, float mean[3], float std[3]);

/// One image of an image folder: its path, label and what identifies its content for the caches.
struct ImageItem {
    std::string path;      // absolute
    std::string relative;  // "class/file.jpg"
    int64_t label = 0;
    std::string identity;  // filled by ImageFolderSource (content id or path, size, mtime)
};
struct ImageFolder {
    std::vector<ImageItem> items;  // sorted by relative path
    std::vector<std::string> classNames;
};
/// `dir`'s class sub-folders (sorted; hidden ones skipped) and their .jpg/.jpeg/.png files.
/// Throws DataError when there is no such folder, or no class holds an image.
ImageFolder scanImageFolder(const std::string& dir);

/// What reading one batch's samples came to (summed by the loader).
struct SampleTally {
    int64_t lookups[kCacheLevels] = {0, 0, 0};
    int64_t hits[kCacheLevels] = {0, 0, 0};
    int64_t skipped = 0;
    void add(const SampleTally& o);
};

/// What a sample is read for: training (random augmentation on) or evaluation.
enum class SampleMode { Train, Eval };

/// Raised by a source for a sample that cannot be read, with the file named.
class SampleSource {
public:
    virtual ~SampleSource() = default;
    virtual int64_t size() const = 0;
    /// One sample's shape, e.g. {64} or {3, 64, 64}.
    virtual const std::vector<int64_t>& shape() const = 0;
    virtual const std::vector<std::string>& classNames() const = 0;
    virtual int64_t label(int64_t index) const = 0;
    /// Writes sample `index` as prod(shape()) floats. `augmentSeed` seeds its random steps.
    /// Returns false when the sample is unreadable and the source skips such samples (counted in
    /// `tally`); throws DataError naming the file otherwise.
    virtual bool read(int64_t index, SampleMode mode, uint64_t augmentSeed, float* out,
                      SampleTally& tally) = 0;
    /// A short description for the run's log ("1,204 images, 10 classes, 3x64x64, cache: ...").
    virtual std::string describe() const = 0;
    /// True when reading a sample is a copy from memory: the trainer then reads batches in the
    /// training thread, whatever `loader_workers` says (handing a batch over between threads
    /// costs more than copying it).
    virtual bool inMemory() const { return false; }
    int64_t sampleFloats() const;
};

/// Samples already in memory (digits, csv, idx, synthetic): copied out, nothing cached.
class MemorySource final : public SampleSource {
public:
    explicit MemorySource(RawSet set);
    int64_t size() const override { return m_set.size(); }
    const std::vector<int64_t>& shape() const override { return m_set.shape; }
    const std::vector<std::string>& classNames() const override { return m_set.classNames; }
    int64_t label(int64_t index) const override { return m_set.y[static_cast<size_t>(index)]; }
    bool read(int64_t index, SampleMode mode, uint64_t augmentSeed, float* out, SampleTally& tally) override;
    std::string describe() const override;
    bool inMemory() const override { return true; }

private:
    RawSet m_set;
    int64_t m_floats = 0;
};

/// Images decoded from files (JPEG with TurboJPEG, PNG with libpng), resized, cached, then
/// cropped, flipped and normalised.
class ImageFolderSource final : public SampleSource {
public:
    /// `items` (a split of a scanned folder); `contentIds`: when the data set is a version, its
    /// root hash (items are then identified by it and their relative path, the same on every
    /// host); empty: by absolute path, size and modification time. `skipBad`: unreadable images
    /// are skipped and counted rather than an error.
    ImageFolderSource(std::vector<ImageItem> items, std::vector<std::string> classNames, ImageSteps steps,
                      std::shared_ptr<CacheStack> cache, const std::string& dataVersion, bool skipBad);
    int64_t size() const override { return static_cast<int64_t>(m_items.size()); }
    const std::vector<int64_t>& shape() const override { return m_shape; }
    const std::vector<std::string>& classNames() const override { return m_classNames; }
    int64_t label(int64_t index) const override { return m_items[static_cast<size_t>(index)].label; }
    bool read(int64_t index, SampleMode mode, uint64_t augmentSeed, float* out, SampleTally& tally) override;
    std::string describe() const override;
    /// The decoded and resized image (the cached part), through the caches.
    Image prepared(int64_t index, SampleTally& tally);

private:
    std::vector<ImageItem> m_items;
    std::vector<std::string> m_classNames;
    ImageSteps m_steps;
    std::shared_ptr<CacheStack> m_cache;
    bool m_skipBad;
    std::vector<int64_t> m_shape;
    std::string m_stepsKey;
};

/// The seed of one sample's random steps: a hash of (seed, epoch, index), so that it depends on
/// nothing else (not the thread, not the order samples are read in).
uint64_t sampleSeed(uint64_t seed, int64_t epoch, int64_t index);

/// How a data set's samples are split into training and validation (spec.valSplit, spec.seed):
/// the indices of each, as loadSplit splits in-memory sets.
struct SplitIndices {
    std::vector<int64_t> train, val;
};
SplitIndices splitIndices(int64_t n, const RunSpec& spec);

/// Every sample of `source` read whole for evaluation (no random steps), as loadSplit returns
/// in-memory sets. Throws DataError.
RawSet readAll(SampleSource& source);

struct SourcePair {
    std::shared_ptr<SampleSource> train, val;
    // csv standardisation, for the served model (see SplitSet)
    std::vector<float> mean, stddev;
};
struct SourceOptions {
    std::string cacheDir;     // the disk cache's folder (cache_disk_gb > 0)
    std::string dataVersion;  // the data set version's root hash, when spec.data came from one
    std::function<void(const std::string& level, const std::string& message)> warn;
};
/// The training and validation sources of spec.data: images:DIR streams from files through the
/// caches of spec (cache_memory_mb, cache_disk_gb, cache_redis); every other source is loaded
/// whole (loadSplit).
SourcePair openSources(const RunSpec& spec, const SourceOptions& options);

}  // namespace lathe::core::data
