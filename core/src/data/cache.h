#pragma once
// The sample caches (torch-free): prepared samples (decoded and resized images) kept at three
// levels, tried in order — an in-memory LRU bounded in MB, memory-mapped files on local disk
// bounded in GB (least-recently used evicted), and Redis shared by every worker and host of a run
// (entries expire after a TTL). Every entry is sealed with its length and a CRC-32: one that does
// not check out is dropped and counts as a miss, so a torn write or a bit flip is recomputed,
// never trained on. A level that fails (Redis gone, a full disk) warns once and is skipped; the
// run goes on with the others.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace lathe::core::data {

constexpr int kCacheLevels = 3;
enum CacheLevelIndex { kMemoryLevel = 0, kDiskLevel = 1, kRedisLevel = 2 };
/// "memory", "disk", "redis".
const char* cacheLevelName(int level);

/// `payload` with its magic, length and CRC-32.
std::string sealEntry(const std::string& payload);
/// The payload of a sealed entry; false when it is torn or corrupt.
bool openEntry(const char* data, size_t size, std::string& payload);

/// Warnings from the caches: (level name, message), once per failure.
using CacheWarn = std::function<void(const std::string& level, const std::string& message)>;

class CacheLevel {
public:
    virtual ~CacheLevel() = default;
    virtual int index() const = 0;
    /// True with the sealed entry of `key` in `entry`.
    virtual bool get(const std::string& key, std::string& entry) = 0;
    virtual void put(const std::string& key, const std::string& entry) = 0;
    /// False while the level is out of service (Redis unreachable).
    virtual bool available() const { return true; }
    /// Entries found corrupt and dropped so far.
    int64_t dropped() const { return m_dropped.load(); }
    void noteDropped(const std::string& key);
    virtual void erase(const std::string& key) = 0;

private:
    std::atomic<int64_t> m_dropped{0};
};

/// Least-recently-used entries in memory, up to `capacityBytes`; thread-safe.
std::unique_ptr<CacheLevel> makeMemoryCache(int64_t capacityBytes);
/// One file per entry under `dir` (created), read through mmap, up to `capacityBytes`; the
/// least-recently used (by modification time, refreshed on every hit) are deleted first. Several
/// processes may share a folder. Throws Error when `dir` cannot be created.
std::unique_ptr<CacheLevel> makeDiskCache(const std::string& dir, int64_t capacityBytes, CacheWarn warn);

/// redis://HOST:PORT[/DB]
struct RedisAddress {
    std::string host;
    int port = 6379;
    int db = 0;
};
/// Throws ConfigError saying what is wrong with `url`.
RedisAddress parseRedisUrl(const std::string& url);
/// A pool of hiredis connections; entries SET with EX `ttlSeconds`. When the server cannot be
/// reached (or goes away), warns once and stays out of service, trying again every
/// `retrySeconds`. Never throws after construction.
std::unique_ptr<CacheLevel> makeRedisCache(const RedisAddress& address, int64_t ttlSeconds, CacheWarn warn,
                                           double retrySeconds = 10.0);

/// The levels a source reads through, in order. get() promotes a hit to the levels above it.
class CacheStack {
public:
    void add(std::unique_ptr<CacheLevel> level) { m_levels.push_back(std::move(level)); }
    bool empty() const { return m_levels.empty(); }
    bool has(int level) const;
    /// The payload of `key`, or false. lookups/hits count per level (index by CacheLevelIndex).
    bool get(const std::string& key, std::string& payload, int64_t* lookups, int64_t* hits);
    /// Stores `payload` at every level.
    void put(const std::string& key, const std::string& payload);
    /// "memory 256 MB, disk 2 GB, redis 127.0.0.1:6379"
    std::string describe() const;
    void setDescription(int level, std::string text);
    const std::vector<std::unique_ptr<CacheLevel>>& levels() const { return m_levels; }

private:
    std::vector<std::unique_ptr<CacheLevel>> m_levels;
    std::string m_descriptions[kCacheLevels];
};

}  // namespace lathe::core::data
