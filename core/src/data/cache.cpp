// The sample caches (cache.h): memory LRU, memory-mapped disk files, Redis through hiredis.
#include "data/cache.h"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "lathe/core/error.h"

namespace fs = std::filesystem;

namespace lathe::core::data {

const char* cacheLevelName(int level) {
    switch (level) {
        case kMemoryLevel:
            return "memory";
        case kDiskLevel:
            return "disk";
        case kRedisLevel:
            return "redis";
    }
    return "?";
}

// ---- sealing ------------------------------------------------------------------------------

namespace {
constexpr char kMagic[4] = {'L', 'S', 'C', '1'};
constexpr size_t kHeader = 4 + 8 + 4;

uint32_t crcOf(const char* data, size_t size) {
    uLong c = crc32(0L, Z_NULL, 0);
    while (size > 0) {
        const auto n = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
        c = crc32(c, reinterpret_cast<const Bytef*>(data), n);
        data += n;
        size -= n;
    }
    return static_cast<uint32_t>(c);
}
}  // namespace

std::string sealEntry(const std::string& payload) {
    std::string out(kHeader + payload.size(), '\0');
    std::memcpy(out.data(), kMagic, 4);
    const uint64_t len = payload.size();
    std::memcpy(out.data() + 4, &len, 8);
    const uint32_t crc = crcOf(payload.data(), payload.size());
    std::memcpy(out.data() + 12, &crc, 4);
    std::memcpy(out.data() + kHeader, payload.data(), payload.size());
    return out;
}

bool openEntry(const char* data, size_t size, std::string& payload) {
    if (size < kHeader || std::memcmp(data, kMagic, 4) != 0) return false;
    uint64_t len = 0;
    uint32_t crc = 0;
    std::memcpy(&len, data + 4, 8);
    std::memcpy(&crc, data + 12, 4);
    if (len != size - kHeader) return false;
    if (crcOf(data + kHeader, len) != crc) return false;
    payload.assign(data + kHeader, len);
    return true;
}

void CacheLevel::noteDropped(const std::string& key) {
    m_dropped.fetch_add(1);
    erase(key);
}

// ---- memory -------------------------------------------------------------------------------

namespace {

class MemoryCache final : public CacheLevel {
public:
    explicit MemoryCache(int64_t capacity) : m_capacity(capacity) {}
    int index() const override { return kMemoryLevel; }

    bool get(const std::string& key, std::string& entry) override {
        std::lock_guard lock(m_mu);
        auto it = m_index.find(key);
        if (it == m_index.end()) return false;
        m_lru.splice(m_lru.begin(), m_lru, it->second);
        entry = it->second->second;
        return true;
    }

    void put(const std::string& key, const std::string& entry) override {
        const auto cost = static_cast<int64_t>(entry.size() + key.size());
        if (cost > m_capacity) return;
        std::lock_guard lock(m_mu);
        if (auto it = m_index.find(key); it != m_index.end()) {
            m_bytes -= static_cast<int64_t>(it->second->second.size() + key.size());
            m_lru.erase(it->second);
            m_index.erase(it);
        }
        m_lru.emplace_front(key, entry);
        m_index[key] = m_lru.begin();
        m_bytes += cost;
        while (m_bytes > m_capacity && !m_lru.empty()) {
            auto& last = m_lru.back();
            m_bytes -= static_cast<int64_t>(last.second.size() + last.first.size());
            m_index.erase(last.first);
            m_lru.pop_back();
        }
    }

