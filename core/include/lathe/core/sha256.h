#pragma once
// SHA-256 through OpenSSL's EVP interface (checkpoints, model artifacts, files staged to hosts).
#include <cstddef>
#include <memory>
#include <string>

namespace lathe::core {

/// A digest computed in pieces (a file read in chunks, bytes hashed as they are copied).
class Sha256 {
public:
    Sha256();
    ~Sha256();
    Sha256(const Sha256&) = delete;
    Sha256& operator=(const Sha256&) = delete;
    void update(const void* data, size_t size);
    /// Lower-case hex digest of everything given; the object is spent after it.
    std::string hex();

private:
    struct Impl;
    std::unique_ptr<Impl> d;
};

/// Lower-case hex digest.
std::string sha256Hex(const void* data, size_t size);
/// Lower-case hex digest of a file. Throws Error when the file cannot be read.
std::string sha256File(const std::string& path);

}  // namespace lathe::core
