// Sample sources of the data pipeline (pipeline.h).
#include "data/pipeline.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <sstream>

#include "lathe/core/error.h"
#include "lathe/core/run_spec.h"
#include "lathe/core/sha256.h"

namespace fs = std::filesystem;

namespace lathe::core::data {

// ---- steps --------------------------------------------------------------------------------

std::string ImageSteps::cachedStepsKey() const {
    // Only what the cached part (decode + resize) depends on; crops, flips and normalisation
    // are applied after the cache.
    return "lathe-sample-v1 decode channels=" + std::to_string(channels) +
           " resize-shorter=" + std::to_string(resize) + " filter=triangle-antialiased";
}

void parseNormalize(const std::string& text, float mean[3], float std[3]) {
    const std::string form =
        "`normalize` must be none, imagenet, or MEAN/STD with 1 or 3 comma-separated values each, e.g. "
        "0.5,0.5,0.5/0.25,0.25,0.25 (got '" +
        text + "')";
    if (text == "none") {
        std::fill(mean, mean + 3, 0.0f);
        std::fill(std, std + 3, 1.0f);
        return;
    }
    if (text == "imagenet") {
        const float m[3] = {0.485f, 0.456f, 0.406f}, s[3] = {0.229f, 0.224f, 0.225f};
        std::copy(m, m + 3, mean);
        std::copy(s, s + 3, std);
        return;
    }
    const auto slash = text.find('/');
    if (slash == std::string::npos) throw ConfigError(form);
    auto parse = [&](const std::string& part, float out[3], bool positive) {
        std::vector<float> v;
        std::stringstream ss(part);
        std::string item;
        while (std::getline(ss, item, ',')) {
            char* end = nullptr;
            errno = 0;
            const float f = std::strtof(item.c_str(), &end);
            if (item.empty() || errno != 0 || *end != '\0' || !std::isfinite(f) || (positive && !(f > 0)))
                throw ConfigError(form + (positive ? ": every STD is > 0" : ""));
            v.push_back(f);
        }
        if (v.size() != 1 && v.size() != 3) throw ConfigError(form);
        for (int c = 0; c < 3; ++c) out[c] = v[v.size() == 1 ? 0 : static_cast<size_t>(c)];
    };
    parse(text.substr(0, slash), mean, false);
    parse(text.substr(slash + 1), std, true);
}

ImageSteps imageSteps(const RunSpec& spec) {
    ImageSteps s;
    s.resize = static_cast<int>(spec.resize);
    s.crop = static_cast<int>(spec.crop);
    s.randomCrop = spec.randomCrop;
    s.hflip = spec.hflip;
    s.channels = spec.color == "gray" ? 1 : 3;
    parseNormalize(spec.normalize, s.mean, s.std);
    return s;
}

// ---- folders ------------------------------------------------------------------------------

namespace {

bool isImageFile(const std::string& name) {
    std::string l = name;
    std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
    auto ends = [&](const char* t) {
        const size_t n = std::strlen(t);
        return l.size() >= n && l.compare(l.size() - n, n, t) == 0;
    };
    return ends(".jpg") || ends(".jpeg") || ends(".png");
}

}  // namespace

ImageFolder scanImageFolder(const std::string& dir) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
        throw DataError("image folder " + dir +
                        " does not exist (an image data set is a folder of class "
                        "sub-folders holding .jpg/.jpeg/.png files)");
    const fs::path root = fs::absolute(dir, ec);
    std::vector<std::string> classes;
    for (const auto& e : fs::directory_iterator(root, ec))
        if (e.is_directory(ec) && e.path().filename().string()[0] != '.')
            classes.push_back(e.path().filename().string());
    std::sort(classes.begin(), classes.end());
    ImageFolder out;
    for (const auto& cls : classes) {
        std::vector<std::string> files;
        for (const auto& f : fs::directory_iterator(root / cls, ec)) {
            const auto name = f.path().filename().string();
            if (name[0] != '.' && f.is_regular_file(ec) && isImageFile(name)) files.push_back(name);
        }
        if (files.empty()) continue;  // a class without images is not a class
        std::sort(files.begin(), files.end());
        const auto label = static_cast<int64_t>(out.classNames.size());
        out.classNames.push_back(cls);
        for (const auto& f : files)
            out.items.push_back({(root / cls / f).string(), cls + "/" + f, label, {}});
    }
    if (out.items.empty())
        throw DataError("image folder " + dir +
                        " holds no images: it needs one sub-folder per class with .jpg/.jpeg/.png files");
    return out;
}