    void erase(const std::string& key) override {
        std::lock_guard lock(m_mu);
        auto it = m_index.find(key);
        if (it == m_index.end()) return;
        m_bytes -= static_cast<int64_t>(it->second->second.size() + key.size());
        m_lru.erase(it->second);
        m_index.erase(it);
    }

private:
    using Entry = std::pair<std::string, std::string>;
    const int64_t m_capacity;
    std::mutex m_mu;
    std::list<Entry> m_lru;  // most recent first
    std::unordered_map<std::string, std::list<Entry>::iterator> m_index;
    int64_t m_bytes = 0;
};

// ---- disk ---------------------------------------------------------------------------------

class DiskCache final : public CacheLevel {
public:
    DiskCache(const std::string& dir, int64_t capacity, CacheWarn warn)
        : m_dir(dir), m_capacity(capacity), m_warn(std::move(warn)) {
        std::error_code ec;
        fs::create_directories(m_dir, ec);
        if (ec) throw Error("cannot create the disk cache folder " + dir + ": " + ec.message());
        std::lock_guard lock(m_mu);
        scanLocked();
        evictLocked();
    }
    int index() const override { return kDiskLevel; }

    bool get(const std::string& key, std::string& entry) override {
        {
            std::lock_guard lock(m_mu);
            auto it = m_index.find(key);
            if (it == m_index.end()) return false;
            m_lru.splice(m_lru.begin(), m_lru, it->second);
        }
        const auto path = pathOf(key);
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) {  // evicted by another process sharing the folder
            forget(key);
            return false;
        }
        struct stat st {};
        bool ok = ::fstat(fd, &st) == 0 && st.st_size > 0;
        if (ok) {
            void* map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
            ok = map != MAP_FAILED;
            if (ok) {
                entry.assign(static_cast<const char*>(map), static_cast<size_t>(st.st_size));
                ::munmap(map, static_cast<size_t>(st.st_size));
                ::futimens(fd, nullptr);  // recently used, for every process's eviction order
            }
        }
        ::close(fd);
        if (!ok) erase(key);
        return ok;
    }

    void put(const std::string& key, const std::string& entry) override {
        const auto size = static_cast<int64_t>(entry.size());
        if (size > m_capacity || m_failed.load()) return;
        const auto path = pathOf(key);
        std::error_code ec;
        fs::create_directories(fs::path(path).parent_path(), ec);
        // Written aside and renamed: a reader never maps a half-written file.
        const auto tmp = path + ".tmp" + std::to_string(::getpid()) + "-" +
                         std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id()));
        const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        bool ok = fd >= 0;
        const char* p = entry.data();
        size_t left = entry.size();
        while (ok && left > 0) {
            const ssize_t n = ::write(fd, p, left);
            if (n < 0 && errno == EINTR) continue;
            ok = n > 0;
            if (ok) {
                p += n;
                left -= static_cast<size_t>(n);
            }
        }
        const int err = errno;
        if (fd >= 0) ::close(fd);
        if (!ok) {  // cannot write (a full disk, no permission): the level stops taking entries
            ::unlink(tmp.c_str());
            if (!m_failed.exchange(true) && m_warn)
                m_warn("disk", "cannot write the disk cache under " + m_dir + " (" + std::strerror(err) +
                                   "): continuing without it for new entries");
            return;
        }
        if (::rename(tmp.c_str(), path.c_str()) != 0) {  // this entry is lost, not the level
            ::unlink(tmp.c_str());
            return;
        }
        std::lock_guard lock(m_mu);
        if (auto it = m_index.find(key); it != m_index.end()) {
            m_bytes -= it->second->second;
            m_lru.erase(it->second);
        }
        m_lru.emplace_front(key, size);
        m_index[key] = m_lru.begin();
        m_bytes += size;
        // Other processes (ranks, runs) write to the same folder: every so often, and whenever
        // this process's count says the bound is passed, the folder itself is counted again.
        if (++m_putsSinceScan >= 4096 || m_bytes > m_capacity) {
            m_putsSinceScan = 0;
            scanLocked();
        }
        evictLocked();
    }

    void erase(const std::string& key) override {
        ::unlink(pathOf(key).c_str());
        forget(key);
    }

private:
    std::string pathOf(const std::string& key) const { return m_dir + "/" + key.substr(0, 2) + "/" + key; }

    void forget(const std::string& key) {
        std::lock_guard lock(m_mu);
        auto it = m_index.find(key);
        if (it == m_index.end()) return;
        m_bytes -= it->second->second;
        m_lru.erase(it->second);
        m_index.erase(it);
    }

    // The index rebuilt from the folder: every entry (this or an earlier run's, another rank's)
    // by modification time, which every hit refreshes — least recently used last.
    void scanLocked() {
        std::vector<std::pair<int64_t, std::pair<std::string, int64_t>>> found;
        std::error_code ec;
        for (auto it = fs::recursive_directory_iterator(m_dir, ec); !ec && it != fs::end(it);
             it.increment(ec)) {
            if (!it->is_regular_file(ec)) continue;
            const auto name = it->path().filename().string();
            struct stat st {};
            if (::stat(it->path().c_str(), &st) != 0) continue;
            if (name.find(".tmp") != std::string::npos) {
                // A writer killed half-way leaves one; another process may be writing it now.
                if (st.st_mtime + 3600 < ::time(nullptr)) fs::remove(it->path(), ec);
                continue;
            }
            const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
            found.push_back({mtime, {name, static_cast<int64_t>(st.st_size)}});
        }
        std::sort(found.begin(), found.end());
        m_lru.clear();
        m_index.clear();
        m_bytes = 0;
        for (const auto& [mtime, entry] : found) {
            m_lru.emplace_front(entry.first, entry.second);
            m_index[entry.first] = m_lru.begin();
            m_bytes += entry.second;
        }
    }

    // Down to 90% of the bound, so that the folder is not counted again on every write.
    void evictLocked() {
        if (m_bytes <= m_capacity) return;
        while (m_bytes > m_capacity - m_capacity / 10 && !m_lru.empty()) {
            const auto& last = m_lru.back();
            ::unlink(pathOf(last.first).c_str());
            m_bytes -= last.second;
            m_index.erase(last.first);
            m_lru.pop_back();
        }
    }

    const std::string m_dir;
    const int64_t m_capacity;
    const CacheWarn m_warn;
    std::atomic<bool> m_failed{false};
    std::mutex m_mu;
    int64_t m_putsSinceScan = 0;
    std::list<std::pair<std::string, int64_t>> m_lru;  // key, bytes; most recent first
    std::unordered_map<std::string, std::list<std::pair<std::string, int64_t>>::iterator> m_index;
    int64_t m_bytes = 0;
};

// ---- redis --------------------------------------------------------------------------------

struct ContextFree {
    void operator()(redisContext* c) const { redisFree(c); }
};
using Context = std::unique_ptr<redisContext, ContextFree>;
struct ReplyFree {
    void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

class RedisCache final : public CacheLevel {
public:
    RedisCache(const RedisAddress& address, int64_t ttl, CacheWarn warn, double retrySeconds)
        : m_address(address), m_ttl(ttl), m_warn(std::move(warn)), m_retry(retrySeconds) {
        // Reachable now? If not, the warning comes at once, before the first epoch.
        std::string why;
        if (auto c = connect(why))
            release(std::move(c));
        else
            markDown(why);
    }
    int index() const override { return kRedisLevel; }
    bool available() const override {
        if (!m_down.load()) return true;
        return std::chrono::steady_clock::now().time_since_epoch().count() >= m_retryAt.load();
    }

    bool get(const std::string& key, std::string& entry) override {
        auto c = acquire();
        if (!c) return false;
        const auto k = "lathe:sample:" + key;
        Reply r(static_cast<redisReply*>(redisCommand(c.get(), "GET %b", k.data(), k.size())));
        if (!r) return fail(std::move(c));
        const bool hit = r->type == REDIS_REPLY_STRING;
        if (hit) entry.assign(r->str, r->len);
        release(std::move(c));
        return hit;
    }