void SampleTally::add(const SampleTally& o) {
    for (int i = 0; i < kCacheLevels; ++i) {
        lookups[i] += o.lookups[i];
        hits[i] += o.hits[i];
    }
    skipped += o.skipped;
}

int64_t SampleSource::sampleFloats() const {
    const auto& s = shape();
    return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<int64_t>());
}

uint64_t sampleSeed(uint64_t seed, int64_t epoch, int64_t index) {
    // splitmix64 over the three, one after the other
    auto mix = [](uint64_t z) {
        z += 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    };
    return mix(mix(mix(seed) ^ static_cast<uint64_t>(epoch)) ^ static_cast<uint64_t>(index));
}

// ---- memory -------------------------------------------------------------------------------

MemorySource::MemorySource(RawSet set) : m_set(std::move(set)) { m_floats = sampleFloats(); }

bool MemorySource::read(int64_t index, SampleMode, uint64_t, float* out, SampleTally&) {
    std::memcpy(out, m_set.x.data() + index * m_floats, static_cast<size_t>(m_floats) * sizeof(float));
    return true;
}

std::string MemorySource::describe() const { return std::to_string(size()) + " samples in memory"; }

// ---- images -------------------------------------------------------------------------------

namespace {

std::string serialise(const Image& img) {
    std::string out(12 + img.pixels.size(), '\0');
    const uint32_t head[3] = {static_cast<uint32_t>(img.width), static_cast<uint32_t>(img.height),
                              static_cast<uint32_t>(img.channels)};
    std::memcpy(out.data(), head, 12);
    std::memcpy(out.data() + 12, img.pixels.data(), img.pixels.size());
    return out;
}

bool deserialise(const std::string& bytes, int channels, Image& img) {
    if (bytes.size() < 12) return false;
    uint32_t head[3];
    std::memcpy(head, bytes.data(), 12);
    if (head[2] != static_cast<uint32_t>(channels) || head[0] == 0 || head[1] == 0 || head[0] > 32768 ||
        head[1] > 32768)
        return false;
    const size_t n = static_cast<size_t>(head[0]) * head[1] * head[2];
    if (bytes.size() != 12 + n) return false;
    img.width = static_cast<int>(head[0]);
    img.height = static_cast<int>(head[1]);
    img.channels = static_cast<int>(head[2]);
    img.pixels.assign(bytes.begin() + 12, bytes.end());
    return true;
}

// Deterministic, portable draws (std::uniform_int_distribution differs between libraries).
uint64_t draw(uint64_t& state) {
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

}  // namespace

ImageFolderSource::ImageFolderSource(std::vector<ImageItem> items, std::vector<std::string> classNames,
                                     ImageSteps steps, std::shared_ptr<CacheStack> cache,
                                     const std::string& dataVersion, bool skipBad)
    : m_items(std::move(items)),
      m_classNames(std::move(classNames)),
      m_steps(steps),
      m_cache(std::move(cache)),
      m_skipBad(skipBad) {
    m_stepsKey = m_steps.cachedStepsKey();
    // What a cached entry is keyed by: the steps, and the file's content — a version's root hash
    // and the file's place in it (the same on every host), or where the file is, its size and
    // modification time (a file changed since is a different key, never a stale entry).
    for (auto& item : m_items) {
        if (!dataVersion.empty()) {
            item.identity = "version " + dataVersion + " " + item.relative;
        } else {
            struct stat st {};
            if (::stat(item.path.c_str(), &st) == 0)
                item.identity = "file " + item.path + " " + std::to_string(st.st_size) + " " +
                                std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
            else
                item.identity = "file " + item.path + " missing";
        }
        const auto full = m_stepsKey + "\n" + item.identity;
        item.identity = sha256Hex(full.data(), full.size()).substr(0, 40);
    }
    const int c = m_steps.channels;
    if (m_steps.crop > 0) {
        m_shape = {c, m_steps.crop, m_steps.crop};
    } else {
        // Without a crop every image must come out the same size: the first readable one's.
        SampleTally unused;
        for (size_t i = 0; i < m_items.size() && m_shape.empty(); ++i) {
            try {
                const auto img = prepared(static_cast<int64_t>(i), unused);
                m_shape = {c, img.height, img.width};
            } catch (const DataError&) {
                if (!m_skipBad) throw;
            }
        }
        if (m_shape.empty()) throw DataError("no image of the data set could be read");
    }
}

Image ImageFolderSource::prepared(int64_t index, SampleTally& tally) {
    const auto& item = m_items[static_cast<size_t>(index)];
    Image img;
    std::string payload;
    if (m_cache && m_cache->get(item.identity, payload, tally.lookups, tally.hits) &&
        deserialise(payload, m_steps.channels, img))
        return img;
    img = decodeImageFile(item.path, m_steps.channels);
    if (m_steps.resize > 0) img = resizeShorterSide(img, m_steps.resize);
    if (m_cache) m_cache->put(item.identity, serialise(img));
    return img;
}

bool ImageFolderSource::read(int64_t index, SampleMode mode, uint64_t augmentSeed, float* out,
                             SampleTally& tally) {
    Image img;
    try {
        try {
            img = prepared(index, tally);
        } catch (const std::bad_alloc&) {
            throw DataError(m_items[static_cast<size_t>(index)].path + ": not enough memory to decode it");
        }
    } catch (const DataError&) {
        if (!m_skipBad) throw;
        ++tally.skipped;
        return false;
    }
    uint64_t rng = augmentSeed;
    const bool train = mode == SampleMode::Train;
    const int h = static_cast<int>(m_shape[1]), w = static_cast<int>(m_shape[2]);
    if (m_steps.crop > 0) {
        if (train && m_steps.randomCrop && img.width >= w && img.height >= h) {
            const auto x = static_cast<int>(draw(rng) % static_cast<uint64_t>(img.width - w + 1));
            const auto y = static_cast<int>(draw(rng) % static_cast<uint64_t>(img.height - h + 1));
            img = cropImage(img, x, y, w, h);
        } else {
            img = centerCrop(img, w, h);
        }
    } else if (img.width != w || img.height != h) {
        const auto& item = m_items[static_cast<size_t>(index)];
        const std::string msg = item.path + " is " + std::to_string(img.width) + "x" +
                                std::to_string(img.height) +
                                " after the resize, the data set's first image " + std::to_string(w) + "x" +
                                std::to_string(h) + ": set `crop` so that every sample has one size";
        if (!m_skipBad) throw DataError(msg);
        ++tally.skipped;
        return false;
    }
    if (train && m_steps.hflip && (draw(rng) & 1)) flipHorizontal(img);
    toFloatCHW(img, m_steps.mean, m_steps.std, out);
    return true;
}

std::string ImageFolderSource::describe() const {
    return std::to_string(size()) + " images, " + std::to_string(m_shape[0]) + "x" +
           std::to_string(m_shape[1]) + "x" + std::to_string(m_shape[2]) + " (" +
           m_stepsKey.substr(m_stepsKey.find(' ') + 1) +
           (m_steps.crop > 0 ? std::string(", ") + (m_steps.randomCrop ? "random" : "centre") + " crop " +
                                   std::to_string(m_steps.crop)
                             : std::string()) +
           (m_steps.hflip ? ", flips" : "") + "), cache: " + (m_cache ? m_cache->describe() : "none");
}

// ---- splits and sources -------------------------------------------------------------------

SplitIndices splitIndices(int64_t n, const RunSpec& spec) {
    std::vector<int64_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    // A fixed generator, not LibTorch's: the split must not change with the LibTorch version.
    std::mt19937_64 rng(static_cast<uint64_t>(spec.seed) ^ 0x9E3779B97F4A7C15ull);
    std::shuffle(idx.begin(), idx.end(), rng);
    size_t nVal = static_cast<size_t>(std::llround(spec.valSplit * static_cast<double>(n)));
    nVal = std::clamp<size_t>(nVal, 1, static_cast<size_t>(n) - 1);
    SplitIndices out;
    out.val.assign(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(nVal));
    out.train.assign(idx.begin() + static_cast<std::ptrdiff_t>(nVal), idx.end());
    return out;
}

namespace {

std::string defaultCacheDir() {
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/lathe/data";
    if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/lathe/data";
    return (fs::temp_directory_path() / "lathe-cache" / "data").string();
}

std::string fmtSize(double bytes) {
    char buf[32];
    if (bytes >= 1e9)
        std::snprintf(buf, sizeof buf, "%.3g GB", bytes / 1e9);
    else
        std::snprintf(buf, sizeof buf, "%.3g MB", bytes / 1e6);
    return buf;
}

std::shared_ptr<CacheStack> makeCaches(const RunSpec& spec, const SourceOptions& options) {
    auto stack = std::make_shared<CacheStack>();
    if (spec.cacheMemoryMb > 0) {
        stack->add(makeMemoryCache(spec.cacheMemoryMb << 20));
        stack->setDescription(kMemoryLevel, "memory " + std::to_string(spec.cacheMemoryMb) + " MB");
    }
    if (spec.cacheDiskGb > 0) {
        const auto dir = (options.cacheDir.empty() ? defaultCacheDir() : options.cacheDir) + "/samples";
        stack->add(makeDiskCache(dir, static_cast<int64_t>(spec.cacheDiskGb * 1e9), options.warn));
        stack->setDescription(kDiskLevel, "disk " + fmtSize(spec.cacheDiskGb * 1e9) + " in " + dir);
    }
    if (!spec.cacheRedis.empty()) {
        const auto address = parseRedisUrl(spec.cacheRedis);
        stack->add(makeRedisCache(address, spec.cacheRedisTtl, options.warn));
        stack->setDescription(kRedisLevel, "redis " + spec.cacheRedis);
    }
    return stack->empty() ? nullptr : stack;
}

}  // namespace

RawSet readAll(SampleSource& source) {
    RawSet out;
    out.shape = source.shape();
    out.classNames = source.classNames();
    const int64_t d = source.sampleFloats();
    out.x.resize(static_cast<size_t>(source.size() * d));
    SampleTally tally;
    int64_t k = 0;
    for (int64_t i = 0; i < source.size(); ++i)
        if (source.read(i, SampleMode::Eval, 0, out.x.data() + k * d, tally)) {
            out.y.push_back(source.label(i));
            ++k;
        }
    out.x.resize(static_cast<size_t>(k * d));
    return out;
}

SourcePair openSources(const RunSpec& spec, const SourceOptions& options) {
    SourcePair out;
    if (spec.data.rfind("images:", 0) == 0) {
        auto folder = scanImageFolder(spec.data.substr(7));
        const auto n = static_cast<int64_t>(folder.items.size());
        if (n < 2)
            throw DataError("data set " + spec.data + " has " + std::to_string(n) +
                            " images; at least 2 are needed");
        const auto split = splitIndices(n, spec);
        auto pick = [&](const std::vector<int64_t>& idx) {
            std::vector<ImageItem> items;
            items.reserve(idx.size());
            for (auto i : idx) items.push_back(folder.items[static_cast<size_t>(i)]);
            return items;
        };
        const auto steps = imageSteps(spec);
        auto caches = makeCaches(spec, options);
        const bool skip = spec.badSamples == "skip";
        out.train = std::make_shared<ImageFolderSource>(pick(split.train), folder.classNames, steps, caches,
                                                        options.dataVersion, skip);
        out.val = std::make_shared<ImageFolderSource>(pick(split.val), folder.classNames, steps, caches,
                                                      options.dataVersion, skip);
        if (out.val->shape() != out.train->shape())
            throw DataError("the validation images of " + spec.data +
                            " have another size than the training images: set `crop`");
        return out;
    }
    auto split = loadSplit(spec);
    out.mean = std::move(split.mean);
    out.stddev = std::move(split.stddev);
    out.train = std::make_shared<MemorySource>(std::move(split.train));
    out.val = std::make_shared<MemorySource>(std::move(split.val));
    return out;
}

}  // namespace lathe::core::data