    void put(const std::string& key, const std::string& entry) override {
        auto c = acquire();
        if (!c) return;
        const auto k = "lathe:sample:" + key;
        const auto ttl = std::to_string(m_ttl);
        Reply r(static_cast<redisReply*>(redisCommand(c.get(), "SET %b %b EX %s", k.data(), k.size(),
                                                      entry.data(), entry.size(), ttl.c_str())));
        if (!r) {
            fail(std::move(c));
            return;
        }
        if (r->type == REDIS_REPLY_ERROR && !m_errorWarned.exchange(true) && m_warn)
            m_warn("redis",
                   "the Redis cache at " + where() + " refused an entry: " + std::string(r->str, r->len));
        release(std::move(c));
    }

    void erase(const std::string& key) override {
        auto c = acquire();
        if (!c) return;
        const auto k = "lathe:sample:" + key;
        Reply r(static_cast<redisReply*>(redisCommand(c.get(), "DEL %b", k.data(), k.size())));
        if (!r) {
            fail(std::move(c));
            return;
        }
        release(std::move(c));
    }

private:
    std::string where() const { return m_address.host + ":" + std::to_string(m_address.port); }

    Context connect(std::string& why) {
        const timeval timeout{0, 500000};
        Context c(redisConnectWithTimeout(m_address.host.c_str(), m_address.port, timeout));
        if (!c || c->err) {
            why = c ? c->errstr : "cannot allocate a connection";
            return nullptr;
        }
        redisSetTimeout(c.get(), timeval{2, 0});
        if (m_address.db != 0) {
            Reply r(static_cast<redisReply*>(redisCommand(c.get(), "SELECT %d", m_address.db)));
            if (!r || r->type == REDIS_REPLY_ERROR) {
                why = r ? std::string(r->str, r->len) : std::string(c->errstr);
                return nullptr;
            }
        }
        return c;
    }

    Context acquire() {
        if (m_down.load()) {
            const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
            auto at = m_retryAt.load();
            // One thread tries again when the retry time has come; the others skip the level.
            if (now < at || !m_retryAt.compare_exchange_strong(at, now + retryTicks())) return nullptr;
            std::string why;
            auto c = connect(why);
            if (!c) return nullptr;
            m_down.store(false);
            m_warned.store(false);  // a later outage warns again
            if (m_warn) m_warn("redis", "the Redis cache at " + where() + " is back");
            return c;
        }
        {
            std::lock_guard lock(m_mu);
            if (!m_pool.empty()) {
                auto c = std::move(m_pool.back());
                m_pool.pop_back();
                return c;
            }
        }
        std::string why;
        auto c = connect(why);
        if (!c) markDown(why);
        return c;
    }

    void release(Context c) {
        std::lock_guard lock(m_mu);
        if (m_pool.size() < 16) m_pool.push_back(std::move(c));
    }

    bool fail(Context c) {
        markDown(c && c->err ? c->errstr : "the connection was lost");
        return false;
    }

    void markDown(const std::string& why) {
        {
            std::lock_guard lock(m_mu);
            m_pool.clear();
        }
        m_retryAt.store(std::chrono::steady_clock::now().time_since_epoch().count() + retryTicks());
        if (!m_down.exchange(true) && !m_warned.exchange(true) && m_warn)
            m_warn("redis", "the Redis cache at " + where() + " cannot be reached (" + why +
                                "): continuing with the other cache levels, trying again every " +
                                std::to_string(static_cast<int>(m_retry)) + " s");
    }

    int64_t retryTicks() const {
        return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                   std::chrono::duration<double>(m_retry))
            .count();
    }

    const RedisAddress m_address;
    const int64_t m_ttl;
    const CacheWarn m_warn;
    const double m_retry;
    std::mutex m_mu;
    std::vector<Context> m_pool;
    std::atomic<bool> m_down{false}, m_warned{false}, m_errorWarned{false};
    std::atomic<int64_t> m_retryAt{0};
};

}  // namespace

std::unique_ptr<CacheLevel> makeMemoryCache(int64_t capacityBytes) {
    return std::make_unique<MemoryCache>(capacityBytes);
}

std::unique_ptr<CacheLevel> makeDiskCache(const std::string& dir, int64_t capacityBytes, CacheWarn warn) {
    return std::make_unique<DiskCache>(dir, capacityBytes, std::move(warn));
}

RedisAddress parseRedisUrl(const std::string& url) {
    const std::string form = "`cache_redis` must be redis://HOST:PORT[/DB] (got '" + url + "')";
    if (url.rfind("redis://", 0) != 0) throw ConfigError(form);
    std::string rest = url.substr(8);
    RedisAddress a;
    if (const auto slash = rest.find('/'); slash != std::string::npos) {
        const auto db = rest.substr(slash + 1);
        if (db.empty() || db.size() > 5 || db.find_first_not_of("0123456789") != std::string::npos)
            throw ConfigError(form + ": DB is a number");
        a.db = std::stoi(db);
        rest.resize(slash);
    }
    std::string port;
    if (!rest.empty() && rest.front() == '[') {  // [IPv6]:PORT
        const auto close = rest.find(']');
        if (close == std::string::npos) throw ConfigError(form);
        a.host = rest.substr(1, close - 1);
        if (close + 1 < rest.size()) {
            if (rest[close + 1] != ':') throw ConfigError(form);
            port = rest.substr(close + 2);
        }
    } else if (const auto colon = rest.rfind(':'); colon != std::string::npos) {
        a.host = rest.substr(0, colon);
        port = rest.substr(colon + 1);
    } else {
        a.host = rest;
    }
    if (a.host.empty() || a.host.find_first_of(" \t@") != std::string::npos) throw ConfigError(form);
    if (!port.empty()) {
        if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
            throw ConfigError(form + ": PORT is 1..65535");
        a.port = std::stoi(port);
        if (a.port < 1 || a.port > 65535) throw ConfigError(form + ": PORT is 1..65535");
    }
    return a;
}

std::unique_ptr<CacheLevel> makeRedisCache(const RedisAddress& address, int64_t ttlSeconds, CacheWarn warn,
                                           double retrySeconds) {
    // hiredis writes with send(2) without MSG_NOSIGNAL: a server that went away would kill the
    // process with SIGPIPE instead of failing the write. Ignored unless the program handles it.
    struct sigaction old {};
    if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
    return std::make_unique<RedisCache>(address, ttlSeconds, std::move(warn), retrySeconds);
}

// ---- the stack ----------------------------------------------------------------------------

bool CacheStack::has(int level) const {
    return std::any_of(m_levels.begin(), m_levels.end(), [&](const auto& l) { return l->index() == level; });
}

bool CacheStack::get(const std::string& key, std::string& payload, int64_t* lookups, int64_t* hits) {
    std::string entry;
    for (size_t i = 0; i < m_levels.size(); ++i) {
        auto& level = *m_levels[i];
        if (!level.available()) continue;
        ++lookups[level.index()];
        if (!level.get(key, entry)) continue;
        if (!openEntry(entry.data(), entry.size(), payload)) {
            level.noteDropped(key);  // recomputed by the caller and stored again
            continue;
        }
        ++hits[level.index()];
        for (size_t j = 0; j < i; ++j)
            if (m_levels[j]->available()) m_levels[j]->put(key, entry);
        return true;
    }
    return false;
}

void CacheStack::put(const std::string& key, const std::string& payload) {
    const auto entry = sealEntry(payload);
    for (auto& level : m_levels)
        if (level->available()) level->put(key, entry);
}

std::string CacheStack::describe() const {
    std::string out;
    for (const auto& l : m_levels) {
        out += out.empty() ? "" : ", ";
        out += m_descriptions[l->index()].empty() ? cacheLevelName(l->index()) : m_descriptions[l->index()];
    }
    return out.empty() ? "none" : out;
}

void CacheStack::setDescription(int level, std::string text) { m_descriptions[level] = std::move(text); }

}  // namespace lathe::core::data
